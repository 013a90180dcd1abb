"""Runs a plan: for each ready task, when -> preconditions -> in_progress -> run -> record.

Every status change is committed (store.transition) before the side effect that follows it.
Tasks run one at a time today, but readiness comes from graphlib's get_ready/done protocol
and each task's state lives in the store, so a worker pool can replace the inner loop.
"""

from __future__ import annotations

import graphlib
import hashlib
import heapq
import json
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from orchestrator.core import redact
from orchestrator.core.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_WAITING,
    TaskError,
    TaskTimeout,
    TemplateError,
)
from orchestrator.core.findings import Finding, checked, summarize
from orchestrator.core.guards import GuardRole, due_because
from orchestrator.core.guards import note as guard_note
from orchestrator.core.status import RunOutcome, Status
from orchestrator.kinds import registry
from orchestrator.kinds.task import Context, PoolUnavailable
from orchestrator.plan.model import Plan, PlannedCheck, PlannedTask
from orchestrator.plan.templating import Ref, bash_params, evaluate_when, resolve
from orchestrator.plan.trust import choosing_code
from orchestrator.proc.containment import jail
from orchestrator.proc.procfs import INTERRUPTS, raise_in_thread, tail
from orchestrator.proc.stalls import MAX_RESTARTS, StallPolicy, StallReport, TaskStalled
from orchestrator.run import approvals, runlog
from orchestrator.run.approvals import approve_command
from orchestrator.run.confine import confine
from orchestrator.run.leases import LEASE_KIND, release_all
from orchestrator.run.selection import OWED_KEY, Action, Selection, asked, decide, owed_why
from orchestrator.run.stale import remember_stale
from orchestrator.run.todos import plan_as_run, todo_specs
from orchestrator.store.db import GuardChange, Store, runs_dir
from orchestrator.store.finished import DIGEST_KEY
from orchestrator.store.liveness import close_dead_runs, current_identity
from orchestrator.store.lock import RunLock

PROCESS_MARKER = "ORCH_TASK"  # env var: run:task:attempt@store, in every process a task starts
OUTPUT_TAIL_LINES = 20
NOT_HERE = "not on this host"  # a pool member asked for by id that the host does not have


@dataclass
class RunOptions:
    keep_going: bool = False
    rerun: Sequence[str] = ()
    from_task: str | None = None
    only: Sequence[str] = ()
    console_level: str = "info"
    argv: Sequence[str] = field(default_factory=lambda: sys.argv)
    plan_digest: str | None = None  # recorded when the run completes (see finished.py)
    jobs: int | None = None  # tasks at once; None: the plan's `jobs` (default 1)
    approve: Sequence[str] = ()  # approval gates approved for this run (recorded as such)
    rollback: bool = False  # run the armed compensations and `finally` tasks, nothing else


@dataclass
class RunResult:
    run_id: int | None  # None: nothing to do, no run recorded (nothing_to_undo)
    outcome: RunOutcome  # completed | failed | waiting | interrupted
    exit_code: int
    stale: dict[str, tuple[str, ...]]


def execute(plan: Plan, store_path: Path, options: RunOptions) -> RunResult:
    """Run `plan` against the store at `store_path`; the whole life of one `orch run`."""
    store_path = store_path.absolute()  # tasks run from the plan's folder (from_folder)
    store = Store.open(store_path)
    try:  # the tasks an agent or `orch todo add` put in the store run like declared ones
        plan = plan_as_run(plan, store)
        selection = Selection.of(plan, options.rerun, options.from_task, options.only)
        if options.only:
            selection.check_only(plan, {r["id"]: Status(r["status"]) for r in store.todos()})
    except BaseException:
        store.close()
        raise
    lock = RunLock(store_path)
    events = None
    try:
        who = current_identity()
        redact.register(plan.vars[name] for name in plan.secrets)  # before anything is written
        lock.acquire(
            {"pid": who.pid, "host": who.host, "argv": redact.mask(shlex.join(options.argv))}
        )
        store.bind_plan(plan.name)
        dead = close_dead_runs(store, holding_lock=True)
        if options.rollback and not store.armed() and not store.held():
            return nothing_to_undo(store, plan, options, dead)
        run_id = store.next_run_id()
        log_dir = runs_dir(store_path) / str(run_id)
        log_dir.mkdir(parents=True, exist_ok=True)
        events = runlog.configure(log_dir / "events.jsonl", options.console_level)
        run_id = store.begin_run(who, str(plan.file), shlex.join(options.argv), log_dir)
        lock.note_run(run_id)
        log = structlog.get_logger().bind(run=run_id)
        for why in dead:
            log.warning("recovered", why=why)
        release_all(store, log, "left running by an earlier run")
        store.set_meta(DIGEST_KEY, None)
        store.sync_plan(todo_specs(plan), run_id)
        runner = Runner(
            plan, store, run_id, log_dir, selection, options, log, store_tag(store_path)
        )
        try:
            with from_folder(runner.home):
                result = runner.run()
        finally:  # whatever the outcome, nothing the plan started outlives the run
            release_all(store, log, f"at the end of run #{run_id}")
        with from_folder(runner.home):  # after release_all: a server it left holds no GPUs now
            result = runner.wind_up(result)
        remember_stale(store, plan, options.plan_digest)  # for `orch status PLAN` (snapshot.py)
        # Only a run that looked at every task can vouch that none is stale (finished.py).
        whole_plan = not (options.only or options.from_task)
        if result.outcome == RunOutcome.COMPLETED and not result.stale and whole_plan:
            store.set_meta(DIGEST_KEY, options.plan_digest)
        return result
    finally:
        lock.release()
        store.close()
        if events is not None:
            events.close()


