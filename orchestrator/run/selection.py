"""Which tasks a run considers, and what it would do with each: shared by `run` and `plan`.

Decisions (the same for `orch run` and `orch plan`, which both go through `Selection`):

- `--rerun X` runs X again and everything downstream of it, except past a *releaser*: a task
  whose kind lets go of a resource another task holds (`Task.releases`, e.g. `server.stop`).
  When X is that holder or lies between the holder and its releaser (it needs the holder,
  directly or not), the releaser is run again but its dependents are not forced: they need
  it only for ordering ("the server is stopped, the port is free"), and re-running the
  holder-to-releaser stretch leaves the host as it was. When X is upstream of the holder (a
  reinstall before the launch), everything downstream is forced, through the releaser too.
  Which task holds a resource is what the store says (`resources`); where it cannot say (no
  run has held it yet), the rerun goes on downstream.
- Revival: a completed task that held a resource which is not held now (the engine ended it at
  the end of a run or after a crash, or a releaser let it go) runs again when a task that
  needs it, in scope, has to run (forced, or not done). Its releasers that the plan names
  literally (`${...}` cannot be known before the run) run again too, after those users, so the
  host ends as it was; a releaser that a user itself needs is left alone (the end of the run
  ends the resource anyway). Revival repeats until nothing changes: a revived holder that needs
  another holder revives that one too. A finished plan run again revives nothing.

- Freshness (Make's rule, over `needs`): a done task is stale when a task it needs became done
  again after it did (the store's transition order, not the clock), ran again in this run, or
  is stale itself. It is kept and reported, like a task whose spec changed (`--rerun` redoes
  it): a 30-minute benchmark is not redone unasked. A kind whose completion is a state of the
  host (`Task.state_only`: a stop, a gate) carries no data: its dependents need it for order,
  so done again (a compensation undid it, a revival) it makes none stale that does not read
  its findings.
- What a run was asked to redo (`--rerun`, `--from`, `--only`, revival) is owed until done: the
  run records it as it starts (`Owed`), and a later run that finds part of it not done since
  (the run crashed, failed, or stopped at a gate) redoes that part too, so an interrupted
  `--rerun` never leaves results of two generations side by side.

The engine knows holders, resources and releasers only, nothing of what a resource is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import UsageError, did_you_mean
from orchestrator.core.guards import GuardRole
from orchestrator.core.guards import does as guard_does
from orchestrator.core.status import Status
from orchestrator.plan.model import Plan, PlannedTask, what_changed
from orchestrator.plan.templating import iter_refs
from orchestrator.store.db import DoneMark, Store

if TYPE_CHECKING:
    from orchestrator.store.rows import ResourceRow, TodoRow

OWED_KEY = "owed"  # the store's meta key of the latest run's Owed (JSON)


@dataclass(frozen=True)
class Selection:
    """`--rerun`, `--from` and `--only`, resolved against the plan (and, once the store is
    known, against who held what: see `reviving`)."""

    forced: frozenset[str]  # run even if completed
    scope: frozenset[str]  # the only tasks this run may touch
    rerun: tuple[str, ...] = ()  # what was asked: kept to resolve again knowing the store
    from_task: str | None = None
    only: tuple[str, ...] = ()
    # task -> tasks it runs after without needing them: a revived holder's releaser after the
    # holder's users (ordering for the run loop only; `decide` does not wait on them)
    after: Mapping[str, frozenset[str]] = field(default_factory=dict)
    owed: Owed | None = None  # what an earlier run was asked to redo and left undone (carrying)

    @classmethod
    def of(
        cls,
        plan: Plan,
        rerun: Sequence[str] = (),
        from_task: str | None = None,
        only: Sequence[str] = (),
        resources: Sequence[ResourceRow] = (),
    ) -> Selection:
        """`resources`: the store's rows (store.resources()); without them a rerun is not cut
        at releasers (nothing says who holds what)."""
        for task_id in [*rerun, *only, *([from_task] if from_task else [])]:
            if task_id not in plan.by_id:
                raise UsageError(
                    f"no task {task_id!r} in {plan.file}{did_you_mean(task_id, plan.by_id)} "
                    f"(tasks: {', '.join(plan.by_id)})"
                )
            if (role := (task := plan.by_id[task_id]).role) is not None:
                what = "a compensation" if role == GuardRole.ON_FAILURE else "a `finally` task"
                raise UsageError(
                    f"{task_id!r} is {what} (it {guard_does(role, task.protects)}), not a step; "
                    f"`orch rollback {plan.file}` runs what is armed now"
                )
        holders = {r["name"]: r["task_id"] for r in resources}
        forced = {d for r in rerun for d in _rerun_downstream(plan, r, holders)}
        if from_task:
            start = plan.by_id[from_task].position
            forced |= {t.id for t in plan.tasks if t.position >= start}
        forced |= set(only)
        scope = set(only) if only else {t.id for t in plan.tasks}
        if from_task:
            scope &= forced
        return cls(frozenset(forced), frozenset(scope), tuple(rerun), from_task, tuple(only))

    def check_only(self, plan: Plan, statuses: Mapping[str, Status]) -> None:
        """`--only ID` runs ID alone, so each of its needs that is not selected too must be
        done already; else a usage error, before anything is written (it would block ID, a
        completed ID included, and exit 1)."""
        unmet = [
            f"{task_id} needs {need}, which is {statuses.get(need, Status.PENDING)}"
            for task_id in self.only
            for need in plan.by_id[task_id].spec.needs
            if need not in self.scope and not statuses.get(need, Status.PENDING).done
        ]
        if unmet:
            raise UsageError(
                f"--only: {'; '.join(unmet)}: add --only for what it needs, or run without --only"
            )

    def reviving(
        self,
        plan: Plan,
        resources: Sequence[ResourceRow],
        statuses: Mapping[str, Status],
    ) -> tuple[Selection, dict[str, str]]:
        """This selection knowing the store's `resources` (store.resources()): the rerun cut at
        releasers, each completed holder whose resource is not held now run again while a task
        that needs it, in scope, has still to run, and that resource's releasers run again after
        those users (module docstring). Returns it, and why each added task runs."""
        base = Selection.of(plan, self.rerun, self.from_task, self.only, resources)
        forced, scope = set(base.forced) | self.carried, set(base.scope)
        after: dict[str, set[str]] = {}
        why: dict[str, list[str]] = {}
        releasers = _releasers(plan)
        let_go: dict[str, list[ResourceRow]] = {}  # holder -> its resources not held now
        for row in resources:
            if row["released_at"] is not None and row["task_id"] in plan.by_id:
                let_go.setdefault(row["task_id"], []).append(row)
        changed = True
        while changed:
            changed = False
            for holder, rows in let_go.items():
                if holder in forced or statuses.get(holder) is not Status.COMPLETED:
                    continue
                stoppers = {s for r in rows for s in releasers.get(r["name"], ())}
                users = [
                    d
                    for d in plan.dependents[holder]
                    if d not in stoppers
                    and d in scope
                    and (d in forced or not statuses.get(d, Status.PENDING).done)
                ]
                if not users:
                    continue
                changed = True
                forced.add(holder)
                scope.add(holder)
                need = f"{', '.join(users)} still need{'s' if len(users) == 1 else ''} it"
                how = "; ".join(
                    f"stopped by {r['released_by']}" if r["released_by"] else f"ended ({r['how']})"
                    for r in rows
                )
                why.setdefault(holder, []).append(f"what it held was {how}; {need}")
                for row in rows:
                    for stopper in releasers.get(row["name"], ()):
                        downstream = set(plan.downstream(stopper))
                        if any(u in downstream for u in users):
                            continue  # a user needs it done first: it cannot come after them
                        forced.add(stopper)
                        scope.add(stopper)
                        for user in users:  # unless already ordered (or it would loop)
                            if not (
                                _depends(plan, after, stopper, user)
                                or _depends(plan, after, user, stopper)
                            ):
                                after.setdefault(stopper, set()).add(user)
                        why.setdefault(stopper, []).append(
                            f"stops {row['name']} again after {', '.join(users)}"
                        )
        selection = Selection(
            frozenset(forced),
            frozenset(scope),
            self.rerun,
            self.from_task,
            self.only,
            {k: frozenset(v) for k, v in after.items()},
            self.owed,
        )
        return selection, {task_id: "; ".join(whys) for task_id, whys in why.items()}

    def knowing(
        self, plan: Plan, store: Store | None, statuses: Mapping[str, Status]
    ) -> tuple[Selection, dict[str, str], Freshness]:
        """This selection resolved against the store, as `orch run` and `orch plan` both need
        it: what an earlier run still owes carried, then `reviving`; and the Freshness to
        decide with. Returns it, why each revived task runs, and the Freshness."""
        if store is None:
            selection, revived = self.reviving(plan, [], statuses)
            return selection, revived, Freshness(plan, {}, lambda _task, _seq: [])
        done = store.done_marks()
        carried = self.carrying(plan, Owed.from_json(store.meta(OWED_KEY)), done)
        selection, revived = carried.reviving(plan, store.resources(), statuses)
        return selection, revived, Freshness(plan, done, store.findings_as_of)

    def carrying(self, plan: Plan, owed: Owed | None, done: Mapping[str, DoneMark]) -> Selection:
        """This selection with what `owed` still owes (in the plan, not done since that run
        began) forced too, in this selection's scope; call before `reviving`, which keeps it."""
        if owed is None:
            return self
        owed = owed.left(done, plan.by_id)
        return replace(self, forced=self.forced | (owed.carried & self.scope), owed=owed)

    @property
    def carried(self) -> frozenset[str]:
        return self.owed.carried & self.scope if self.owed else frozenset()

    def owing(self, run_id: int, since: int, asked: str) -> Owed | None:
        """What a run with this selection owes as it starts: its forced tasks in scope, and
        what an earlier run still owed that this one leaves out of its scope."""
        tasks = (self.forced & self.scope) | (self.owed.carried if self.owed else frozenset())
        if not asked and self.owed and self.owed.tasks:  # still what that run asked for
            run_id, asked = self.owed.run_id, self.owed.asked
        return Owed(run_id, since, tuple(sorted(tasks)), asked or "a revival") if tasks else None

    def why_carried(self, task_id: str) -> str | None:
        if self.owed is None or task_id not in self.carried:
            return None
        return f"{self.owed.reason} it"


