"""Secret vars: their values never reach the store, lock, run log, events, history or board."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core import redact

from conftest import PlanDir, run_orch

TOKEN = "hf_s3cretT0ken_9f2c"  # an inert word: it may be spliced into a command
ROTATED = "hf_r0tated_77aa"

PLAN = """\
    name: t
    vars:
      token: {env: ORCH_TEST_TOKEN}
      password: {default: hunter2-long, secret: true}
      region: {env: ORCH_TEST_REGION, default: eu, secret: false}
    tasks:
      - id: use
        kind: shell
        params:
          command: "echo region=${vars.region}; echo token=$TOKEN; test ${vars.token} = x"
          env: {TOKEN: "${vars.token}"}
      - id: after
        kind: shell
        needs: [use]
        params: {command: "true"}
"""


def everything_orch_wrote(pdir: PlanDir) -> str:
    """The store's every value (all tables) and every other file orch wrote, as one text: the
    task logs whole, what the tasks' own processes printed included (core/redact.py)."""
    with sqlite3.connect(pdir.store_path()) as conn:
        dump = "\n".join(conn.iterdump())
    texts = [dump]
    for path in pdir.root.rglob("*"):
        if not path.is_file() or path.suffix in (".db", ".db-wal", ".db-shm", ".yaml"):
            continue
        texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def test_secret_values_are_masked_everywhere_orch_writes(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    env = {"ORCH_TEST_TOKEN": TOKEN}
    r = run_orch("run", plan, "--var", "password=hunter2-cli", cwd=pdir.root, env=env)
    assert r.returncode == 1, r.stderr  # `test TOKEN = x` fails: the error quotes the command
    outputs = [r.stdout, r.stderr]
    for args in (
        ("status", plan),
        ("status", plan, "--json"),
        ("history", plan),
        ("history", plan, "--json"),
        ("logs", plan, "use"),
    ):
        shown = run_orch(*args, cwd=pdir.root, env=env)
        assert shown.returncode in (0, 1), shown.stderr
        outputs += [shown.stdout, shown.stderr]
    written = everything_orch_wrote(pdir) + "\n".join(outputs)
    for secret in (TOKEN, "hunter2-cli"):
        assert secret not in written
    assert "token=***" in outputs[-2]  # `orch logs`: the task printed it, masked on disk
    assert "***" in pdir.todo("use")["last_error"] + (pdir.todo("use")["output_tail"] or "")
    assert "region=eu" in (pdir.todo("use")["output_tail"] or "")  # not secret: shown


def test_a_rotated_secret_re_runs_nothing(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN.replace("test ${vars.token} = x", "test -n ${vars.token}"))
    assert run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN}).returncode == 0
    r = run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": ROTATED})
    assert r.returncode == 0, r.stderr
    assert pdir.todo("use")["attempts"] == 1  # the secret is not part of the task's identity


@pytest.mark.parametrize(
    ("var", "message"),
    [
        (
            "token: {env: ORCH_TEST_UNSET_VAR}",
            "environment variable ORCH_TEST_UNSET_VAR is not set",
        ),
        ("token: {secret: true}", "a secret var needs a `default` or an `env`"),
        ("token: {env: X, secret: maybe}", "`secret` is true or false"),
    ],
)
def test_bad_secret_declarations_are_plan_errors(pdir: PlanDir, var: str, message: str) -> None:
    plan = pdir.write(
        f"name: t\nvars:\n  {var}\ntasks:\n  - {{id: a, kind: shell, "
        "params: {command: 'true'}}\n"
    )
    r = run_orch("validate", plan, cwd=pdir.root)
    assert r.returncode == 2 and message in r.stderr and "plan.yaml:3" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_mapping_var_that_is_not_a_declaration_stays_a_value(pdir: PlanDir) -> None:
    plan = pdir.write(
        "name: t\nvars:\n  limits: {env: prod, cpu: 4}\ntasks:\n"
        "  - {id: a, kind: shell, params: {command: 'true'}}\n"
    )
    assert run_orch("run", plan, cwd=pdir.root).returncode == 0
    shown = json.loads(run_orch("status", plan, "--json", cwd=pdir.root).stdout)
    assert shown["tasks"][0]["status"] == "completed"


