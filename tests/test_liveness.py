"""Whether a run's orchestrator is dead (store/liveness.py): the verdicts word for word on
real run rows, and which runs `orch status` (no lock) or the lock holder closes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.status import Status
from orchestrator.proc.procfs import boot_id, process_start_time
from orchestrator.store.db import RunIdentity, Store
from orchestrator.store.liveness import close_dead_runs, current_identity, death_of

from conftest import PlanDir, run_orch, wait_for
from store_rows import dead_pid, store_with_task, todo_spec

# --- store/liveness.py: the verdicts, word for word -------------------------------------------


def test_current_identity_is_this_process() -> None:
    me = current_identity()
    assert me.pid == os.getpid()
    assert me.started_at == process_start_time(os.getpid()) and me.started_at > 0
    assert me.host == socket.gethostname() and me.boot_id == boot_id()


def test_a_live_orchestrator_is_not_judged_dead(tmp_path: Path) -> None:
    store, _ = store_with_task(tmp_path, current_identity())
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
        "gone": RunIdentity(dead_pid(), me.started_at, me.host, me.boot_id),
    }[change]
    store, run_id = store_with_task(tmp_path, who)
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
    store, _ = store_with_task(
        tmp_path, RunIdentity(me.pid, me.started_at + 0.01, me.host, me.boot_id)
    )
    assert death_of(store.open_runs()[0]) is None


def test_another_host_is_closed_only_by_the_lock_holder(tmp_path: Path) -> None:
    """Another host's process cannot be judged: status leaves it; the lock holder closes it."""
    me = current_identity()
    store, _ = store_with_task(
        tmp_path, RunIdentity(dead_pid(), me.started_at, "elsewhere.example", "other-boot")
    )
    [run] = store.open_runs()
    assert death_of(run) is None
    assert close_dead_runs(store, holding_lock=False) == []
    assert store.todo("a")["status"] == "in_progress"
    why = f"orchestrator pid {run['pid']} (run #1) ended unrecorded"
    assert close_dead_runs(store, holding_lock=True) == [f"a: interrupted ({why})"]
    assert store.todo("a")["reason"] == why and store.open_runs() == []


def test_strays_of_an_ended_run_are_recovered_only_by_the_lock_holder(tmp_path: Path) -> None:
    store, run_id = store_with_task(tmp_path, current_identity())
    store.end_run(run_id, "completed")  # ended between two commits: its task left behind
    assert close_dead_runs(store, holding_lock=False) == []
    assert store.todo("a")["status"] == "in_progress"
    assert close_dead_runs(store, holding_lock=True) == ["a: interrupted (its run had ended)"]
    assert store.todo("a")["reason"] == "left in progress by run #1, which has ended"


def test_every_dead_run_is_closed_not_only_the_first(tmp_path: Path) -> None:
    me = current_identity()
    store = Store.open(tmp_path / "s.db")
    store.sync_plan([todo_spec("a"), todo_spec("b", 1)], None)
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
    store.sync_plan([todo_spec("a")], run_id)
    store.transition("a", Status.IN_PROGRESS, None, run_id)
    store.close()
    r = run_orch("status", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.todo("a")["reason"] == (
        f"orchestrator pid {me.pid} (run #1) died: the host rebooted since"
    )


def test_a_zombie_orchestrator_is_dead(tmp_path: Path) -> None:
    """Exited but not yet reaped: its /proc entry and start time are still there, and it is
    dead all the same."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        state = Path(f"/proc/{child.pid}/stat")
        wait_for(lambda: state.read_text().rsplit(")", 1)[1].split()[0] == "Z", what="a zombie")
        who = RunIdentity(child.pid, process_start_time(child.pid) or 0.0, *_here())
        store, _ = store_with_task(tmp_path, who)
        [run] = store.open_runs()
        assert death_of(run) == f"orchestrator pid {child.pid} (run #1) died while the task ran"
    finally:
        child.wait()


def test_a_live_pid_with_no_recorded_start_time_is_not_taken_for_dead(tmp_path: Path) -> None:
    """Decision: with no start time recorded, a live pid may be the run's own process; only
    the lock holder closes such a run, `orch status` does not."""
    me = current_identity()
    store, _ = store_with_task(tmp_path, RunIdentity(me.pid, 0.0, me.host, me.boot_id))
    [run] = store.open_runs()
    assert death_of(run) is None
    assert close_dead_runs(store, holding_lock=False) == []
    assert close_dead_runs(store, holding_lock=True) == [
        f"a: interrupted (orchestrator pid {me.pid} (run #1) ended unrecorded)"
    ]


def _here() -> tuple[str, str]:
    return socket.gethostname(), boot_id()