@dataclass(frozen=True)
class Owed:
    """What a run was asked to redo, recorded as it starts (OWED_KEY): tasks forced, and the
    store's last transition seq then; a task done after that seq has been redone."""

    run_id: int
    since: int
    tasks: tuple[str, ...]
    asked: str  # what the operator asked for, as the reason a later run gives

    def left(self, done: Mapping[str, DoneMark], planned: Collection[str]) -> Owed:
        """What is still owed: the tasks still planned and not done since."""
        return replace(
            self,
            tasks=tuple(
                t
                for t in self.tasks
                if t in planned and (t not in done or done[t].seq <= self.since)
            ),
        )

    @property
    def carried(self) -> frozenset[str]:
        return frozenset(self.tasks)

    @property
    def reason(self) -> str:
        return f"{self.asked} (run #{self.run_id}) did not finish"

    def to_json(self) -> str:
        return json.dumps(
            {"run": self.run_id, "since": self.since, "tasks": self.tasks, "asked": self.asked}
        )

    @classmethod
    def from_json(cls, raw: str | None) -> Owed | None:
        """None for no record, or one this orch cannot read (a hand edit): nothing is carried."""
        if not raw:
            return None
        try:
            d = json.loads(raw)
            return cls(int(d["run"]), int(d["since"]), tuple(map(str, d["tasks"])), str(d["asked"]))
        except (ValueError, TypeError, KeyError, OverflowError):  # 1e999 as a run
            return None


