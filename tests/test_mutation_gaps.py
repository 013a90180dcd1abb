"""Tests for what a mutation run of store/lock.py, store/liveness.py, store/db.py and
run/loop.py (lock.py, liveness.py, store.py and executor.py then) showed no test noticed
(bench/mutation_probe.py): each fails when the behaviour it names is removed.

Locks are held by a real second process; liveness verdicts are asserted word for word on real
run rows; the store is real SQLite; the run loop is driven through the real `orch` CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import StoreError, StoreLocked
from orchestrator.core.findings import Finding
from orchestrator.core.status import ALLOWED, Status
from orchestrator.proc.procfs import boot_id, process_start_time
from orchestrator.store.db import RunIdentity, Store, TodoSpec
from orchestrator.store.liveness import close_dead_runs, current_identity, death_of
from orchestrator.store.lock import RunLock
from orchestrator.store.schema import SCHEMA_VERSION

from conftest import PlanDir, run_orch, start_orch, wait_for

# --- store/lock.py: a real second process holds the lock ------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.store.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire({"pid": %d, "host": "holder-host"})
lock.note_run(5)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
print("released", flush=True)
time.sleep(300)
"""


class Holder:
    """A process that takes the store's lock, holds it `hold` seconds, then releases it."""

    def __init__(self, store: Path, hold: float = 300.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER % os.getpid(), str(store), str(hold)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "held\n"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=10)  # reaps it and closes its pipe


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Holder]:
    h = Holder(tmp_path / "s.db")
    try:
        yield h
    finally:
        h.kill()


