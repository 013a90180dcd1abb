"""Compensations (`on_failure`) and `finally` tasks: armed by transitions, run when due.

A step's completion arms its compensations, the run's first start arms the plan's `finally`
tasks; both are committed with that transition (change), so a crash cannot lose them. They run
before anything else when an earlier run left them due (first: it failed, was stopped or
killed after arming them), after the plan's steps (wind_up: the compensations if the run
failed, the `finally` tasks whatever happened), or all at once for `orch rollback`. Each runs
like a task of its own (attempt.Attempts.perform), whatever the others did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.core.guards import GuardRole, due_because
from orchestrator.core.guards import note as guard_note
from orchestrator.core.status import RunOutcome, Status
from orchestrator.plan.model import Plan, PlannedTask
from orchestrator.run.attempt import Attempts
from orchestrator.store.db import GuardChange, Store


class Mending:
    """The compensations and `finally` tasks of one run (`rollback`: `orch rollback`, which
    runs all that is armed and nothing else)."""

    def __init__(self, plan: Plan, store: Store, run_id: int, log: Any, rollback: bool) -> None:
        self.plan, self.store, self.run_id, self.log = plan, store, run_id, log
        self.rollback = rollback
        self.finally_armed = False  # the plan's `finally` tasks, armed by the first start
        self.mended = True  # what earlier runs left due was undone (first)

    def change(self, task: PlannedTask, to: Status) -> GuardChange | None:
        """What this transition of `task` does to compensations and `finally` tasks."""
        if task.role is not None:  # a guard itself: done once it ran (or was skipped)
            if to is Status.COMPLETED:
                return GuardChange(disarm=task.id, undo=task.protects)
            return GuardChange(disarm=task.id) if to is Status.SKIPPED else None
        if to is Status.COMPLETED and (guards := self.plan.guarded.get(task.id)):
            why = guard_note(GuardRole.ON_FAILURE, task.id, self.run_id)
            return GuardChange(arm=guards, arm_reason=why)
        if to is Status.IN_PROGRESS and not self.finally_armed:
            self.finally_armed = True
            if guards := self.plan.guarded.get(None):
                why = guard_note(GuardRole.FINALLY, None, self.run_id)
                return GuardChange(arm=guards, arm_reason=why)
        return None

    def first(self, steps: Attempts) -> bool:
        """Before anything else: what an earlier run left due (it failed, was stopped or
        killed after arming them) runs now; `orch rollback` runs all that is armed. False if
        one of them did not complete: the host is not as the plan expects, so nothing runs."""
        due = self.store.armed() if self.rollback else self.store.due()
        if not due:
            if self.rollback:
                self.log.warning("rollback.nothing", why="nothing is armed: nothing to undo")
            return True
        self.log.warning(
            "run.compensating",
            tasks=", ".join(r["id"] for r in due),
            why="orch rollback" if self.rollback else due_because(r["armed_run"] for r in due),
        )
        for task in self.plan.tasks:  # what the failed run left running goes first
            steps.end_leftovers(task)
        ok = self.compensate(due, steps)
        steps.tally.reread(self.store)  # what they undid is pending again: the steps see it so
        if not ok:
            self.log.error(
                "run.stopped",
                why="a compensation or finally task did not complete; the plan's steps did not run",
                hint=f"orch status {self.plan.file}; fix it, then orch run or orch rollback",
            )
        self.mended = ok
        return ok

    def compensate(self, rows: Sequence[Any], steps: Attempts) -> bool:
        """Run these armed tasks: compensations first, the latest armed first (the last step
        done is undone first), then `finally` tasks in the plan's order. Each runs whatever the
        others did; True if every one completed or was skipped."""
        ordered = self.plan.undo_order(r["id"] for r in rows)
        for guard in ordered:
            self.log.warning(
                "task.compensating" if guard.protects else "task.finally",
                task=guard.id,
                **({"undoes": guard.protects} if guard.protects else {}),
            )
            steps.perform(guard)
        return all(steps.tally.statuses[g.id].done for g in ordered)

    def wind_up(self, outcome: RunOutcome, steps: Attempts) -> RunOutcome:
        """After the plan's steps (and after the servers they left were ended): the armed
        compensations if the run failed, the `finally` tasks whatever happened; a completed
        plan disarms its compensations. Then the run's end is recorded; its outcome returned."""
        if self.rollback or not self.mended:
            armed = []  # what was armed has had its one try in this run
        elif outcome == RunOutcome.FAILED:
            armed = self.store.armed()
        else:
            armed = [r for r in self.store.armed() if r["role"] == GuardRole.FINALLY]
        if armed and not self.compensate(armed, steps):
            outcome = RunOutcome.FAILED
        self.store.end_run(self.run_id, outcome)
        # Armed or never armed (their step was skipped): nothing of theirs can be due now.
        if outcome == RunOutcome.COMPLETED and self.store.all_done():
            spare = [
                r["id"]
                for r in self.store.todos()
                if r["role"] == GuardRole.ON_FAILURE and r["status"] == Status.PENDING
            ]
            if spare:
                self.store.disarm(spare, "the plan completed: nothing to undo", self.run_id)
        return outcome