# A task's findings as of a transition seq (None: now): store.findings_as_of.
FindingsAsOf = Callable[[str, "int | None"], Sequence[Any]]


class Freshness:
    """Which done tasks hold results built on inputs replaced since (module docstring): fed
    the store's done marks, then, as a run (or `orch plan`) goes, what it redoes and what it
    finds stale, in plan order. A need done again with the findings it had (a step redone
    after its compensation undid it, say) replaced nothing: `findings_as_of` tells."""

    def __init__(
        self, plan: Plan, done: Mapping[str, DoneMark], findings_as_of: FindingsAsOf
    ) -> None:
        self.plan, self.done, self.findings_as_of = plan, done, findings_as_of
        self.redone: set[str] = set()  # became done in this run, its findings recorded
        self.to_redo: set[str] = set()  # `orch plan`: will run, its findings not known yet
        self.lagging: dict[str, tuple[str, ...]] = {}  # done tasks found behind, and why
        self.unless: dict[str, list[str]] = {}  # `orch plan`: stale if these find otherwise
        self._now: dict[str, Sequence[Any]] = {}  # a need's findings now, read once

    def _found_now(self, task_id: str) -> Sequence[Any]:
        if task_id not in self._now:
            self._now[task_id] = self.findings_as_of(task_id, None)
        return self._now[task_id]

    def behind(self, task: PlannedTask) -> tuple[str, ...]:
        """Why a done `task` is behind the tasks it needs, if it is (remembered: what needs
        it is behind too). Asked of each done task once its needs were, in plan order."""
        mine = self.done.get(task.id)
        why = []
        for need in task.spec.needs:
            if need not in self.plan.by_id:
                continue
            if self.plan.by_id[need].cls.state_only and need not in _reads(task):
                continue  # needed for order: the host's state it left is the same again
            theirs = self.done.get(need)
            if need in self.lagging:
                why.append(f"{need} is stale")
            elif need in self.to_redo:
                self.unless.setdefault(task.id, []).append(need)
            elif mine is None or not (
                need in self.redone or (theirs is not None and theirs.seq > mine.seq)
            ):
                continue
            elif self._found_now(need) == self.findings_as_of(need, mine.seq):
                continue  # done again, finding what it found before: nothing changed for it
            elif need in self.redone:
                why.append(f"{need} is redone in this run, with other findings")
            elif theirs is not None:
                why.append(
                    f"{need} {theirs.status} again in run #{theirs.run_id}, "
                    f"after this ran in run #{mine.run_id}"
                )
        if why:
            self.lagging[task.id] = tuple(why)
        return tuple(why)