def test_live_holder_refuses_the_lock_and_is_named(tmp_path: Path, holder: Holder) -> None:
    """While another process holds the lock: refused after the retry window, naming it."""
    lock = RunLock(tmp_path / "s.db")
    assert lock.try_probe() is False
    fds = len(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    with pytest.raises(StoreLocked) as err:
        lock.acquire({"pid": os.getpid()})
    assert time.monotonic() - started >= 0.4, "a glance by `orch status` is waited out first"
    assert str(err.value).startswith(
        f"s.db is in use by orch run #5 (pid {os.getpid()} on holder-host, since "
    )
    assert "wait for that run to end, or stop it" in str(err.value)
    assert lock._fd is None and len(os.listdir("/proc/self/fd")) == fds, "no fd kept open"


def test_lock_is_taken_over_when_its_holder_is_killed(tmp_path: Path, holder: Holder) -> None:
    """SIGKILL of the holder frees the lock at once: the kernel drops the flock."""
    lock = RunLock(tmp_path / "s.db")
    holder.kill()
    assert lock.try_probe() is True
    lock.acquire({"pid": os.getpid(), "host": "me"})
    try:
        assert RunLock(tmp_path / "s.db").try_probe() is False
    finally:
        lock.release()
    assert RunLock(tmp_path / "s.db").try_probe() is True
    assert lock.path.exists(), "the file stays for the next run"


def test_lock_freed_during_the_retry_window_is_taken(tmp_path: Path) -> None:
    """A holder that lets go within half a second (a status glance) does not refuse a run."""
    h = Holder(tmp_path / "s.db", hold=0.2)
    try:
        lock = RunLock(tmp_path / "s.db")
        lock.acquire({"pid": os.getpid()})
        lock.release()
    finally:
        h.kill()


def test_lock_file_names_the_holder_and_overwrites_old_text(tmp_path: Path) -> None:
    """The lock file is exactly the holder's JSON, even over a longer stale text."""

    lock = RunLock(tmp_path / "s.db")
    lock.path.write_text("x" * 500)
    lock.acquire({"pid": 1234, "host": "h"})
    try:
        first = json.loads(lock.path.read_text())
        assert first["pid"] == 1234 and first["host"] == "h" and "run_id" not in first
        assert abs(first["locked_at"] - time.time()) < 5
        lock.note_run(9)
        assert json.loads(lock.path.read_text())["run_id"] == 9
        assert lock.describe_holder().startswith("orch run #9 (pid 1234 on h, since ")
    finally:
        lock.release()
    lock.release()  # a second release is harmless
    lock.path.write_text("not json")
    assert lock.describe_holder() == "another orch run"
    lock.path.write_text('{"pid": 3}')  # what it does not say is unknown, not an error
    epoch = time.strftime("%H:%M:%S", time.localtime(0))
    assert lock.describe_holder() == f"orch run #? (pid 3 on ?, since {epoch})"


def test_probe_of_a_missing_lock_file_creates_nothing(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "a" / "b" / "s.db")
    assert lock.try_probe() is True
    assert not lock.path.exists()
    lock.acquire({})  # creates the folders as well
    lock.release()
    assert lock.path.exists()


def test_cli_run_refused_while_a_live_process_holds_the_lock(pdir: PlanDir) -> None:
    """`orch run` against a held store exits 3 naming the holder, and runs nothing; once the
    holder is SIGKILLed the next run goes through."""
    plan = pdir.write(f"""
        name: t
        tasks: [{{id: a, kind: shell, params: {{command: "touch {pdir.root}/ran"}}}}]
    """)
    h = Holder(pdir.store_path())
    try:
        r = run_orch("run", plan)
        assert r.returncode == 3, r.stderr
        assert "in use by orch run #5" in r.stderr and "Traceback" not in r.stderr
        assert not (pdir.root / "ran").exists()
    finally:
        h.kill()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert (pdir.root / "ran").exists()


# --- store/liveness.py: the verdicts, word for word -------------------------------------------


def _store_with_task(tmp_path: Path, who: RunIdentity, task: str = "a") -> tuple[Store, int]:
    """A real store with one run opened by `who` and `task` in progress under it."""
    store = Store.open(tmp_path / "s.db")
    run_id = store.begin_run(who, "plan.yaml", "orch run", tmp_path)
    store.sync_plan([_spec(task)], run_id)
    store.transition(task, Status.IN_PROGRESS, "attempt 1/1", run_id)
    return store, run_id


def _spec(task_id: str, position: int = 0, title: str = "") -> TodoSpec:
    return TodoSpec(task_id, position, title or task_id, "medium", "shell", (), "h", "{}")


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_current_identity_is_this_process() -> None:
    me = current_identity()
    assert me.pid == os.getpid()
    assert me.started_at == process_start_time(os.getpid()) and me.started_at > 0
    assert me.host == socket.gethostname() and me.boot_id == boot_id()


def test_a_live_orchestrator_is_not_judged_dead(tmp_path: Path) -> None:
    store, _ = _store_with_task(tmp_path, current_identity())
    [run] = store.open_runs()
    assert death_of(run) is None
    assert close_dead_runs(store, holding_lock=False) == []
    assert store.todo("a")["status"] == "in_progress" and len(store.open_runs()) == 1


@pytest.mark.parametrize(
    "change, verdict",
    [
        ("reboot", "orchestrator pid {pid} (run #1) died: the host rebooted since"),
        (
            "reused",
            "orchestrator pid {pid} (run #1) died while the task ran "
            "(its pid now belongs to another process)",
        ),
        ("gone", "orchestrator pid {pid} (run #1) died while the task ran"),
    ],
)
def test_dead_orchestrator_verdicts(tmp_path: Path, change: str, verdict: str) -> None:
    """Another boot, a pid now started at another time, a pid that is gone: each is proved
    dead, and status (not holding the lock) closes the run and interrupts its task."""
    me = current_identity()
    who = {
        "reboot": RunIdentity(me.pid, me.started_at, me.host, "another-boot-id"),
        "reused": RunIdentity(me.pid, me.started_at - 10.0, me.host, me.boot_id),
        "gone": RunIdentity(_dead_pid(), me.started_at, me.host, me.boot_id),
    }[change]
    store, run_id = _store_with_task(tmp_path, who)
    [run] = store.open_runs()
    why = verdict.format(pid=who.pid)
    assert death_of(run) == why
    assert close_dead_runs(store, holding_lock=False) == [f"a: interrupted ({why})"]
    row = store.todo("a")
    assert row["status"] == "interrupted" and row["reason"] == why
    assert store.open_runs() == []
    assert store.runs()[0]["outcome"] == "crashed"


def test_start_time_within_a_tick_is_the_same_process(tmp_path: Path) -> None:
    me = current_identity()
    store, _ = _store_with_task(
        tmp_path, RunIdentity(me.pid, me.started_at + 0.01, me.host, me.boot_id)
    )
    assert death_of(store.open_runs()[0]) is None


def test_another_host_is_closed_only_by_the_lock_holder(tmp_path: Path) -> None:
    """Another host's process cannot be judged: status leaves it; the lock holder closes it."""
    me = current_identity()
    store, _ = _store_with_task(
        tmp_path, RunIdentity(_dead_pid(), me.started_at, "elsewhere.example", "other-boot")
    )
    [run] = store.open_runs()
    assert death_of(run) is None
    assert close_dead_runs(store, holding_lock=False) == []
    assert store.todo("a")["status"] == "in_progress"
    why = f"orchestrator pid {run['pid']} (run #1) ended unrecorded"
    assert close_dead_runs(store, holding_lock=True) == [f"a: interrupted ({why})"]
    assert store.todo("a")["reason"] == why and store.open_runs() == []


def test_strays_of_an_ended_run_are_recovered_only_by_the_lock_holder(tmp_path: Path) -> None:
    store, run_id = _store_with_task(tmp_path, current_identity())
    store.end_run(run_id, "completed")  # ended between two commits: its task left behind
    assert close_dead_runs(store, holding_lock=False) == []
    assert store.todo("a")["status"] == "in_progress"
    assert close_dead_runs(store, holding_lock=True) == ["a: interrupted (its run had ended)"]
    assert store.todo("a")["reason"] == "left in progress by run #1, which has ended"


def test_every_dead_run_is_closed_not_only_the_first(tmp_path: Path) -> None:
    me = current_identity()
    store = Store.open(tmp_path / "s.db")
    store.sync_plan([_spec("a"), _spec("b", 1)], None)
    for task in ("a", "b"):
        run_id = store.begin_run(
            RunIdentity(me.pid, me.started_at, me.host, "old-boot"), "p", "orch run", tmp_path
        )
        store.transition(task, Status.IN_PROGRESS, None, run_id)
    notes = close_dead_runs(store, holding_lock=False)
    assert [n.split(":")[0] for n in notes] == ["a", "b"]
    assert store.open_runs() == []


def test_status_recovers_a_rebooted_run_through_the_cli(pdir: PlanDir) -> None:
    """`orch status` closes a run from before a reboot, saying so."""
    plan = pdir.write("""
        name: t
        tasks: [{id: a, kind: shell, params: {command: "true"}}]
    """)
    me = current_identity()
    store = Store.open(pdir.store_path())
    store.bind_plan("t")
    run_id = store.begin_run(
        RunIdentity(me.pid, me.started_at, me.host, "before-reboot"),
        str(plan),
        "orch run",
        pdir.root,
    )
    store.sync_plan([_spec("a")], run_id)
    store.transition("a", Status.IN_PROGRESS, None, run_id)
    store.close()
    r = run_orch("status", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.todo("a")["reason"] == (
        f"orchestrator pid {me.pid} (run #1) died: the host rebooted since"
    )


# --- store/db.py ----------------------------------------------------------------------------


def test_store_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match=rf"written by a newer orch \(schema {SCHEMA_VERSION + 1}"):
        Store.open(path)
    store = Store.open(path.with_name("same.db"))  # the current version itself is fine
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()
    Store.open(path.with_name("same.db")).close()


def test_cli_on_a_newer_schema_store_exits_2_without_traceback(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        tasks: [{id: a, kind: shell, params: {command: "true"}}]
    """)
    assert run_orch("run", plan).returncode == 0
    with pdir.db() as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        conn.commit()
    for cmd in ("status", "run"):
        r = run_orch(cmd, plan)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "written by a newer orch" in r.stderr and "Traceback" not in r.stderr


def test_missing_store_is_not_created_when_reading(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        Store.open(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "s.db")
    s.sync_plan([_spec("a")], None)
    try:
        yield s
    finally:
        s.close()


def test_only_allowed_transitions_are_accepted(store: Store) -> None:
    """Every pair of statuses: the store takes exactly those in ALLOWED, and a refused one
    changes nothing (no row, no log entry)."""
    for current in Status:
        for to in Status:
            store.conn.execute("UPDATE todos SET status=? WHERE id='a'", (str(current),))
            logged = len(store.transitions("a"))
            if to in ALLOWED[current]:
                store.transition("a", to, None, None)
                assert store.todo("a")["status"] == to
            else:
                with pytest.raises(StoreError, match=f"{current} -> {to} is not a valid"):
                    store.transition("a", to, None, None, [Finding("k", 1)])
                assert store.todo("a")["status"] == current
                assert len(store.transitions("a")) == logged
                assert store.findings() == {}
    with pytest.raises(StoreError, match="unknown task 'zz'"):
        store.transition("zz", Status.IN_PROGRESS, None, None)


def test_attempts_count_starts_only(store: Store) -> None:
    assert store.transition("a", Status.IN_PROGRESS, None, 1) == 1
    assert store.transition("a", Status.FAILED, "x", 1) == 1
    assert store.transition("a", Status.IN_PROGRESS, None, 2) == 2
    assert store.todo("a")["attempts"] == 2 and store.todo("a")["run_id"] == 2
    store.transition("a", Status.COMPLETED, None, None)
    assert store.todo("a")["run_id"] == 2, "no run given: the row keeps its run"
    assert [(t["from_status"], t["to_status"], t["attempt"]) for t in store.transitions("a")] == [
        (None, "pending", 0),
        ("pending", "in_progress", 1),
        ("in_progress", "failed", 1),
        ("failed", "in_progress", 2),
        ("in_progress", "completed", 2),
    ]
    assert [t["to_status"] for t in store.transitions("a", limit=2)] == ["in_progress", "completed"]


def test_findings_kept_on_completion_and_only_the_latest_attempt_shown(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 1)
    store.transition(
        "a",
        Status.COMPLETED,
        None,
        1,
        [Finding("v", 1), Finding("v", 2, "ms", "n"), Finding("ok", True)],
    )
    assert store.findings() == {
        "a": [Finding("v", 1), Finding("v", 2, "ms", "n"), Finding("ok", True)]
    }
    assert store.finding("a", "v") == Finding("v", 2, "ms", "n")
    assert store.finding("a", "ok") == Finding("ok", True)
    assert store.finding("a", "nope") is None
    store.transition("a", Status.IN_PROGRESS, None, 2)  # a new attempt: old findings hidden
    assert store.findings() == {} and store.finding("a", "v") is None


def test_sync_plan_keeps_status_and_marks_removed_tasks(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 1)
    store.transition("a", Status.COMPLETED, None, 1)
    store.sync_plan([_spec("a", 0, "renamed"), _spec("b", 1)], 2)
    assert [(r["id"], r["status"], r["title"]) for r in store.todos()] == [
        ("a", "completed", "renamed"),
        ("b", "pending", "b"),
    ]
    before = store.conn.total_changes
    store.sync_plan([_spec("a", 0, "renamed"), _spec("b", 1)], 3)
    assert store.conn.total_changes == before, "an unchanged plan writes nothing"
    store.sync_plan([_spec("b", 0)], 4)
    assert [r["id"] for r in store.todos()] == ["b"]
    assert store.todo("a")["in_plan"] == 0 and store.todo("a")["status"] == "completed"
    store.sync_plan([_spec("a", 0, "renamed"), _spec("b", 1)], 5)
    assert [r["id"] for r in store.todos()] == ["a", "b"]


def test_all_done_and_plan_binding(store: Store) -> None:
    assert store.all_done() is False
    store.transition("a", Status.SKIPPED, "when false", None)
    assert store.all_done() is True
    run_id = store.begin_run(current_identity(), "p", "orch run", Path("."))
    assert store.all_done() is False, "an open run is not done"
    store.end_run(run_id, "completed")
    assert store.all_done() is True
    empty = Store.open(store.path.with_name("e.db"))
    assert empty.all_done() is False, "a plan with no task recorded is not done"
    empty.close()
    store.bind_plan("p1")
    store.bind_plan("p1")
    assert store.plan_name() == "p1"
    with pytest.raises(StoreError, match="holds plan 'p1', not 'p2'"):
        store.bind_plan("p2")


def test_close_run_touches_only_its_own_tasks(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.sync_plan([_spec("a"), _spec("b", 1)], None)
    me = current_identity()
    r1 = store.begin_run(me, "p", "x", tmp_path)
    r2 = store.begin_run(me, "p", "x", tmp_path)
    assert store.next_run_id() == 3
    store.transition("a", Status.IN_PROGRESS, None, r1)
    store.transition("b", Status.IN_PROGRESS, None, r2)
    store.set_process("a", 4242, 12.5)
    assert store.close_run(r1, "interrupted", "stopped by Ctrl-C") == ["a"]
    assert store.todo("b")["status"] == "in_progress"
    a = store.todo("a")
    assert (a["status"], a["reason"], a["pgid"], a["pgid_started_at"]) == (
        "interrupted",
        "stopped by Ctrl-C",
        4242,
        12.5,
    )
    assert a["ended_at"] is not None
    assert store.close_run(r1, "crashed", "again") == []
    assert [(r["id"], r["outcome"]) for r in store.runs()] == [(r2, None), (r1, "interrupted")]
    assert [r["id"] for r in store.runs(limit=1)] == [r2]


def test_stray_whose_run_row_is_missing_is_interrupted(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 77)  # run 77 was never recorded
    assert store.interrupt_strays() == ["a"]
    assert store.todo("a")["status"] == "interrupted"
    assert store.interrupt_strays() == []


def test_resources_hold_replace_release(store: Store) -> None:
    store.hold("srv", "a", "server.launch", 1, {"pid": 1})
    store.hold("srv", "a", "server.launch", 1, {"pid": 2})
    store.hold("other", "a", "server.launch", 1, {})
    assert [r["name"] for r in store.held()] == ["srv", "other"]

    assert json.loads(store.held("srv")[0]["data"]) == {"pid": 2}
    store.release("srv", "a", "by task a")
    assert store.held("srv") == [] and [r["name"] for r in store.held()] == ["other"]
    row = {r["name"]: r for r in store.resources()}["srv"]
    assert (row["released_by"], row["how"]) == ("a", "by task a")
    assert row["released_at"] is not None


# --- run/loop.py, through the CLI -----------------------------------------------------------


def _pythonpath(folder: Path) -> dict[str, str]:
    """PYTHONPATH with `folder` added (kept: a mutation run points it at its copy)."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    }


BUGGY = """
from pydantic import BaseModel
from orchestrator import Context, Task

class P(BaseModel):
    n: int = 0

class Buggy(Task[P]):
    Params = P
    def run(self, ctx: Context) -> None:
        print("before the bug", flush=True)
        {}["missing"]
"""


def test_bug_in_a_task_class_fails_the_task_not_the_run(pdir: PlanDir) -> None:
    """An exception from a task class: that task fails with the exception as its error and
    the traceback in its log; the run ends normally and (keep-going) runs the rest."""
    (pdir.root / "mybug.py").write_text(BUGGY)
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: bug, kind: "mybug:Buggy"}}
          - {{id: other, kind: shell, params: {{command: "touch {pdir.root}/other"}}}}
    """)
    r = run_orch("run", plan, "--keep-going", env=_pythonpath(pdir.root))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    row = pdir.todo("bug")
    assert (row["status"], row["last_error"]) == ("failed", "KeyError: 'missing'")
    log = Path(row["log_path"]).read_text()
    assert "Traceback (most recent call last)" in log and "KeyError" in log
    assert pdir.statuses()["other"] == "completed"
    with pdir.db() as conn:
        assert conn.execute("SELECT outcome FROM runs").fetchone()[0] == "failed"


def test_bad_params_fail_the_task_before_it_starts_and_stop_the_run(pdir: PlanDir) -> None:
    (pdir.root / "mybug.py").write_text(BUGGY)
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "echo ::finding n=many"}}}}
          - {{id: bad, kind: "mybug:Buggy", needs: [a], params: {{n: "${{tasks.a.findings.n}}"}}}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    r = run_orch("run", plan, env=_pythonpath(pdir.root))
    assert r.returncode == 1, r.stderr
    row = pdir.todo("bad")
    assert row["status"] == "failed" and row["last_error"].startswith("params: ")
    assert row["attempts"] == 0, "it never started"
    assert pdir.statuses()["later"] == "pending", "fail fast: nothing new starts"


def test_unresolvable_when_fails_the_task_and_stops_unless_keep_going(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "true"}}}}
          - {{id: w, kind: shell, needs: [a], when: "${{tasks.a.findings.nothing}} == 1",
              params: {{command: "true"}}}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    assert pdir.todo("w")["status"] == "failed"
    assert "recorded no finding 'nothing'" in pdir.todo("w")["last_error"]
    assert pdir.statuses()["later"] == "pending"
    r = run_orch("run", plan, "--keep-going")
    assert pdir.statuses()["later"] == "completed"


def test_blocked_precondition_stops_new_work_unless_keep_going(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions: [{{kind: "helpers_tasks:BrokenCheck"}}]
            params: {{command: "true"}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    env = _pythonpath(Path(__file__).parent)
    r = run_orch("run", plan, env=env)
    assert r.returncode == 1
    assert pdir.statuses() == {"a": "blocked", "later": "pending"}
    assert "--keep-going runs what does not depend on the failure" in r.stderr
    r = run_orch("run", plan, "--keep-going", env=env)
    assert pdir.statuses() == {"a": "blocked", "later": "completed"}


def test_retry_waits_its_delay_and_failure_after_last_attempt_stops(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: flaky
            kind: shell
            retries: {{attempts: 2, delay: 700ms}}
            params: {{command: "echo x >> {pdir.root}/n; exit 1"}}
          - {{id: later, kind: shell, params: {{command: "true"}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1
    with pdir.db() as conn:
        at = [
            row[0]
            for row in conn.execute(
                "SELECT at FROM transitions WHERE task_id='flaky' AND to_status!='pending'"
                " ORDER BY seq"
            )
        ]
    assert len(at) == 4
    assert at[2] - at[1] >= 0.7, "the second attempt starts after the delay"
    assert (pdir.root / "n").read_text() == "x\nx\n"
    assert pdir.statuses()["later"] == "pending"
    assert "task.retry" in r.stderr or "retry" in r.stderr


def test_run_outcome_is_failed_when_a_task_in_scope_is_blocked(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "exit 1"}}
          - {id: b, kind: shell, needs: [a], params: {command: "true"}}
    """)
    assert run_orch("run", plan, "--keep-going").returncode == 1
    with pdir.db() as conn:
        assert conn.execute("SELECT outcome FROM runs").fetchone()[0] == "failed"
    assert pdir.statuses() == {"a": "failed", "b": "blocked"}


def test_sigkilled_holder_of_a_real_run_is_taken_over(pdir: PlanDir) -> None:
    """A real `orch run` holding the store is SIGKILLed mid-task; the next run takes over."""

    plan = pdir.write(f"""
        name: t
        tasks: [{{id: a, kind: shell, params: {{command: "touch {pdir.root}/up; sleep 300"}}}}]
    """)
    proc = start_orch("run", plan)
    try:
        wait_for(lambda: (pdir.root / "up").exists(), what="task started")
        r = run_orch("run", plan)
        assert r.returncode == 3, r.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    plan.write_text(plan.read_text().replace("; sleep 300", ""))
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.statuses() == {"a": "completed"}
