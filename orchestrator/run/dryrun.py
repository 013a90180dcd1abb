"""`orch plan`: what a run would do with each task, and why, without side effects.

Like Ansible's check mode, it evaluates what it can without changing anything: a `when`
whose references are known now (vars, findings of tasks that will not run again), and every
read-only precondition (Precondition.read_only) with such params, from the plan's folder. A
precondition that fails now makes the task `block` (and its dependents); one that needs a
finding of a task still to run, or runs the plan's own command, is named, not checked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.core.errors import TemplateError
from orchestrator.core.guards import GuardRole, undone_by
from orchestrator.core.guards import note as guard_note
from orchestrator.core.status import Status
from orchestrator.plan.model import Plan, PlannedCheck, PlannedTask
from orchestrator.plan.templating import Ref, evaluate_when, resolve
from orchestrator.run.approvals import GATE_KIND
from orchestrator.run.selection import Action, Selection, decide
from orchestrator.store.db import Store
from orchestrator.store.lock import RunLock


class _NotYet(Exception):
    """A reference whose value only the run will know."""


def dry_run(
    plan: Plan,
    store: Store | None,
    rerun: Sequence[str] = (),
    from_task: str | None = None,
    only: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One step per task, in run order, assuming every task that would run completes: first
    the compensations and `finally` tasks an earlier run left due (the steps they undo are
    pending again), then the plan's steps, then the other guards (a `finally` task runs at the
    end of a run that starts a step: one that was due is listed twice); then the store's todos
    with no kind, which nothing runs. Each step names its origin (`plan`, or who added it)."""
    from orchestrator.run.loop import from_folder
    from orchestrator.run.todos import plan_as_run

    plan = plan_as_run(plan, store)
    selection = Selection.of(plan, rerun, from_task, only)
    if only:
        rows = store.todos() if store else []
        selection.check_only(plan, {r["id"]: Status(r["status"]) for r in rows})
    with from_folder(plan.file.absolute().parent):
        steps = _steps(plan, store, selection)
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
    selection, revived, freshness = selection.knowing(plan, store, statuses)
    steps: list[dict[str, Any]] = []
    will_run: set[str] = set()  # their findings are the run's to know
    lookup = _lookup(plan, store, will_run)
    armed = {r["id"]: r["armed_run"] for r in store.armed()} if store else {}
    # What an earlier run left due runs before any step, in the engine's order (mend_first);
    # each that completes makes the step it protects pending again (GuardChange.undo).
    # A run with no recorded end, when no run holds the lock, is one the run will close as
    # crashed first (close_dead_runs): what it armed is due too.
    unended = store is not None and not store.readonly and RunLock(store.path).try_probe()
    due = plan.undo_order(r["id"] for r in store.due(unended)) if store else []
    due_ids = {g.id for g in due}
    undone: dict[str, str] = {}  # step -> the compensation that made it pending
    stuck: str | None = None  # a due guard that would not complete: then no step runs
    starts: str | None = None  # whether a step starts: "surely", "maybe" (a gate, a `when`)
    for guard in due:
        action, reason, _ = _would_run(guard, "", lookup)
        if action == "run":
            action, reason = "undo", "due: runs first" + (f"; {reason}" if reason else "")
            if guard.protects and statuses.get(guard.protects, Status.PENDING).done:
                undone[guard.protects] = guard.id
                statuses[guard.protects] = Status.PENDING
        else:
            reason = f"due; {reason}"
            stuck = stuck or (guard.id if action == "block" else None)
        note = guard_note(guard.role, guard.protects, armed[guard.id])
        steps.append(_step(guard.id, action, f"{note} ({reason})"))
    for task in plan.tasks:
        if stuck:
            reason = f"{stuck} would not complete, so the plan's steps do not run"
            steps.append(_step(task.id, "leave", reason))
            continue
        # A step undone is pending, as the run reads it after the undo: like no row at all.
        row = None if task.id in undone else rows.get(task.id)
        d = decide(task, row, selection, statuses, freshness)
        action, reason = str(d.action), d.reason
        if d.action is Action.KEEP:
            action = "stale" if d.stale else "skip"
            if d.stale:
                reason += f"; kept (re-run it with --rerun {task.id})"
            if unless := freshness.unless.get(task.id):
                reason += f"; stale if {', '.join(unless)} finds otherwise when it runs again"
        elif d.action is Action.BLOCK:
            statuses[task.id] = Status.BLOCKED
        elif d.action is Action.RUN:
            reason = undone_by(undone[task.id]) if task.id in undone else reason
            action, reason, sure = _would_run(task, revived.get(task.id, reason), lookup)
            statuses[task.id] = _ASSUMED[action]
            if action == "run":
                will_run.add(task.id)
                freshness.to_redo.add(task.id)
                starts = starts or ("surely" if sure else "maybe")
        elif d.action is Action.OUT_OF_SCOPE:
            action = "leave"
        steps.append(_step(task.id, action, reason, d.stale))
    for guard in plan.guards:  # not steps: what runs if the plan fails, or at a run's end
        armed_run = None if guard.id in due_ids else armed.get(guard.id)  # a due one ran first
        # A step that starts arms the `finally` tasks, run at the end of the run (wind_up);
        # one armed by a run that still holds the lock is that run's to run.
        armed_here = armed_run is not None and unended
        if guard.role == GuardRole.FINALLY and not stuck and (starts == "surely" or armed_here):
            note = guard_note(guard.role, None, armed_run)
            action, reason, _ = _would_run(guard, note, lookup)
        elif guard.id in due_ids:
            continue
        else:
            action = "guard"
            reason = guard_note(guard.role, guard.protects, armed_run)
            if armed_run is None and guard.role != GuardRole.FINALLY:
                reason += " (not armed)"
            elif armed_run is None:
                reason += (
                    " (not armed unless a step starts: none surely does)"
                    if starts and not stuck
                    else " (not armed: no step starts)"
                )
        steps.append(_step(guard.id, action, reason))
    return steps


def _step(task_id: str, action: str, reason: str, changed: Sequence[str] = ()) -> dict[str, Any]:
    return {"id": task_id, "action": action, "reason": reason, "changed": list(changed)}


# What the rest of the dry run assumes of a task the run would start, skip or block.
_ASSUMED = {"run": Status.COMPLETED, "skip": Status.SKIPPED, "block": Status.BLOCKED}


def _would_run(
    task: PlannedTask, reason: str, lookup: Callable[[Ref], Any]
) -> tuple[str, str, bool]:
    """What the run does with a task it takes up, as far as can be told now: `skip` (its
    `when` is false now), `block` (a read-only precondition fails now) or `run`; why; and
    whether it surely starts (not a gate, which waits unless approved, nor a `when` that
    only the run can tell)."""
    when = _known(evaluate_when, task.spec.when, lookup)
    if when is False:
        return "skip", f"when {task.spec.when!r} is false now", False
    if (blocked := _failing_check(task, lookup)) is not None:
        return "block", blocked, False
    why = [reason] if reason else []
    gate = task.spec.kind == GATE_KIND
    if gate:  # it may pass, if an approval holds by then
        why.append("an approval gate: waits unless approved")
    if when is None:
        why.append(f"if {task.spec.when}")
    if unchecked := [c.kind for c in task.checks if not _checkable(c, lookup)]:
        why.append(f"after preconditions checked only by the run: {', '.join(unchecked)}")
    return "run", "; ".join(why), not gate and when is not None


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
