"""A plan people and agents extend: `orch todo`, tasks added to the store, `orch events`."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.store.db import Store
from orchestrator.store.schema import COLUMNS, COLUMNS_SINCE, SCHEMA_VERSION

from conftest import PlanDir, run_orch, start_orch, wait_for

PLAN = """
    name: t
    tasks:
      - {{id: a, title: "Step A", kind: shell, params: {{command: "echo a >> {root}/ran"}}}}
      - {{id: b, kind: shell, needs: [a], params: {{command: "echo b >> {root}/ran"}}}}
"""


def ran(pdir: PlanDir) -> list[str]:
    path = pdir.root / "ran"
    return path.read_text().split() if path.exists() else []


def test_an_added_task_runs_like_a_declared_one_and_survives_reruns_and_edits(
    pdir: PlanDir,
) -> None:
    plan = pdir.write(PLAN.format(root=pdir.root))
    assert run_orch("run", plan).returncode == 0
    r = run_orch(
        "todo", "add", plan, "c", "--kind", "shell", "--needs", "b", "--title", "Look again",
        "--param", f"command=echo c >> {pdir.root}/ran; echo ::finding seen=3 unit=things",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "orch run" in r.stdout
    row = pdir.todo("c")
    assert (row["origin"], row["status"], row["kind"]) == ("person", "pending", "shell")
    # `orch plan` shows it with who added it; the finished plan is not finished any more.
    shown = run_orch("plan", plan, "--json")
    steps = {s["id"]: s for s in json.loads(shown.stdout)["steps"]}
    assert steps["c"]["origin"] == "person" and steps["c"]["action"] == "run"
    assert steps["a"]["origin"] == "plan" and steps["a"]["action"] == "skip"
    assert run_orch("run", plan).returncode == 0
    assert ran(pdir) == ["a", "b", "c"]  # only the added one ran
    board = run_orch("status", plan).stdout
    assert "+ Look again" in board and "seen=3 things" in board
    assert "+ added by person, not in the plan file" in board
    # A re-run of the finished plan runs nothing; an edit of the plan file keeps it.
    assert run_orch("run", plan).returncode == 0
    plan.write_text(plan.read_text() + "  - {id: d, kind: shell, params: {command: 'true'}}\n")
    assert run_orch("run", plan).returncode == 0
    assert ran(pdir) == ["a", "b", "c"]
    assert pdir.statuses() == dict.fromkeys("abcd", "completed")
    # todowrite marks it as added; the declared ones are not.
    items = json.loads(run_orch("status", plan, "--format", "todowrite").stdout)["todos"]
    assert [i.get("added_by") for i in items] == [None, None, None, "person"]
    # Removing it takes it off the board, keeps its history, and it does not run again.
    assert run_orch("todo", "rm", plan, "c").returncode == 0
    board_ids = [t["id"] for t in json.loads(run_orch("status", plan, "--json").stdout)["tasks"]]
    assert board_ids == ["a", "b", "d"]
    assert run_orch("run", plan, "--from", "a").returncode == 0
    assert ran(pdir) == ["a", "b", "c", "a", "b"]
    with pdir.db() as db:
        assert db.execute("SELECT count(*) FROM transitions WHERE task_id='c'").fetchone()[0] >= 4


def test_an_added_task_is_validated_like_the_plans_own(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN.format(root=pdir.root))
    r = run_orch("todo", "add", plan, "x", "--kind", "shel", "--needs", "nope")
    assert r.returncode == 2
    assert "unknown task kind 'shel' (did you mean 'shell'?)" in r.stderr
    assert "needs unknown task 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = run_orch("todo", "add", plan, "y", "--kind", "shell", "--param", "commnd=true")
    assert r.returncode == 2 and "unknown param 'commnd' (did you mean 'command'?)" in r.stderr
    r = run_orch("todo", "add", plan, "a", "--title", "again")
    assert r.returncode == 2 and "already on the board" in r.stderr  # a declared id, not run
    # A plan edit that breaks an added task names it and who added it, and how to get out.
    assert run_orch("todo", "add", plan, "z", "--kind", "shell", "--needs", "b",
                    "--param", "command=exit 0").returncode == 0  # fmt: skip
    plan.write_text(plan.read_text().replace("  - {id: b,", "  - {id: bb,").replace("[a]", "[a]"))
    r = run_orch("run", plan)
    assert r.returncode == 2, r.stderr
    assert "added by person: task 'z' needs unknown task 'b'" in r.stderr
    assert run_orch("todo", "rm", plan, "z").returncode == 0
    assert run_orch("run", plan).returncode == 0


def test_a_todo_with_no_kind_is_kept_by_hand(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN.format(root=pdir.root))
    assert run_orch("todo", "add", plan, "ask", "--title", "Ask the vendor").returncode == 0
    r = run_orch("todo", "set", plan, "ask", "in_progress")
    assert r.returncode == 0, r.stderr
    assert run_orch("run", plan).returncode == 0  # a todo neither runs nor blocks the run
    assert pdir.statuses()["ask"] == "in_progress"
    board = json.loads(run_orch("status", plan, "--json").stdout)["tasks"]
    assert [t["id"] for t in board] == ["a", "b", "ask"]  # still on the board after the run
    assert run_orch("todo", "set", plan, "ask", "cancelled", "--note", "not needed").returncode == 0
    assert pdir.todo("ask")["status"] == "skipped" and pdir.todo("ask")["reason"] == "not needed"
    assert run_orch("todo", "set", plan, "ask", "pending").returncode == 0  # anywhere, by hand
    r = run_orch("todo", "set", plan, "a", "completed")
    assert r.returncode == 2 and "has a kind" in r.stderr
    r = run_orch("todo", "set", plan, "ask", "done")
    assert r.returncode == 2 and "unknown status 'done'" in r.stderr
    r = run_orch("todo", "rm", plan, "a")
    assert r.returncode == 2 and "declared in the plan file" in r.stderr
    # An added task that another on the board needs stays until that one is removed.
    assert run_orch("todo", "add", plan, "c", "--kind", "shell", "--needs", "a",
                    "--param", "command=exit 0").returncode == 0  # fmt: skip
    assert run_orch("todo", "add", plan, "d", "--kind", "shell", "--needs", "c",
                    "--param", "command=exit 0").returncode == 0  # fmt: skip
    r = run_orch("todo", "rm", plan, "c")
    assert r.returncode == 2 and "needed by d" in r.stderr, r.stderr
    assert run_orch("todo", "rm", plan, "d").returncode == 0
    assert run_orch("todo", "rm", plan, "c").returncode == 0
    r = run_orch("todo", "rm", plan, "nope")
    assert r.returncode == 2 and "no task 'nope' on the board" in r.stderr
    r = run_orch("todo", "add", plan, "bad id!")
    assert r.returncode == 2 and "a task's id is" in r.stderr


def test_notes_and_findings_keep_their_author_and_a_rerun_starts_afresh(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN.format(root=pdir.root))
    assert run_orch("run", plan).returncode == 0
    assert run_orch("todo", "note", plan, "a", "disk nearly full").returncode == 0
    r = run_orch("todo", "note", plan, "a", "--finding", "free=3.5", "--unit", "GiB")
    assert r.returncode == 0, r.stderr
    tasks = {t["id"]: t for t in json.loads(run_orch("status", plan, "--json").stdout)["tasks"]}
    assert tasks["a"]["findings"] == [
        {"key": "note", "value": "disk nearly full", "unit": None, "note": None,
         "author": "person"},
        {"key": "free", "value": 3.5, "unit": "GiB", "note": None, "author": "person"},
    ]  # fmt: skip
    assert "person: disk nearly full, person: free=3.5 GiB" in run_orch("status", plan).stdout
    r = run_orch("todo", "note", plan, "a", "--finding", "bad key=1")
    assert r.returncode == 2 and "finding key" in r.stderr
    # A note belongs to the attempt it was written on: a re-run starts a fresh set.
    assert run_orch("run", plan, "--rerun", "a").returncode == 0
    tasks = {t["id"]: t for t in json.loads(run_orch("status", plan, "--json").stdout)["tasks"]}
    assert tasks["a"]["findings"] == []
    # A note on a task that has not run yet shows at once.
    assert run_orch("todo", "add", plan, "later").returncode == 0
    assert run_orch("todo", "note", plan, "later", "after the freeze").returncode == 0
    assert "person: after the freeze" in run_orch("status", plan).stdout


def test_events_list_and_follow_what_another_process_records(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "echo ::finding n=1 unit=x"}}}}
          - id: slow
            kind: shell
            needs: [a]
            params: {{command: "until [ -e {pdir.root}/go ]; do sleep 0.05; done"}}
    """)
    follow = start_orch("events", plan, "--follow", "--json")
    runner = start_orch("run", plan)
    try:
        wait_for(lambda: pdir.status_of("slow") == "in_progress", what="slow running")
        assert run_orch("todo", "note", plan, "slow", "waiting on go").returncode == 0
        (pdir.root / "go").touch()
        runner.communicate(timeout=30)
        assert runner.returncode == 0
        time.sleep(1.0)  # the follower polls every 0.2 s
    finally:
        for p in (runner, follow):
            if p.poll() is None:
                p.terminate()
        runner.communicate(timeout=10)
        out, _ = follow.communicate(timeout=10)
    events = [json.loads(line) for line in out.splitlines()]
    assert all(e["schema"] == "orch.event/v1" for e in events)
    kinds = [(e["type"], e.get("task"), e.get("to") or e.get("key") or e.get("state"))
             for e in events]  # fmt: skip
    assert kinds[0] == ("run", None, "started")
    assert ("transition", "a", "completed") in kinds and ("finding", "a", "n") in kinds
    assert (
        kinds.index(("transition", "slow", "in_progress"))
        < kinds.index(("finding", "slow", "note"))
        < kinds.index(("transition", "slow", "completed"))
    )
    assert kinds[-1] == ("run", None, "completed")
    note = next(e for e in events if e.get("key") == "note")
    assert note["author"] == "person" and note["value"] == "waiting on go"
    # Without --follow: what is recorded, as lines; -n keeps the last ones.
    lines = run_orch("events", plan).stdout.splitlines()
    assert any("slow  in_progress -> completed" in ln for ln in lines), lines
    assert run_orch("events", plan, "-n", "1").stdout.splitlines() == lines[-1:]
    r = run_orch("events", "--store", pdir.root / "none.db")
    assert r.returncode == 2 and "no store" in r.stderr