def _releasers(plan: Plan) -> dict[str, list[str]]:
    """Resource name -> the planned tasks that let it go: their kind's `releases` param, where
    the plan gives it literally (a `${...}` is known only when the task starts)."""
    out: dict[str, list[str]] = {}
    for task in plan.tasks:
        param = getattr(task.cls, "releases", None)
        value = task.spec.params.get(param) if param else None
        if isinstance(value, str) and "${" not in value:
            out.setdefault(value, []).append(task.id)
    return out


def _rerun_downstream(plan: Plan, root: str, holders: Mapping[str, str]) -> set[str]:
    """What `--rerun root` forces: root and its downstream, not past a releaser of a resource
    whose holder is root or upstream of root (module docstring)."""
    released = {t: name for name, ts in _releasers(plan).items() for t in ts}
    seen, stack = {root}, [root]
    while stack:
        task_id = stack.pop()
        holder = holders.get(released.get(task_id, ""))
        if holder in plan.by_id and root in plan.downstream(holder):
            continue  # the pair is re-run whole; what follows needs the releaser for order only
        for dep in plan.dependents[task_id]:
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


def _depends(plan: Plan, after: Mapping[str, set[str]], task_id: str, on: str) -> bool:
    """Whether `task_id` comes after `on`, through needs and `after` edges."""
    seen, stack = {task_id}, [task_id]
    while stack:
        current = stack.pop()
        if current == on:
            return True
        for up in [*plan.by_id[current].spec.needs, *after.get(current, ())]:
            if up not in seen:
                seen.add(up)
                stack.append(up)
    return False


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
    stale: tuple[str, ...] = ()  # what changed since a done task ran (kept, or run again)


def decide(
    task: PlannedTask,
    row: TodoRow | None,
    selection: Selection,
    statuses: Mapping[str, Status],
    freshness: Freshness | None = None,
) -> Decision:
    """What a run does with `task`, given the statuses its needs have reached in this run (and,
    with `freshness`, what became done when: a kept task behind its needs is stale)."""
    status = row["status"] if row is not None else Status.PENDING
    if task.id not in selection.scope:
        return Decision(Action.OUT_OF_SCOPE, "not selected")
    stale: tuple[str, ...] = ()
    if status.done:  # a forced one runs again, saying what it was behind on
        stale = freshness.behind(task) if freshness is not None else ()
        if row is not None and row["spec_hash"] != task.spec_hash:
            old = json.loads(row["spec"]) if row["spec"] else {}
            stale += tuple(what_changed(old, task.fingerprint) or ["the spec changed"])
    if status.done and task.id not in selection.forced:
        return Decision(Action.KEEP, f"{status}, but stale" if stale else str(status), stale)
    for need in task.spec.needs:
        need_status = statuses.get(need, Status.PENDING)
        if need_status.done:
            continue
        if need_status in (Status.FAILED, Status.BLOCKED, Status.INTERRUPTED):
            return Decision(Action.BLOCK, f"needs {need}, which is {need_status}")
        if need not in selection.scope:
            return Decision(
                Action.BLOCK, f"needs {need}, which is {need_status} and not selected to run"
            )
        return Decision(Action.WAIT, f"waits for {need}")
    if carried := selection.why_carried(task.id):
        return Decision(Action.RUN, carried, stale)
    return Decision(Action.RUN, f"was {status}" if status is not Status.PENDING else "", stale)


def _reads(task: PlannedTask) -> set[str]:
    """The tasks whose findings `task` reads (params, `when`, preconditions)."""
    values = [task.spec.params, task.spec.when, *(c.params for c in task.checks)]
    with contextlib.suppress(ValueError):
        return {ref.task for ref in iter_refs(values) if ref.task is not None}
    return set()


def asked(options: Any) -> str:
    """What a run's options asked to redo, as a later run names it (RunOptions, or alike)."""
    parts = [
        *([f"--rerun {','.join(options.rerun)}"] if options.rerun else []),
        *([f"--from {options.from_task}"] if options.from_task else []),
        *([f"--only {','.join(options.only)}"] if options.only else []),
    ]
    return " ".join(parts)


def owed_why(selection: Selection) -> str:
    return f"{selection.owed.reason} them" if selection.owed else ""