def nothing_to_undo(store: Store, plan: Plan, options: RunOptions, dead: list[str]) -> RunResult:
    """`orch rollback` with nothing armed and nothing left running: no run is recorded (the
    board's header stays the last real run's, or `never run`); the plan's tasks are on the
    board all the same. Said on the console, live board or not: it draws nothing this fast."""
    store.sync_plan(todo_specs(plan), None)
    level = min(options.console_level, "warning", key=lambda name: runlog.LEVELS[name])
    runlog.configure(None, level)
    log = structlog.get_logger()
    for why in dead:
        log.warning("recovered", why=why)
    log.warning("rollback.nothing", why="nothing is armed: nothing to undo")
    return RunResult(None, RunOutcome.COMPLETED, EXIT_OK, {})


class Runner:
    def __init__(
        self,
        plan: Plan,
        store: Store,
        run_id: int,
        log_dir: Path,
        selection: Selection,
        options: RunOptions,
        log: Any,
        tag: str = "",
    ) -> None:
        self.plan, self.store, self.run_id, self.log_dir = plan, store, run_id, log_dir
        self.home = plan.file.absolute().parent  # where the plan's relative paths start
        self.tag = tag  # tells this store's task markers from another store's
        self.selection, self.options, self.log = selection, options, log
        self.read_todos()
        # What an earlier run was asked to redo and did not; then resolved again knowing who
        # held what: the rerun's cut, revived holders, their releasers.
        self.selection, revived, self.freshness = selection.knowing(plan, store, self.statuses)
        for task_id, why in revived.items():
            log.info("task.revived", task=task_id, why=why)
        if carried := sorted(self.selection.carried):
            log.warning("run.carried", tasks=", ".join(carried), why=owed_why(self.selection))
        if not options.rollback:  # a rollback redoes nothing: what is owed stays owed
            now_owed = self.selection.owing(run_id, store.last_transition(), asked(options))
            store.set_meta(OWED_KEY, now_owed.to_json() if now_owed else None)
        self.stopped_by: str | None = None  # the failure after which nothing new starts
        self.stale: dict[str, tuple[str, ...]] = {}
        self.started = 0  # tasks this run started (0: nothing to do, all was done)
        self.jobs = options.jobs or plan.jobs
        self.threads: dict[str, int] = {}  # task id -> the thread running it (--jobs)
        self.leased: dict[tuple[str, str], str] = {}  # (pool, member) -> the task holding it
        self.waiting: dict[str, str] = {}  # task id -> the waiting reason last written
        self.gates: list[str] = []  # approval gates this run stopped at
        self.finally_armed = False  # the plan's `finally` tasks, armed by the first start
        self.mended = True  # what earlier runs left due was undone (mend_first)
        self.lease_lock = threading.Lock()
        # Tasks started together that lease from a pool, in plan order, until their first try:
        # threads reach lease() in any order, the earlier task must choose its members first.
        self.lease_turns: list[str] = []

    def run(self) -> RunResult:
        after = self.selection.after  # a revived holder's releasers come after its users
        sorter = graphlib.TopologicalSorter(
            {t.id: [*t.spec.needs, *after.get(t.id, ())] for t in self.plan.tasks}
        )
        sorter.prepare()
        ready: list[tuple[int, str]] = []  # among ready tasks, the plan's order decides

        def push(task_ids: tuple[str, ...]) -> None:
            for task_id in task_ids:
                heapq.heappush(ready, (self.plan.by_id[task_id].position, task_id))

        try:
            self.mended = mended = self.mend_first()
            if mended and not self.options.rollback:
                push(sorter.get_ready())
                if self.jobs > 1:
                    self.run_parallel(ready, sorter, push)
                while ready:
                    _, task_id = heapq.heappop(ready)
                    self.visit(self.plan.by_id[task_id])
                    sorter.done(task_id)
                    push(sorter.get_ready())
                self.store.flush()  # the last completion: servers may be ended next
        except KeyboardInterrupt as exc:
            # Wherever the interrupt landed (even between two commits), close the run and its
            # tasks together; a second Ctrl-C is held back until that is committed.
            held = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
            try:
                self.store.close_run(
                    self.run_id, RunOutcome.INTERRUPTED, f"stopped by {_signal_name(exc)}"
                )
                self.not_started(f"the run was stopped by {_signal_name(exc)}")
                self.log.error("run.interrupted", by=_signal_name(exc))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        if self.options.rollback:
            return self.result(RunOutcome.COMPLETED)
        if not mended:
            self.not_started("a compensation or finally task did not complete")
            return self.result(RunOutcome.FAILED)
        in_scope = [self.statuses[i] for i in self.selection.scope]
        outcome = RunOutcome.COMPLETED if all(s.done for s in in_scope) else RunOutcome.FAILED
        if self.gates and not {Status.FAILED, Status.BLOCKED, Status.INTERRUPTED} & set(in_scope):
            outcome = RunOutcome.WAITING
            self.log.warning(
                "run.waiting",
                gates=", ".join(self.gates),
                hint=f"{self.approve_command(self.gates[0])}, then run again",
            )
        waiting = [i for i in self.selection.scope if self.statuses[i] is Status.PENDING]
        if self.stopped_by and waiting:
            self.log.warning(
                "run.stopped",
                after=self.stopped_by,
                not_started=len(waiting),
                hint="--keep-going runs what does not depend on the failure",
            )
        if self.stopped_by:
            how = "was blocked" if self.statuses[self.stopped_by] is Status.BLOCKED else "failed"
            self.not_started(f"the run stopped after {self.stopped_by} {how}")
        elif self.gates:
            self.not_started(f"the run waits for approval of {', '.join(self.gates)}")
        return self.result(outcome)

    def not_started(self, why: str) -> None:
        """As the run ends (before its compensations and `finally` tasks): the steps in scope it
        left pending say why now; a wait it noted, or an earlier run's reason, is over."""
        if self.options.rollback:  # runs no step: theirs are what the rollback made them
            return
        pending = [i for i in self.selection.scope if self.statuses[i] is Status.PENDING]
        self.store.note_not_started(sorted(pending), f"not started: {why}")

    def read_todos(self) -> None:
        """The store's rows and statuses, as the run starts (or after compensations)."""
        self.rows = {r["id"]: r for r in self.store.todos()}
        self.statuses = {task_id: Status(r["status"]) for task_id, r in self.rows.items()}

    def result(self, outcome: RunOutcome) -> RunResult:
        code = {RunOutcome.COMPLETED: EXIT_OK, RunOutcome.WAITING: EXIT_WAITING}.get(
            outcome, EXIT_FAILED
        )
        return RunResult(self.run_id, outcome, code, self.stale)

    # --- compensations and `finally` tasks -----------------------------------------------------

    def mend_first(self) -> bool:
        """Before anything else: what an earlier run left due (it failed, was stopped or
        killed after arming them) runs now; `orch rollback` runs all that is armed. False if
        one of them did not complete: the host is not as the plan expects, so nothing runs."""
        due = self.store.armed() if self.options.rollback else self.store.due()
        if not due:
            if self.options.rollback:
                self.log.warning("rollback.nothing", why="nothing is armed: nothing to undo")
            return True
        self.log.warning(
            "run.compensating",
            tasks=", ".join(r["id"] for r in due),
            why="orch rollback"
            if self.options.rollback
            else due_because(r["armed_run"] for r in due),
        )
        for task in self.plan.tasks:  # what the failed run left running goes first
            self.end_leftovers(task)
        ok = self.compensate(due)
        self.read_todos()  # what they undid is pending again: the plan's steps must see it so
        if not ok:
            self.log.error(
                "run.stopped",
                why="a compensation or finally task did not complete; the plan's steps did not run",
                hint=f"orch status {self.plan.file}; fix it, then orch run or orch rollback",
            )
        return ok

    def compensate(self, rows: Sequence[Any]) -> bool:
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
            self.perform(guard)
        return all(self.statuses[g.id].done for g in ordered)

    def wind_up(self, result: RunResult) -> RunResult:
        """After the plan's steps (and after the servers they left were ended): the armed
        compensations if the run failed, the `finally` tasks whatever happened; a completed
        plan disarms its compensations. Then the run's end is recorded."""
        outcome = result.outcome
        if self.options.rollback or not self.mended:
            armed = []  # what was armed has had its one try in this run
        elif outcome == RunOutcome.FAILED:
            armed = self.store.armed()
        else:
            armed = [r for r in self.store.armed() if r["role"] == GuardRole.FINALLY]
        if armed and not self.compensate(armed):
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
        self.log.info("run.finished", outcome=outcome, tasks_started=self.started)
        return self.result(outcome)

    def guard_change(self, task: PlannedTask, to: Status) -> GuardChange | None:
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

    def run_parallel(
        self,
        ready: list[tuple[int, str]],
        sorter: graphlib.TopologicalSorter[str],
        push: Callable[[tuple[str, ...]], None],
    ) -> None:
        """Up to `jobs` tasks at once, each in a thread of its own, started in plan order among
        the ready; one whose resources are held waits (its reason on the board says for what)
        while later ready ones that fit go first. Each thread commits its task's transitions
        before their side effects, as one task alone does; a failure still stops new starts."""
        running: dict[Future[None], PlannedTask] = {}
        held: Counter[str] = Counter()
        pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="orch-task")
        try:
            while ready or running:
                waiting = []
                while ready and len(running) < self.jobs:
                    item = heapq.heappop(ready)
                    task = self.plan.by_id[item[1]]
                    want = self.units(task)
                    if short := [
                        n for n, u in want.items() if held[n] + u > self.plan.resources[n]
                    ]:
                        waiting.append(item)
                        self.wait_for(task, short, held, running.values())
                        continue
                    held.update(want)
                    if self.waiting.pop(task.id, None) is not None:  # its wait is over
                        self.store.note_reason(task.id, None)
                    if any(n not in self.plan.resources for n in task.spec.resources):
                        with self.lease_lock:
                            self.lease_turns.append(task.id)
                    running[pool.submit(self.visit_in_thread, task)] = task
                for item in waiting:
                    heapq.heappush(ready, item)
                if not running:
                    return  # what is left waits on nothing that could end: not reached
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    task = running.pop(future)
                    held.subtract(self.units(task))
                    future.result()  # a bug or a storage fault in a task thread ends the run
                    sorter.done(task.id)
                    push(sorter.get_ready())
        except BaseException:
            self.stop_threads(running)
            raise
        finally:
            pool.shutdown(wait=True)

    def units(self, task: PlannedTask) -> dict[str, int]:
        """The plan's named resources the task holds (pools are leased by id: lease())."""
        return {
            n: u
            for n, u in task.spec.resources.items()
            if n in self.plan.resources and isinstance(u, int)  # validated: plan names are units
        }

    def lease(self, task: PlannedTask) -> dict[str, list[str]]:
        """Members of the pools the task holds (`gpus: 2`): free now by the pool's look and
        not leased to another task of this run; recorded in the store (`lease` resources, so
        a dead run's are released by the next) before the task starts. Until they are free
        the task waits, its reason saying for what, up to its timeout."""
        wanted = {n: v for n, v in task.spec.resources.items() if n not in self.plan.resources}
        if not wanted:
            return {}
        self.store.flush()  # the lease may wait
        deadline = None if task.spec.timeout is None else time.monotonic() + task.spec.timeout
        shown = None
        while True:
            with self.lease_lock:
                if turn := task.id not in self.lease_turns[1:]:  # first in line, or not in it
                    self.take_turn(task.id)
            if not turn:
                time.sleep(0.005)
                continue
            with self.lease_lock:
                granted, why = self.try_lease(wanted)
                if never := [w for w in why if NOT_HERE in w]:
                    raise TaskError("; ".join(never))
                if not why:
                    for name, ids in granted.items():
                        for member in ids:
                            self.leased[(name, member)] = task.id
                            data = {"pool": name, "member": member}
                            self.store.hold(
                                f"{name}:{member}", task.id, LEASE_KIND, self.run_id, data
                            )
                    self.log.info(
                        "task.leased", task=task.id, **{n: ",".join(i) for n, i in granted.items()}
                    )
                    return granted
            text = "waiting for " + "; ".join(why)
            if text != shown:
                self.store.note_reason(task.id, text)
                self.log.info("task.waiting", task=task.id, why=text)
                shown = text
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeout(f"timed out {text}")
            nap(min(registry.resolve(n, registry.POOL_GROUP).every for n in wanted))

    def try_lease(
        self, wanted: dict[str, int | list[int | str]]
    ) -> tuple[dict[str, list[str]], list[str]]:
        granted: dict[str, list[str]] = {}
        why: list[str] = []
        for name, want in wanted.items():
            try:
                members = registry.resolve(name, registry.POOL_GROUP)().look()
            except PoolUnavailable as exc:
                why.append(f"{name}: {exc}")
                continue
            free = [
                m for m, busy in members.items() if busy is None and (name, m) not in self.leased
            ]
            if isinstance(want, int):
                if len(free) >= want:
                    granted[name] = free[:want]
                else:
                    taken = [
                        f"{m} ({members[m] or 'leased to ' + self.leased[(name, m)]})"
                        for m in members
                        if m not in free
                    ]
                    why.append(
                        f"{want} {name} ({len(free)} free of {len(members)}: {'; '.join(taken)})"
                    )
                continue
            asked = [str(m) for m in want]
            if unknown := [m for m in asked if m not in members]:
                why.append(
                    f"{name} {', '.join(unknown)}: {NOT_HERE} "
                    f"(it has {', '.join(members) or 'none'})"
                )
            elif held := [m for m in asked if m not in free]:
                why.append(
                    f"{name} "
                    + "; ".join(
                        f"{m}: {members[m] or 'leased to ' + self.leased[(name, m)]}" for m in held
                    )
                )
            else:
                granted[name] = asked
        return granted, why

    def unlease(self, task: PlannedTask, granted: dict[str, list[str]]) -> None:
        with self.lease_lock:
            for name, ids in granted.items():
                for member in ids:
                    self.leased.pop((name, member), None)
                    self.store.release(f"{name}:{member}", task.id, f"{task.id} ended")

    def visit_in_thread(self, task: PlannedTask) -> None:
        self.threads[task.id] = threading.get_ident()
        try:
            self.visit(task)
        finally:
            del self.threads[task.id]
            with self.lease_lock:  # it ended before its lease (skipped, blocked, interrupted)
                self.take_turn(task.id)

    def take_turn(self, task_id: str) -> None:
        if task_id in self.lease_turns:
            self.lease_turns.remove(task_id)

    def wait_for(
        self, task: PlannedTask, short: list[str], held: Counter[str], running: Any
    ) -> None:
        """Say on the board what a ready task waits for (once per change)."""
        holders = [t.id for t in running if set(t.spec.resources) & set(short)]
        why = (
            "waiting for "
            + ", ".join(f"{n} ({held[n]} of {self.plan.resources[n]} held)" for n in short)
            + (f" by {', '.join(holders)}" if holders else "")
        )
        if self.waiting.get(task.id) != why:  # written once per change, not every look
            self.waiting[task.id] = why
            self.store.note_reason(task.id, why)

    def stop_threads(self, running: dict[Future[None], PlannedTask]) -> None:
        """Ctrl-C (or a failure of the run itself) while tasks run in threads: each gets the
        interrupt the main thread got, ends its processes and records itself interrupted, as a
        task alone does; then the run ends. A second Ctrl-C meanwhile is passed on too."""
        while running:
            for tid in list(self.threads.values()):
                raise_in_thread(tid, KeyboardInterrupt)
            try:
                done, _ = wait(running, timeout=0.5)
            except KeyboardInterrupt:
                continue
            for future in done:
                running.pop(future)

    # --- one task ------------------------------------------------------------------------------

    def visit(self, task: PlannedTask) -> None:
        decision = decide(
            task, self.rows.get(task.id), self.selection, self.statuses, self.freshness
        )
        if decision.action is Action.KEEP:
            if decision.stale:
                self.stale[task.id] = decision.stale
                self.log.warning(
                    "task.stale",
                    task=task.id,
                    changed="; ".join(decision.stale),
                    hint=f"orch run --rerun {task.id}",
                )
            return
        if decision.action in (Action.OUT_OF_SCOPE, Action.WAIT):
            return
        if decision.action is Action.BLOCK:
            return self.settle(task, Status.BLOCKED, decision.reason)
        if self.stopped_by is not None or self.gates:
            return  # fail fast (or a gate waits): nothing new starts; the task stays as it was
        self.perform(task)
        if self.statuses[task.id] in (Status.FAILED, Status.BLOCKED):
            self.stop_after(task)

    def perform(self, task: PlannedTask) -> None:
        """when -> preconditions -> approval -> lease -> attempts; the outcome is recorded."""
        # Before anything looks at the host: a dead run's leftover would fail port.free etc.
        self.end_leftovers(task)
        approval = resolved = None
        try:
            if not evaluate_when(task.spec.when, self.lookup):
                return self.settle(task, Status.SKIPPED, f"when {task.spec.when!r} is false")
            problem = self.check_preconditions(task)
            if problem is None and task.spec.kind == approvals.GATE_KIND:
                if (passed := self.approval(task)) is None:
                    return
                approval, resolved = passed
        except TemplateError as exc:
            return self.settle(task, Status.FAILED, str(exc), last_error=str(exc))
        if problem is not None:
            return self.settle(task, Status.BLOCKED, problem, last_error=problem)
        try:
            granted = self.lease(task)
        except TaskError as exc:  # timed out waiting, or asks for what the host has not
            return self.settle(task, Status.FAILED, str(exc), last_error=str(exc))
        try:
            for attempt in range(1, task.spec.retries.attempts + 1):
                if self.attempt(task, attempt, granted, approval, resolved=resolved):
                    return
                if attempt < task.spec.retries.attempts:
                    self.log.info(
                        "task.retry",
                        task=task.id,
                        attempt=attempt + 1,
                        delay=task.spec.retries.delay,
                    )
                    nap(task.spec.retries.delay)
        finally:
            self.unlease(task, granted)

    def approval(self, task: PlannedTask) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The approval that lets this gate pass now (one given with --approve is recorded
        first) and the gate's params, resolved (its attempts take them as they are); None
        after recording the gate as waiting, saying for what."""
        params = self.resolve_params(task.cls, task.spec.params)  # a missing finding fails it
        plan_digest, seen = approvals.hashes(self.plan, task.id, self.store)
        verdict = approvals.judge(self.store.latest_approval(task.id), plan_digest, seen)
        if verdict.approval is None and task.id in self.options.approve:
            how = "orch run --approve"
            self.store.approve(task.id, approvals.who(), None, plan_digest, seen, how, self.run_id)
            verdict = approvals.judge(self.store.latest_approval(task.id), plan_digest, seen)
        if verdict.approval is not None:
            return dict(verdict.approval), params
        shown = ", ".join(f"{k}={v}" for k, v in params.get("show", {}).items())
        why = f"approve: {params.get('message', '')}" + (f" ({shown})" if shown else "")
        if verdict.void:
            why += f"; {verdict.void}"
        self.settle(task, Status.WAITING, f"{why} · {self.approve_command(task.id)}")
        self.gates.append(task.id)
        return None

    def approve_command(self, gate: str) -> str:
        """What a person types to approve `gate` for this run (its plan file and vars)."""
        argv = redact.mask(shlex.join(self.options.argv))
        return approve_command(gate, str(self.plan.file), argv)

    def attempt(
        self,
        task: PlannedTask,
        attempt: int,
        granted: dict[str, list[str]] | None = None,
        approval: dict[str, Any] | None = None,
        restarts: int = 0,
        resolved: dict[str, Any] | None = None,
    ) -> bool:
        """One try; True if it completed. A stall with `on_stall: restart` runs it again, up
        to MAX_RESTARTS times (`restarts` so far), without using one of its retries. `resolved`:
        the params already resolved (a gate's when it was judged, or those of the attempt a
        stall restarts): they come from vars and upstream findings, which cannot change
        meanwhile."""
        findings: list[Finding] = []
        log_path = self.log_dir / f"{task.id}.log"
        try:
            if resolved is None:
                resolved = self.resolve_params(task.cls, task.spec.params)
            params = task.cls.Params.model_validate(resolved)
        except Exception as exc:  # TemplateError, or a finding of the wrong type
            self.settle(task, Status.FAILED, f"params: {exc}", last_error=f"params: {exc}")
            return False
        started = time.time()
        number = self.store.transition(
            task.id,
            Status.IN_PROGRESS,
            # this run's tries of its `retries`; the JSON's `attempt` counts every run's
            f"try {attempt} of {task.spec.retries.attempts} in this run",
            self.run_id,
            spec_hash=task.spec_hash,
            spec=task.spec_json,
            guards=self.guard_change(task, Status.IN_PROGRESS),
            started_at=started,
            ended_at=None,
            last_error=None,
            output_tail=None,
            log_path=str(log_path),
            pgid=None,
            pgid_started_at=None,
        )
        self.statuses[task.id] = Status.IN_PROGRESS
        self.started += 1
        self.log.info("task.started", task=task.id, title=task.title)
        timeout = task.spec.timeout
        ctx = Context(
            task.id,
            number,
            self.run_id,
            log_path,
            None if timeout is None else time.monotonic() + timeout,
            _Sink(self, task.id, findings),
            {
                **{
                    k: v
                    for name, ids in (granted or {}).items()
                    for k, v in registry.resolve(name, registry.POOL_GROUP)().env(ids).items()
                },
                PROCESS_MARKER: self.marker(self.run_id, task.id, number),
            },
            approval,
            stall_policy(task),
            timeout,
        )
        try:
            task.cls(params).run(ctx)
        except KeyboardInterrupt as exc:
            self.settle(
                task,
                Status.INTERRUPTED,
                f"stopped by {_signal_name(exc)}",
                findings,
                ended_at=time.time(),
            )
            raise
        except TaskStalled as exc:
            if exc.restart and restarts < MAX_RESTARTS:
                self.settle(task, Status.FAILED, str(exc), findings, retrying=True)
                self.log.warning("task.restarting", task=task.id, restart=restarts + 1)
                return self.attempt(task, attempt, granted, approval, restarts + 1, resolved)
            error = str(exc) + (f" (restarted {restarts} times)" if exc.restart else "")
        except TaskError as exc:
            error = str(exc)
        except Exception as exc:  # a bug in a task class fails the task, not the run
            error = f"{type(exc).__name__}: {exc}"
            with log_path.open("a") as f:
                f.write(redact.mask(traceback.format_exc()))
        else:
            duration = time.time() - started
            # Run alone, a completion is committed with what comes next (its successor's
            # start, most often): one commit instead of two, and nothing outside this process
            # happens in between (host checks, leases and leftovers flush it first).
            hold = self.jobs == 1
            self.settle(task, Status.COMPLETED, None, findings, hold=hold, ended_at=time.time())
            # Findings as one field: a finding named `task` must not collide with the event's.
            found = {"findings": text} if (text := summarize(findings)) else {}
            self.log.info("task.completed", task=task.id, took=f"{duration:.2f}s", **found)
            return True
        output = "\n".join(tail(log_path, OUTPUT_TAIL_LINES))
        self.settle(
            task,
            Status.FAILED,
            error,
            findings,
            last_error=error,
            output_tail=output or None,
            ended_at=time.time(),
            retrying=attempt < task.spec.retries.attempts,
        )
        return False

    def settle(
        self,
        task: PlannedTask,
        to: Status,
        reason: str | None,
        findings: Sequence[Finding] = (),
        retrying: bool = False,
        hold: bool = False,
        **fields: Any,
    ) -> None:
        """Record a task's new status (committed; with `hold`, by the next write), and react:
        log it, stop after a failure. A failed attempt that will be retried is a warning, not
        yet the task's failure."""
        guards = self.guard_change(task, to)
        self.store.transition(task.id, to, reason, self.run_id, findings, guards, hold, **fields)
        self.statuses[task.id] = to
        if to.done:
            self.freshness.redone.add(task.id)
        if to is Status.COMPLETED or to is Status.INTERRUPTED:
            return
        if retrying:
            self.log.warning("task.attempt_failed", task=task.id, why=reason)
            return
        event = {
            Status.SKIPPED: "task.skipped",
            Status.BLOCKED: "task.blocked",
            Status.FAILED: "task.failed",
            Status.WAITING: "task.waiting_approval",
        }[to]
        # The root cause is an error; a task blocked by it is a consequence, a warning.
        level = {Status.SKIPPED: "info", Status.FAILED: "error"}.get(
            to, "error" if fields.get("last_error") else "warning"
        )
        getattr(self.log, level)(event, task=task.id, why=reason)
        if to is Status.BLOCKED:  # a failure stops the run only after its last attempt (visit)
            self.stop_after(task)

    def stop_after(self, task: PlannedTask) -> None:
        """Fail fast: after this task's failure nothing new starts (unless --keep-going)."""
        if not self.options.keep_going:
            self.stopped_by = self.stopped_by or task.id

    # --- helpers -------------------------------------------------------------------------------

    def lookup(self, ref: Ref) -> Any:
        """The value of a ${...} reference, now."""
        if ref.task is None:
            return self.plan.vars[ref.name]
        found = self.store.finding(ref.task, ref.name)
        if found is None:
            have = ", ".join(sorted(f.key for f in self.store.findings().get(ref.task, [])))
            raise TemplateError(
                f"${{{ref}}}: task {ref.task!r} recorded no finding "
                f"{ref.name!r} (it has: {have or 'none'})"
            )
        return found.value

    def resolve_params(self, cls: type[Any], params: dict[str, Any]) -> dict[str, Any]:
        """Params with their ${...} resolved; TemplateError where a value would reach bash as
        more than an inert word, or a path built from a finding leaves its folder."""
        if chosen := choosing_code(cls, params):  # a task added through the store too
            raise TemplateError("; ".join(f"param {key!r}: {why}" for key, why in chosen))
        shell = bash_params(cls, params)  # argv items and their env are passed as they are
        resolved = {}
        for k, v in params.items():
            try:
                resolved[k] = resolve(v, self.lookup, shell=k in shell)
            except TemplateError as exc:
                raise TemplateError(f"param {k!r}: {exc}") from None
        for k in cls.path_params & params.keys():
            confine(k, params[k], resolved[k], (self.home, self.log_dir.parent), self.lookup)
        return resolved

    def check_preconditions(self, task: PlannedTask) -> str | None:
        """None if every precondition holds (waiting where asked), else what was found."""
        if task.checks:
            self.store.flush()  # a check looks at the host, and may wait
        for check in task.checks:
            if (problem := self.check_one(task, check)) is not None:
                return problem
        return None

    def check_one(self, task: PlannedTask, check: PlannedCheck) -> str | None:
        try:
            params = check.cls.Params.model_validate(self.resolve_params(check.cls, check.params))
        except TemplateError:
            raise
        except Exception as exc:
            return f"precondition {check.kind}: {exc}"
        probe = check.cls(params)
        started = time.monotonic()
        deadline = started + (check.wait or 0.0)
        next_note = started + 10.0
        while True:
            try:
                result = probe.check()
            except Exception as exc:  # a bug in a check blocks its task, not the whole run
                return f"precondition {check.kind} crashed: {type(exc).__name__}: {exc}"
            if result.ok:
                return None
            now = time.monotonic()
            if now >= deadline:
                waited = f" after waiting {now - started:.0f}s" if check.wait else ""
                return f"precondition {check.kind} failed{waited}: {result.found}"
            if now >= next_note:
                self.log.info(
                    "task.waiting",
                    task=task.id,
                    check=check.kind,
                    waited=f"{now - started:.0f}s",
                    found=result.found,
                )
                next_note = now + 10.0
            nap(min(check.every, max(deadline - now, 0.0)))

    def marker(self, run_id: int, task_id: str, attempt: int) -> str:
        return f"{run_id}:{task_id}:{attempt}@{self.tag}"

    def end_leftovers(self, task: PlannedTask) -> None:
        """End what a dead run's attempt of this task left running, before running it again.

        Found by the attempt's marker alone (its cgroup or scope is named from it, and every
        process carries it): it was committed before the spawn, so there is no moment of a kill
        after which the processes are unrecorded. The recorded pgid is not needed."""
        row = self.rows.get(task.id)
        if row is None or row["run_id"] is None or row["status"] == Status.COMPLETED:
            return
        marker = (PROCESS_MARKER, self.marker(row["run_id"], task.id, row["attempts"]))
        self.store.flush()
        ended = jail(marker).end(grace=10.0)
        if ended:
            self.log.warning(
                "task.leftovers_ended",
                task=task.id,
                pids=ended,
                why="left running by an interrupted run",
            )


