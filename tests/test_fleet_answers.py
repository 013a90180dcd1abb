"""A fleet host's answer is input: validated before it is judged or stored, and the record it
lands in is read back through the same schema, so neither a host nor a damaged record file
can make the controller raise (issue 39)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.fleet.ansible import HostResult
from orchestrator.fleet.answer import MAX_ANSWER, MAX_SAID, Errored, Ran, Refused, read_answer
from orchestrator.fleet.record import FleetRecord, record_path
from orchestrator.fleet.roll import judge

from conftest import run_orch

PYTHON = "/opt/orch/venv/bin/python"
CANNOT_READ = "the host answered in a shape this controller cannot read: "
# What a terminal acts on (core.terminal's set): none may reach a message raw.
CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def answered(stdout: str) -> tuple[str, str | None, Any]:
    return judge(HostResult("h", True, 0, stdout, "", ""), PYTHON)


def task(tid: str = "bench", status: str = "completed", **more: Any) -> dict[str, Any]:
    return {
        "id": tid,
        "status": status,
        "attempts": 1,
        "started_at": "2026-12-05T06:50:00+00:00",
        "ended_at": "2026-12-05T06:50:04+00:00",
        "duration_s": 4.0,
        "last_error": None,
        "role": None,
        "findings": [{"key": "tok_s", "value": 812, "unit": "tok/s", "note": None}],
        **more,
    }


def ran(board: Any = None, **result: Any) -> dict[str, Any]:
    outcome = {"exit_code": 0, "outcome": "completed", "run": 1, "store": "/s.db", **result}
    return {"result": outcome, "board": [task()] if board is None else board, "build": "0.1.0+x"}


# --- the answer -------------------------------------------------------------------------------


def test_a_well_formed_answer_is_judged_and_its_board_kept() -> None:
    state, detail, board = answered("noise before it\n" + json.dumps(ran()))
    assert (state, detail) == ("completed", "bench: tok_s=812 tok/s")
    assert [t.id for t in board] == ["bench"] and board[0].findings[0].value == 812
    failed = ran([task("install", "failed", last_error="exit code 1")], exit_code=1)
    assert answered(json.dumps(failed))[:2] == ("failed", "at install (exit code 1)")


MALFORMED = {
    "a key missing": (
        {"result": {"outcome": "completed"}, "board": [], "build": "b"},
        "result.exit_code: missing",
    ),
    "a list for a mapping": (ran(board={"bench": task()}), "board: {'bench': {"),
    "a list for the result": ({**ran(), "result": [0]}, "result: [0] should be an object"),
    "a string for a number": (
        ran(exit_code="0"),
        "result.exit_code: '0' should be a valid integer",
    ),
    "a bool for a count": (ran([task(attempts=True)]), "board[0].attempts: True should be"),
    "an unknown status": (
        ran([task("a"), task("b"), task("c", "weird")]),
        "board[2].status: 'weird' should be 'pending', 'in_progress', ",
    ),
    "a task without status": (
        ran([{"id": "a", "findings": []}]),
        "board[0].status: missing",
    ),
    "an unknown outcome": (ran(outcome="fine"), "result.outcome: 'fine' should be"),
    "a key no answer has": (ran([task(extra=1)]), "board[0].extra: not a key this answer has"),
    "a finding without value": (
        ran([task(findings=[{"key": "k"}])]),
        "board[0].findings[0].value: missing",
    ),
    "an error that is not text": ({"error": ["boom"]}, "error: ['boom'] should be a valid string"),
    "not an object": ([1, 2], "the answer: [1, 2] should be an object"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_answer_fails_the_host_saying_where(case: str) -> None:
    doc, said = MALFORMED[case]
    state, detail, board = answered(json.dumps(doc))
    assert state == "failed" and board is None
    assert detail is not None and detail.startswith(CANNOT_READ + said), detail


def test_a_line_that_is_not_json_fails_the_host() -> None:
    state, detail, _ = answered('{"result": {"exit_code": 0')
    assert (
        state == "failed"
        and detail == CANNOT_READ + "not JSON (EOF while parsing an object at line 1 column 26)"
    )
    deep = "[" * 100_000  # json.loads would raise RecursionError: the parser here stops itself
    assert answered(deep)[1].startswith(CANNOT_READ + "not JSON (recursion limit exceeded")


def test_a_huge_line_is_not_parsed_and_a_huge_value_is_not_repeated() -> None:
    state, detail, _ = answered("{" + " " * MAX_ANSWER + "}")
    assert (state, detail) == (
        "failed",
        CANNOT_READ + f"an answer of {MAX_ANSWER + 2:,} characters (at most {MAX_ANSWER:,})",
    )
    state, detail, _ = answered(json.dumps(ran(exit_code="9" * 1_000_000)))
    assert state == "failed" and detail is not None and len(detail) <= MAX_SAID, detail
    assert "'999999999" in detail


def test_control_characters_from_a_host_never_reach_a_message_raw() -> None:
    evil = "\x1b]0;owned\x07\x1b[2J\r\x9b31m"
    cases = [
        {"refused": f"orch here is {evil}"},  # another build's words, shown as they are
        {"error": f"boom {evil}"},
        ran([task("a", evil)]),  # in the value the reason quotes
        ran([task(**{evil: 1})]),  # in the key the reason names
        ran([task(evil, findings=[{"key": evil, "value": evil, "unit": evil}])]),  # a headline
    ]
    for doc in cases:
        state, detail, _ = answered(json.dumps(doc, ensure_ascii=False))
        assert detail and not CONTROLS.search(detail), (state, detail)
        assert "\\x1b" in detail or "\\x9b" in detail, detail  # escaped, not dropped


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
# Near the schema as well as far from it: its keys with arbitrary values, so some answers are
# valid and most are wrong in one place.
TASKS = st.fixed_dictionaries(
    {"id": st.text(max_size=6), "status": st.sampled_from(["completed", "failed", "waiting", "x"])},
    optional={"attempts": JSON, "findings": st.lists(JSON, max_size=2), "last_error": JSON},
)
ANSWERS = st.fixed_dictionaries(
    {
        "result": st.fixed_dictionaries(
            {"exit_code": st.sampled_from([0, 1, 4, 130]) | JSON, "outcome": st.text(max_size=10)}
        )
        | JSON,
        "board": st.lists(TASKS | JSON, max_size=3),
        "build": st.text(max_size=5) | JSON,
    }
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, ANSWERS, st.fixed_dictionaries({"refused": JSON}), st.text(max_size=30)))
def test_any_json_a_host_answers_is_judged_never_raised(doc: Any) -> None:
    """Whatever one line a host answers: a normal outcome only when it fits the schema, else
    `failed`, cannot read, in a bounded line with no control character."""
    line = json.dumps(doc) if not isinstance(doc, str) else doc
    state, detail, board = answered(line)
    read = read_answer(line)
    if isinstance(read, Ran | Refused | Errored):  # it fits the schema
        assert state in ("completed", "failed", "waiting", "refused", "error"), state
        assert not (detail or "").startswith(CANNOT_READ)
        assert (board is not None) == isinstance(read, Ran)
    elif read is None:  # no line at all: no answer, as when its orch crashed
        assert state == "error" and board is None
    else:
        assert state == "failed" and board is None
        assert detail is not None and detail.startswith(CANNOT_READ)
    assert detail is None or (len(detail) <= MAX_SAID and not CONTROLS.search(detail))


# --- the record -------------------------------------------------------------------------------


def damaged_record(tmp_path: Path) -> Path:
    """A plan's fleet record, written as a roll writes it, then given what no roll writes."""
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\ntasks:\n  - {id: bench, kind: shell, params: {command: 'true'}}\n")
    path = record_path(tmp_path / ".orch" / "p.db")
    names = ["ok", "state", "blob", "status", "missing", "clock", "text"]
    record = FleetRecord.open(path, create=True)
    try:
        roll = record.new_roll(
            plan="p",
            plan_file=str(plan),
            inventory="hosts.yml",
            build="0.1.0+x",
            canary=1,
            serial="1",
            options={},
            batches=[names[:1], names[1:]],
        )
        for name in names:
            _, _, board = answered(json.dumps(ran()))
            record.finish_host(roll, name, "completed", "bench: tok_s=812 tok/s", board)
    finally:
        record.close()
    with sqlite3.connect(path) as db:
        damage = {
            "state": ("state", "'weird'"),
            "blob": ("board", "X'ff00'"),
            "status": ("board", "'" + json.dumps([task(status="weird")]) + "'"),
            "missing": ("board", "'" + json.dumps([{"id": "bench"}]) + "'"),
            "clock": ("started_at", "'yesterday'"),
            "text": ("detail", "'\x1b]0;owned\x07 done'"),  # a string: readable, shown escaped
        }
        for host, (column, value) in damage.items():
            db.execute(f"UPDATE hosts SET {column}={value} WHERE host=?", (host,))
    db.close()
    return plan