def test_an_older_store_is_upgraded_and_keeps_its_record(pdir: PlanDir) -> None:
    """A schema-2 store (before added tasks and guards) gains the columns and tables; its
    tasks are the plan's. Read as it is first: the board has no role column to read."""
    plan = pdir.write(PLAN.format(root=pdir.root))
    assert run_orch("run", plan).returncode == 0
    with pdir.db() as db:
        db.execute("PRAGMA foreign_keys=OFF")
        for table, column in COLUMNS_SINCE:
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("DROP TABLE approvals")
        db.execute("PRAGMA user_version=2")
        db.commit()
    status = run_orch("status", plan)  # read as it is
    assert status.returncode == 0 and "2 tasks: 2 completed" in status.stdout, status.stderr
    assert run_orch("todo", "add", plan, "new").returncode == 0
    with pdir.db() as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        origins = dict(db.execute("SELECT id, origin FROM todos").fetchall())
    assert origins == {"a": "plan", "b": "plan", "new": "person"}
    assert run_orch("run", plan).returncode == 0 and ran(pdir) == ["a", "b"]


def test_a_new_stores_schema_is_what_sqlite_utils_builds(tmp_path: Path) -> None:
    """A new store is made by plain DDL, an older one upgraded by sqlite-utils: the same
    schema text as sqlite-utils writes from COLUMNS, and an upgraded store the same columns."""
    new = Store.open(tmp_path / "new.db")
    by_utils = Store(tmp_path / "utils.db", sqlite3.connect(tmp_path / "utils.db"))
    by_utils.conn.isolation_level = None
    by_utils._upgrade_schema()  # on an empty file: every table and index made by sqlite-utils
    old = Store.open(tmp_path / "old.db")
    old.conn.execute("PRAGMA foreign_keys=OFF")
    for table, column in (("todos", "origin"), ("todos", "definition"), ("findings", "author")):
        old.conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    old.conn.execute("PRAGMA user_version=2")
    old.close()
    upgraded = Store.open(tmp_path / "old.db")

    def schema(store: Store) -> list[tuple[Any, ...]]:
        q = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
        return [tuple(r) for r in store.conn.execute(q)]

    def columns(store: Store, table: str) -> set[tuple[Any, ...]]:
        return {tuple(r) for r in store.conn.execute(f"PRAGMA table_info({table})")}

    def foreign_keys(store: Store, table: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in store.conn.execute(f"PRAGMA foreign_key_list({table})")]

    assert schema(new) == schema(by_utils)
    assert {r[1] for r in schema(new)} >= {*COLUMNS, "idx_transitions_task_id_seq"}
    for table in COLUMNS:  # the column order aside (added columns come last), and NOT NULL:
        # add_column makes a column with a default NOT NULL, as it always has on upgrade
        assert {(c[1], c[2], c[4], c[5]) for c in columns(new, table)} == {
            (c[1], c[2], c[4], c[5]) for c in columns(upgraded, table)
        }
        assert foreign_keys(new, table) == foreign_keys(upgraded, table)
    for store in (new, upgraded):
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        store.close()


