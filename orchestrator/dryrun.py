"""`orch plan`: what a run would do with each task, and why, without side effects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .plan import Plan
from .selection import Action, Selection, decide
from .status import Status
from .store import Store


def dry_run(
    plan: Plan, store: Store | None, rerun: Sequence[str] = (), from_task: str | None = None,
    only: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One step per task, in run order, assuming every task that would run completes."""
    selection = Selection.of(plan, rerun, from_task, only)
    rows = {r["id"]: r for r in store.todos()} if store else {}
    statuses = {task_id: Status(r["status"]) for task_id, r in rows.items()}
    selection, revived = selection.reviving(plan, store.resources() if store else [], statuses)
    steps = []
    for task in plan.tasks:
        d = decide(task, rows.get(task.id), selection, statuses)
        action, reason = str(d.action), d.reason
        if d.action is Action.KEEP:
            action = "stale" if d.stale else "skip"
            if d.stale:
                reason += f"; kept (re-run it with --rerun {task.id})"
        elif d.action is Action.BLOCK:
            statuses[task.id] = Status.BLOCKED
        elif d.action is Action.RUN:
            reason = revived.get(task.id, reason)
            if task.spec.when is False:
                action, reason = "skip", "when is false"
                statuses[task.id] = Status.SKIPPED
            else:
                if isinstance(task.spec.when, str):
                    reason = f"{reason + '; ' if reason else ''}if {task.spec.when}"
                if task.checks:
                    kinds = ", ".join(c.kind for c in task.checks)
                    reason = f"{reason + '; ' if reason else ''}after preconditions: {kinds}"
                statuses[task.id] = Status.COMPLETED
        elif d.action is Action.OUT_OF_SCOPE:
            action = "leave"
        steps.append({"id": task.id, "action": action, "reason": reason,
                      "changed": list(d.stale)})
    return steps
