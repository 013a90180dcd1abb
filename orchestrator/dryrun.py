"""`orch plan`: what a run would do with each task, and why, without side effects.

Like Ansible's check mode, it evaluates what it can without changing anything: a `when`
whose references are known now (vars, findings of tasks that will not run again), and every
read-only precondition (Precondition.read_only) with such params, from the plan's folder. A
precondition that fails now makes the task `block` (and its dependents); one that needs a
finding of a task still to run, or runs the plan's own command, is named, not checked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .approvals import GATE_KIND
from .errors import TemplateError
from .guards import does as guard_does
from .guards import note as guard_note
from .plan import Plan, PlannedCheck, PlannedTask, with_added
from .selection import Action, Selection, decide
from .status import Status
from .store import Store
from .templating import Ref, evaluate_when, resolve


class _NotYet(Exception):
    """A reference whose value only the run will know."""


def dry_run(
    plan: Plan,
    store: Store | None,
    rerun: Sequence[str] = (),
    from_task: str | None = None,
    only: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One step per task, in run order, assuming every task that would run completes; then
    the store's todos with no kind, which nothing runs. Each step names its origin (`plan`,
    or who added it)."""
    from .executor import from_folder
    from .todos import added_tasks

    if store is not None:
        plan = with_added(plan, added_tasks(store))
    with from_folder(plan.file.absolute().parent):
        steps = _steps(plan, store, Selection.of(plan, rerun, from_task, only))
    for step in steps:
        step["origin"] = plan.added.get(step["id"], "plan")
    for r in store.added() if store else []:
        if r["kind"] is None:
            steps.append(
                {
                    "id": r["id"],
                    "action": "todo",
                    "reason": f"{r['status']}: a todo with no kind, kept by hand",
                    "changed": [],
                    "origin": r["origin"],
                }
            )
    return steps


def _steps(plan: Plan, store: Store | None, selection: Selection) -> list[dict[str, Any]]:
    rows = {r["id"]: r for r in store.todos()} if store else {}
    statuses = {task_id: Status(r["status"]) for task_id, r in rows.items()}
    selection, revived = selection.reviving(plan, store.resources() if store else [], statuses)
    steps = []
    will_run: set[str] = set()  # their findings are the run's to know
    lookup = _lookup(plan, store, will_run)
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
            when = _known(evaluate_when, task.spec.when, lookup)
            if when is False:
                action, reason = "skip", f"when {task.spec.when!r} is false now"
                statuses[task.id] = Status.SKIPPED
            elif (blocked := _failing_check(task, lookup)) is not None:
                action, reason = "block", blocked
                statuses[task.id] = Status.BLOCKED
            else:
                if task.spec.kind == GATE_KIND:  # it may pass, if an approval holds by then
                    reason = (
                        f"{reason + '; ' if reason else ''}an approval gate: waits unless approved"
                    )
                if when is None:
                    reason = f"{reason + '; ' if reason else ''}if {task.spec.when}"
                if unchecked := [c.kind for c in task.checks if not _checkable(c, lookup)]:
                    reason = (
                        f"{reason + '; ' if reason else ''}after preconditions checked "
                        f"only by the run: {', '.join(unchecked)}"
                    )
                statuses[task.id] = Status.COMPLETED
                will_run.add(task.id)
        elif d.action is Action.OUT_OF_SCOPE:
            action = "leave"
        steps.append({"id": task.id, "action": action, "reason": reason, "changed": list(d.stale)})
    armed = {r["id"]: r["armed_run"] for r in store.armed()} if store else {}
    due = {r["id"] for r in store.due()} if store else set()
    for guard in plan.guards:  # not steps: what runs if the plan fails, or at a run's end
        if guard.id in due:
            action, reason = "undo", f"{guard_does(guard.role, guard.protects)} (due: runs first)"
        else:
            action = "guard"
            reason = guard_note(guard.role, guard.protects, armed.get(guard.id))
            reason += "" if guard.id in armed else " (not armed)"
        steps.append({"id": guard.id, "action": action, "reason": reason, "changed": []})
    return steps


def _lookup(plan: Plan, store: Store | None, will_run: set[str]) -> Callable[[Ref], Any]:
    def lookup(ref: Ref) -> Any:
        if ref.task is None:
            return plan.vars[ref.name]
        found = store.finding(ref.task, ref.name) if store and ref.task not in will_run else None
        if found is None:
            raise _NotYet
        return found.value

    return lookup


def _known(evaluate: Callable[..., Any], *args: Any) -> Any:
    """What `evaluate(*args)` gives, or None when it needs what only the run will know."""
    try:
        return evaluate(*args)
    except (_NotYet, TemplateError):
        return None


def _checkable(check: PlannedCheck, lookup: Callable[[Ref], Any]) -> bool:
    return bool(check.cls.read_only) and _known(_params, check, lookup) is not None


def _params(check: PlannedCheck, lookup: Callable[[Ref], Any]) -> dict[str, Any]:
    return {k: resolve(v, lookup) for k, v in check.params.items()}


def _failing_check(task: PlannedTask, lookup: Callable[[Ref], Any]) -> str | None:
    """What the first read-only precondition that fails now found, checked once (a `wait`
    is not waited for: the run would wait, and says so)."""
    for check in task.checks:
        if not _checkable(check, lookup):
            continue
        try:
            result = check.cls(check.cls.Params.model_validate(_params(check, lookup))).check()
        except Exception as exc:  # a bug or a bad param: the run would block on it too
            return f"precondition {check.kind} cannot be checked: {exc}"
        if not result.ok:
            wait = f" (the run waits up to {check.wait:.0f}s for it)" if check.wait else ""
            return f"precondition {check.kind} fails now{wait}: {result.found}"
    return None