def test_concurrent_writers_lose_no_update(pdir: PlanDir) -> None:
    """Four processes adding todos and notes at once while a run writes: every write lands,
    none fails with "database is locked"."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: busy
            kind: shell
            params:
              command: "for i in $(seq 200); do echo ::finding i=$i; done; sleep 1"
    """)
    runner = start_orch("run", plan)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from orchestrator.plan.model import load_plan\n"
        "from orchestrator.store.db import Store\n"
        "from orchestrator.run import todos\n"
        "plan = load_plan(Path(sys.argv[1]))\n"
        "for i in range(25):\n"
        "    store = Store.open(Path(sys.argv[2]))\n"
        "    todos.add(plan, store, {'id': f'w{sys.argv[3]}_{i}'}, 'agent')\n"
        "    todos.note(store, 'busy', 'agent', f'{sys.argv[3]}:{i}')\n"
        "    store.close()\n"
    )
    try:
        wait_for(lambda: pdir.status_of("busy") == "in_progress", what="busy running")
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(plan), str(pdir.store_path()), str(n)],
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for n in range(4)
        ]
        errors = [w.communicate(timeout=60)[1] for w in writers]
        assert [w.returncode for w in writers] == [0] * 4, errors
        runner.communicate(timeout=60)
        assert runner.returncode == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    with pdir.db() as db:
        ids = {r[0] for r in db.execute("SELECT id FROM todos WHERE origin='agent'")}
        notes = db.execute("SELECT count(*) FROM findings WHERE author='agent'").fetchone()[0]
        runs = db.execute("SELECT count(*) FROM findings WHERE key='i'").fetchone()[0]
    assert ids == {f"w{n}_{i}" for n in range(4) for i in range(25)}
    assert notes == 100 and runs == 200


