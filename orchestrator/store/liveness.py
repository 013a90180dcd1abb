"""Is the orchestrator that opened a run still alive?

Two independent signals, both required to call it dead: the store's run lock is free (the
kernel drops an flock when its holder dies, in any PID namespace), and the recorded process is
gone: no pid, a zombie (killed, its parent has not reaped it yet), a pid whose start time
differs (reused), or another boot.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from orchestrator.proc.procfs import boot_id, is_alive, process_start_time
from orchestrator.store.db import RunIdentity, Store

if TYPE_CHECKING:
    from orchestrator.store.rows import RunRow


def current_identity() -> RunIdentity:
    pid = os.getpid()
    return RunIdentity(pid, process_start_time(pid) or 0.0, socket.gethostname(), boot_id())


def death_of(run: RunRow) -> str | None:
    """Why the run's orchestrator is known to be gone, or None if it may still be alive."""
    who = f"orchestrator pid {run['pid']} (run #{run['id']})"
    if run["host"] != socket.gethostname():
        return None  # another host's process table cannot be read from here
    if run["boot_id"] != boot_id():
        return f"{who} died: the host rebooted since"
    started = process_start_time(run["pid"])
    if started is None or not is_alive(run["pid"]):  # a zombie (not yet reaped) is dead
        return f"{who} died while the task ran"
    if not run["pid_started_at"]:
        # No start time was recorded (/proc unreadable when the run began): a live pid
        # cannot be told from its reuse, and a live run is never taken for dead. The run
        # holding the lock closes it (close_dead_runs); status leaves it open.
        return None
    if abs(started - run["pid_started_at"]) > 0.05:
        return f"{who} died while the task ran (its pid now belongs to another process)"
    return None


def close_dead_runs(store: Store, holding_lock: bool) -> list[str]:
    """Close the runs recorded as open whose orchestrator is gone; their tasks become
    interrupted. Returns one note per task, for the log.

    The lock holder knows no other run is alive, so it also closes runs it cannot judge
    (another host) and recovers tasks left in progress under an ended run; anyone else (status)
    closes only what death_of proves dead, and only when the lock is free.
    """
    notes = []
    for run in store.open_runs():
        why = death_of(run)
        if why is None and not holding_lock:
            continue
        why = why or f"orchestrator pid {run['pid']} (run #{run['id']}) ended unrecorded"
        notes += [f"{task_id}: interrupted ({why})" for task_id in store.mark_dead_run(run, why)]
    if holding_lock:  # a run interrupted between two commits may have left its task behind
        notes += [
            f"{task_id}: interrupted (its run had ended)" for task_id in store.interrupt_strays()
        ]
    return notes