def test_events_file_is_masked(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN})
    events = list(pdir.root.rglob("events.jsonl"))
    assert events and all(TOKEN not in e.read_text() for e in events)
    assert any("***" in e.read_text() for e in events)


def test_a_secret_a_process_prints_is_masked_in_its_log_however_it_is_cut(
    pdir: PlanDir,
) -> None:
    """Printed whole, in a longer line, in two writes 0.3 s apart (two reads), by a child in
    the background: never on disk, nor in `orch logs` or the board's tail; the log's other
    bytes as printed, findings still read."""
    plan = pdir.write("""
        name: t
        vars:
          token: {env: ORCH_TEST_TOKEN}
        tasks:
          - id: leak
            kind: shell
            params:
              command: |
                echo "whole ${vars.token}"
                echo "index=https://user:${vars.token}@example.invalid/simple"
                t=${vars.token}; printf "%s" "split $${t:0:5}"; sleep 0.3; echo "$${t:5}"
                (sleep 0.1; echo "child $TOKEN") &
                wait
                echo "::finding seen=yes"
                exit 3
              env: {TOKEN: "${vars.token}"}
    """)
    r = run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN})
    assert r.returncode == 1, r.stderr
    log = next(pdir.root.rglob("leak.log")).read_text()
    assert TOKEN not in log and TOKEN[:5] + "\n" not in log
    for line in ("whole ***", "index=https://user:***@example.invalid/simple", "split ***"):
        assert line in log, log
    assert "child ***" in log
    shown = run_orch("logs", plan, "leak", cwd=pdir.root)  # no secret known to this process
    board = run_orch("status", plan, cwd=pdir.root)
    for text in (shown.stdout, board.stdout, r.stdout, r.stderr):
        assert TOKEN not in text
    assert "split ***" in shown.stdout
    assert pdir.todo("leak")["status"] == "failed"
    with sqlite3.connect(pdir.store_path()) as conn:
        assert conn.execute("SELECT value FROM findings WHERE key = 'seen'").fetchone() == ("yes",)


@given(
    pieces=st.lists(st.sampled_from(["sk-TOK3N-long", "TOK3N", "sk-", "x", "\n", "sk-TOK"])),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1),
)
def test_the_masker_masks_as_one_pass_would_however_the_stream_is_cut(
    pieces: list[str], cuts: list[int]
) -> None:
    """A secret, one inside another, cut anywhere between reads: the bytes out equal one mask
    over the whole text, and nothing is lost or added."""
    redact.register(["sk-TOK3N-long", "TOK3N"])
    try:
        text = "".join(pieces).encode()
        masker, out, at, i = redact.Masker(), b"", 0, 0
        while at < len(text):
            step = cuts[i % len(cuts)]
            out += masker.feed(text[at : at + step])
            at, i = at + step, i + 1
        out += masker.close()
        assert out == redact.mask(text.decode()).encode()
    finally:
        redact.forget()


def test_a_secret_is_never_shown_by_the_messages_that_refuse_or_fail_it(pdir: PlanDir) -> None:
    """Not a plain word: validate and run refuse it naming the var, never printing it. Used as
    a `cwd` that does not exist: the task fails with a plain sentence, masked, no traceback."""
    plan = pdir.write("""
        name: t
        vars:
          token: {env: ORCH_TEST_TOKEN}
        tasks:
          - id: a
            kind: shell
            params: {command: "echo ${vars.token}"}
    """)
    for command in ("validate", "run"):
        r = run_orch(command, plan, env={"ORCH_TEST_TOKEN": "sk BAD-5555x"})
        assert (
            r.returncode == 2
            and "${vars.token} = '***' cannot be spliced into shell text" in r.stderr
        )
        assert "BAD-5555x" not in r.stdout + r.stderr
    plan = pdir.write("""
        name: t
        vars:
          token: {env: ORCH_TEST_TOKEN}
        tasks:
          - id: a
            kind: shell
            params: {command: "true", cwd: "${vars.token}"}
    """)
    r = run_orch("run", plan, env={"ORCH_TEST_TOKEN": TOKEN})
    assert r.returncode == 1
    assert pdir.todo("a")["last_error"] == "cwd '***' does not exist"
    assert TOKEN not in everything_orch_wrote(pdir) + r.stdout + r.stderr
    assert not any("Traceback" in log.read_text() for log in pdir.root.rglob("a.log"))