# --- todowrite lists from an agent: hostile input ---------------------------------------------

WORDS = st.sampled_from(["Step A", "b", "Report", "step a (done)", "Diagnose", "", " ", "x" * 300])
ITEMS = st.fixed_dictionaries(
    {
        "content": st.one_of(WORDS, st.text(max_size=80)),
        "status": st.sampled_from(["pending", "in_progress", "completed", "cancelled", "bogus"]),
        "priority": st.sampled_from(["high", "medium", "low", None, "urgent"]),
    },
    optional={"id": st.one_of(st.sampled_from(["a", "b", "nope"]), st.text(max_size=10))},
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lists=st.lists(st.lists(ITEMS, max_size=6), min_size=1, max_size=3))
@example(  # found in CI: a long content is kept cut; sent again whole it is the same todo
    lists=[
        [{"content": "x" * 300, "status": "pending", "priority": "high"}],
        [{"content": "x" * 300, "status": "in_progress", "priority": "high"}],
    ]
)
def test_any_todowrite_list_merges_or_is_refused_and_the_board_stays_one_list(
    tmp_path: Path, lists: list[list[dict[str, Any]]]
) -> None:
    """Whatever an agent sends: a clear refusal, or a merge after which every item names
    exactly one board task, plan tasks keep their status, and sending the board's own list
    back changes nothing."""
    from orchestrator.core.errors import UsageError
    from orchestrator.run import todos
    from orchestrator.store.db import Store, TodoSpec
    from orchestrator.views import board

    path = tmp_path / f"s{time.monotonic_ns()}.db"
    store = Store.open(path)
    try:
        store.sync_plan(
            [TodoSpec("a", 0, "Step A", "high", "shell", (), "h", "{}"),
             TodoSpec("b", 1, "b", "medium", "shell", ("a",), "h", "{}")],
            None,
        )  # fmt: skip
        for items in lists:
            before = [tuple(r) for r in store.todos()]
            try:
                merge = todos.todowrite(store, items, "agent")
            except UsageError as exc:
                assert str(exc)  # a reason the agent can read, and nothing half done
                assert [tuple(r) for r in store.todos()] == before
                continue
            ids = {r["id"] for r in store.todos()}
            assert set(merge.added) <= ids
            assert {m["id"] for m in merge.matched} <= ids
            assert len(merge.added) + len(merge.matched) == len(items)
            assert {store.todo("a")["status"], store.todo("b")["status"]} == {"pending"}
        rows, found = store.todos(), store.findings()
        own = board.todowrite(rows, found)["todos"]
        again = todos.todowrite(store, own, "agent")
        assert (again.added, again.updated, again.differs) == ([], [], [])
        assert len(store.todos()) == len(rows)
    finally:
        store.close()


def test_todo_set_help_names_every_status_it_takes() -> None:
    """The help of `orch todo set` lists what status_of accepts (it listed 6 of 9)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli
    from orchestrator.run.todos import STATUS_WORDS

    shown = CliRunner().invoke(cli, ["todo", "set", "--help"]).output
    assert [w for w in STATUS_WORDS if w not in shown] == []