def test_fleet_status_reads_a_damaged_record_row_by_row(tmp_path: Path) -> None:
    plan = damaged_record(tmp_path)
    done = run_orch("fleet", "status", plan, "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    hosts = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["ok"]["state"] == "completed" and hosts["ok"]["tasks"][0]["status"] == "completed"
    assert hosts["text"]["state"] == "completed"
    why = "this row of the record cannot be read: "
    expected = {
        "state": "state: 'weird' should be 'pending', 'running', ",
        "blob": "board: ",
        "status": "board[0].status: 'weird' should be 'pending'",
        "missing": "board[0].status: missing",
        "clock": "started_at: 'yesterday' should be a valid number",
    }
    for host, said in expected.items():
        assert hosts[host]["state"] == "unreadable", hosts[host]
        assert hosts[host]["detail"].startswith(why + said), hosts[host]["detail"]
    assert hosts["state"]["tasks"][0]["id"] == "bench"  # the columns that fit are kept
    assert hosts["blob"]["tasks"] == [] and hosts["clock"]["started_at"] is None

    board = run_orch("fleet", "status", plan)
    assert board.returncode == 0 and "Traceback" not in board.stderr, board.stderr
    assert "unreadable" in board.stdout and not CONTROLS.search(board.stdout.replace("\n", ""))
    assert "\\x1b]0;owned\\x07 done" in board.stdout


def test_an_unreadable_roll_is_shown_and_the_report_is_written(tmp_path: Path) -> None:
    plan = damaged_record(tmp_path)
    with sqlite3.connect(record_path(tmp_path / ".orch" / "p.db")) as db:
        db.execute("UPDATE rolls SET options='{not json', canary='one'")
    db.close()
    done = run_orch("fleet", "status", plan, "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    roll = json.loads(done.stdout)["roll"]
    assert roll["state"] == "unreadable"
    assert roll["detail"].startswith("this row of the record cannot be read: canary: 'one'")
    assert roll["detail"].endswith("(and 1 more)")
    report = run_orch("report", plan, "--fleet")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    page = (tmp_path / ".orch" / "p.fleet.report" / "fleet.html").read_text()
    assert "unreadable" in page and "board[0].status: &#x27;weird&#x27;" in page


def test_a_file_that_is_no_fleet_record_is_one_line(tmp_path: Path) -> None:
    plan = damaged_record(tmp_path)
    with sqlite3.connect(record_path(tmp_path / ".orch" / "p.db")) as db:
        db.execute("ALTER TABLE hosts RENAME TO gone")
        db.execute("CREATE TABLE hosts (x)")
    db.close()
    done = run_orch("fleet", "status", plan)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "is not a readable fleet record: no such column" in done.stderr


def test_a_progress_answer_counts_the_plans_own_tasks_and_names_the_running() -> None:
    from orchestrator.fleet.answer import progress_line, read_progress

    line = json.dumps(
        {
            "progress": [
                {"id": "a", "status": "completed", "role": None},
                {"id": "b", "status": "skipped", "role": None},
                {"id": "c", "status": "in_progress", "role": None},
                {"id": "d", "status": "pending", "role": None},
                {"id": "undo_a", "status": "pending", "role": "compensation"},
            ]
        }
    )
    board = read_progress("noise\n" + line)
    assert board is not None and progress_line(board) == "2/4 done, at c"


@pytest.mark.parametrize(
    "stdout",
    ["", "not json", '{"progress": "all"}', '{"progress": [{"id": 1, "status": "done"}]}',
     '{"progress": [], "extra": 1}', '{"progress": [{"id": "a", "status": "weird"}]}'],
)  # fmt: skip
def test_a_progress_answer_that_is_not_one_is_ignored(stdout: str) -> None:
    from orchestrator.fleet.answer import read_progress

    assert read_progress(stdout) is None