PRINTER = """\
import sys
import threading

both = threading.Barrier(2, timeout=20)


def leak(token: str) -> dict[str, str]:
    print("print", token)
    sys.stderr.write(f"stderr {token}\\n")
    print(token[:3], end="")
    sys.stdout.flush()
    print(token[3:], "was split")
    helper = threading.Thread(target=lambda: print("thread", token))
    helper.start()
    helper.join()
    print("::finding seen=yes")
    return {"returned": "ok"}


def chatter(name: str) -> None:
    for i in range(20):
        both.wait()  # in step: each line is printed while the other task runs too
        print(f"{name} line {i}")
        sys.stderr.write(f"{name} err {i}\\n")
"""


def test_what_a_python_task_prints_is_masked_into_its_log_never_on_orchs_streams(
    pdir: PlanDir,
) -> None:
    """print, sys.stderr.write, a secret split across two prints, a thread the function
    starts: in the task's log masked, `::finding` read; orch's own stdout and stderr hold no
    secret and still carry the board and the run's log lines."""
    (pdir.root / "printer.py").write_text(PRINTER)
    plan = pdir.write("""
        name: t
        vars:
          token: {env: ORCH_TEST_TOKEN}
        tasks:
          - id: leak
            kind: python
            params: {function: "printer:leak", args: {token: "${vars.token}"}}
    """)
    r = run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    for stream in (r.stdout, r.stderr):
        assert TOKEN not in stream and TOKEN[3:] not in stream, stream
    assert "leak" in r.stdout and "completed" in r.stdout  # the board, as usual
    assert "task.completed" in r.stderr  # the run's log lines, as usual
    log = next(pdir.root.rglob("leak.log")).read_text()
    assert TOKEN not in log
    for line in ("print ***", "stderr ***", "*** was split", "thread ***"):
        assert line in log, log
    assert "task.completed" not in log  # orch's own lines stay orch's
    with sqlite3.connect(pdir.store_path()) as conn:
        found = dict(conn.execute("SELECT key, value FROM findings").fetchall())
    assert found == {"seen": "yes", "returned": "ok"}
    assert TOKEN not in everything_orch_wrote(pdir)


def test_python_tasks_side_by_side_print_into_their_own_logs(pdir: PlanDir) -> None:
    """--jobs 2: two python tasks print at once, each in its thread; each log holds its own
    lines, all of them, and nothing of the other's; orch's streams hold neither."""
    (pdir.root / "printer.py").write_text(PRINTER)
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: python, params: {function: "printer:chatter", args: {name: alpha}}}
          - {id: b, kind: python, params: {function: "printer:chatter", args: {name: bravo}}}
    """)
    r = run_orch("run", plan, "--jobs", "2", cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    for task, mine, other in (("a", "alpha", "bravo"), ("b", "bravo", "alpha")):
        log = next(pdir.root.rglob(f"{task}.log")).read_text().splitlines()
        assert sorted(log) == sorted(
            [f"{mine} line {i}" for i in range(20)] + [f"{mine} err {i}" for i in range(20)]
        ), (task, log)
        assert other not in "\n".join(log)
    assert "alpha" not in r.stdout + r.stderr and "bravo" not in r.stdout + r.stderr
