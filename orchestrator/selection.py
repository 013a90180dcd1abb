"""Which tasks a run considers, and what it would do with each: shared by `run` and `plan`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .errors import UsageError
from .plan import Plan, PlannedTask, what_changed
from .status import Status


@dataclass(frozen=True)
class Selection:
    """`--rerun`, `--from` and `--only`, resolved against the plan."""

    forced: frozenset[str]  # run even if completed
    scope: frozenset[str]  # the only tasks this run may touch

    @classmethod
    def of(
        cls, plan: Plan, rerun: Sequence[str] = (), from_task: str | None = None,
        only: Sequence[str] = (),
    ) -> Selection:
        for task_id in [*rerun, *only, *([from_task] if from_task else [])]:
            if task_id not in plan.by_id:
                raise UsageError(f"no task {task_id!r} in {plan.file} "
                                 f"(tasks: {', '.join(plan.by_id)})")
        forced = {d for r in rerun for d in plan.downstream(r)}
        if from_task:
            start = plan.by_id[from_task].position
            forced |= {t.id for t in plan.tasks if t.position >= start}
        forced |= set(only)
        scope = set(only) if only else {t.id for t in plan.tasks}
        if from_task:
            scope &= forced
        return cls(frozenset(forced), frozenset(scope))

    def reviving(
        self, plan: Plan, ended: Mapping[str, str], statuses: Mapping[str, Status],
    ) -> tuple[Selection, dict[str, str]]:
        """Also run again each completed task whose resource the engine ended (`ended`: task ->
        how) while a task that needs it, in scope, has still to run (resources.py)."""
        revived = {
            task_id: f"what it held was ended ({how}); {', '.join(waiting)} still "
                     f"need{'s' if len(waiting) == 1 else ''} it"
            for task_id, how in ended.items()
            if task_id in plan.by_id and statuses.get(task_id) is Status.COMPLETED
            and (waiting := [d for d in plan.dependents[task_id] if d in self.scope
                             and (d in self.forced or not statuses.get(d, Status.PENDING).done)])
        }
        return Selection(self.forced | revived.keys(), self.scope | revived.keys()), revived


class Action(StrEnum):
    KEEP = "keep"  # completed or skipped before, spec unchanged (or stale: kept, reported)
    OUT_OF_SCOPE = "out_of_scope"  # --only / --from leave it as it is
    BLOCK = "block"  # a need did not complete
    WAIT = "wait"  # a need has not run (yet, or because the run stopped)
    RUN = "run"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    stale: tuple[str, ...] = ()  # what changed since a kept task ran


def decide(
    task: PlannedTask, row: sqlite3.Row | None, selection: Selection,
    statuses: Mapping[str, Status],
) -> Decision:
    """What a run does with `task`, given the statuses its needs have reached in this run."""
    status = Status(row["status"]) if row is not None else Status.PENDING
    if task.id not in selection.scope:
        return Decision(Action.OUT_OF_SCOPE, "not selected")
    if status.done and task.id not in selection.forced:
        if row is not None and row["spec_hash"] != task.spec_hash:
            old = json.loads(row["spec"]) if row["spec"] else {}
            return Decision(Action.KEEP, f"{status}, but stale", tuple(
                what_changed(old, task.fingerprint) or ["the spec changed"]))
        return Decision(Action.KEEP, str(status))
    for need in task.spec.needs:
        need_status = statuses.get(need, Status.PENDING)
        if need_status.done:
            continue
        if need_status in (Status.FAILED, Status.BLOCKED, Status.INTERRUPTED):
            return Decision(Action.BLOCK, f"needs {need}, which is {need_status}")
        if need not in selection.scope:
            return Decision(Action.BLOCK, f"needs {need}, which is {need_status} "
                                          "and not selected to run")
        return Decision(Action.WAIT, f"waits for {need}")
    return Decision(Action.RUN, f"was {status}" if status is not Status.PENDING else "")