class _Sink:
    """Context -> executor: findings are kept for the completion commit; pgids go to the store."""

    def __init__(self, runner: Runner, task_id: str, findings: list[Finding]) -> None:
        self.runner, self.task_id, self.findings = runner, task_id, findings

    def finding(self, finding: Finding) -> None:
        self.findings.append(checked(finding))

    def process_started(self, pgid: int, started_at: float) -> None:
        self.runner.store.set_process(self.task_id, pgid, started_at)

    def progress(self, message: str) -> None:
        self.runner.log.info("task.progress", task=self.task_id, msg=message)

    def hold(self, name: str, data: dict[str, Any]) -> None:
        kind = self.runner.plan.by_id[self.task_id].spec.kind
        self.runner.store.hold(name, self.task_id, kind, self.runner.run_id, data)

    def held(self, name: str) -> dict[str, Any] | None:
        rows = self.runner.store.held(name)
        return json.loads(rows[0]["data"]) if rows else None

    def release(self, name: str) -> None:
        self.runner.store.release(name, self.task_id, f"by task {self.task_id}")

    def stalled(self, report: StallReport) -> None:
        finding = Finding("stalled", round(report.idle, 1), "s", report.summary)
        self.runner.store.finding_now(self.task_id, checked(finding), self.runner.run_id)
        self.runner.log.warning(
            "task.stalled",
            task=self.task_id,
            idle=f"{report.idle:.0f}s",
            why=report.summary,
            evidence=str(report.evidence),
            then=report.action,
        )


def stall_policy(task: PlannedTask) -> StallPolicy | None:
    """The task's `stall_after` and `on_stall` (the plan's defaults filled in at load)."""
    after = task.spec.stall_after
    return None if after is None else StallPolicy(after, task.spec.on_stall or "wait")


@contextmanager
def from_folder(home: Path) -> Iterator[None]:
    """Run the tasks from the plan's folder, wherever orch was started (as go-task runs a
    Taskfile's tasks from its folder): shell commands and preconditions, relative params
    (cwd, output, dataset, ...), and `module:function` imports all start there."""
    before = os.getcwd()
    os.chdir(home)
    try:
        with registry.search(home):
            yield
    finally:
        os.chdir(before)


def store_tag(store_path: Path) -> str:
    """A short digest of the store's real path: markers of two plans' stores never match."""
    return hashlib.sha256(str(store_path.resolve()).encode()).hexdigest()[:12]


def nap(seconds: float) -> None:
    """Sleep in slices: a task thread takes an interrupt only between two bytecodes."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def _signal_name(exc: BaseException) -> str:
    return getattr(exc, "signal_name", "Ctrl-C")
