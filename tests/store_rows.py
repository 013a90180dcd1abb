"""Real store rows for the store and liveness tests: a store with a run and a task in it, a
task's spec, a pid that no process has."""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.core.status import Status
from orchestrator.store.db import RunIdentity, Store, TodoSpec


def store_with_task(tmp_path: Path, who: RunIdentity, task: str = "a") -> tuple[Store, int]:
    """A real store with one run opened by `who` and `task` in progress under it."""
    store = Store.open(tmp_path / "s.db")
    run_id = store.begin_run(who, "plan.yaml", "orch run", tmp_path)
    store.sync_plan([todo_spec(task)], run_id)
    store.transition(task, Status.IN_PROGRESS, "attempt 1/1", run_id)
    return store, run_id


def todo_spec(task_id: str, position: int = 0, title: str = "") -> TodoSpec:
    return TodoSpec(task_id, position, title or task_id, "medium", "shell", (), "h", "{}")


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
