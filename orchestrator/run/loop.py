"""Runs a plan: ready tasks in the plan's order, each when -> preconditions -> in_progress ->
run -> record; up to `jobs` of them at once (`--jobs N`, or the plan's `jobs`), each in a
thread of its own.

execute() is the whole life of one `orch run`: the store opened and locked, dead runs closed,
the run begun, the Runner built with its collaborators and run, what the plan left running
released, the compensations and `finally` tasks due run, the run's end recorded. Readiness
comes from graphlib's get_ready/done protocol, and each task's state lives in the store: every
status change is committed (store.transition) before the side effect that follows it, from
whichever thread runs the task. One task's life is attempt.py's; what tasks hold, leases.py's;
their params and preconditions, checks.py's; compensations and `finally` tasks, mending.py's.
"""

from __future__ import annotations

import graphlib
import hashlib
import heapq
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from orchestrator.core import redact
from orchestrator.core.errors import EXIT_FAILED, EXIT_OK, EXIT_WAITING
from orchestrator.core.safeopen import ensure_private_dir
from orchestrator.core.status import RunOutcome, Status
from orchestrator.kinds import registry
from orchestrator.plan.model import Plan, PlannedTask
from orchestrator.proc.interrupts import hold_interrupts, raise_in_thread
from orchestrator.run import runlog
from orchestrator.run.attempt import PROCESS_MARKER as PROCESS_MARKER  # importable from here
from orchestrator.run.attempt import Attempts, Tally, read_todos, signal_name
from orchestrator.run.checks import Checks
from orchestrator.run.leases import Leases, release_all
from orchestrator.run.mending import Mending
from orchestrator.run.selection import OWED_KEY, Action, Selection, asked, decide, owed_why
from orchestrator.run.stale import remember_stale
from orchestrator.run.todos import plan_as_run, todo_specs
from orchestrator.store.db import Store, runs_dir
from orchestrator.store.finished import DIGEST_KEY
from orchestrator.store.liveness import close_dead_runs, current_identity
from orchestrator.store.lock import RunLock


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
    # with rollback: also undo what a completed plan did (its steps' compensations, disarmed
    # when it completed, are armed again first)
    undo_completed: bool = False


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
        redact.register(plan.secret_values)  # before anything is written
        lock.acquire(
            {"pid": who.pid, "host": who.host, "argv": redact.mask(shlex.join(options.argv))}
        )
        store.bind_plan(plan.name)
        dead = close_dead_runs(store, holding_lock=True)
        rearm = undone_steps_guards(plan, store) if options.undo_completed else []
        if options.rollback and not store.armed() and not store.held() and not rearm:
            return nothing_to_undo(store, plan, options, dead)
        run_id = store.next_run_id()
        log_dir = runs_dir(store_path) / str(run_id)
        # Run ids start again at 1 with a new store, and a clone may ship this folder: a
        # link in it, where the tasks' logs go by name, is refused before anything runs.
        ensure_private_dir(log_dir, no_links_inside=True)
        events = runlog.configure(log_dir / "events.jsonl", options.console_level)
        run_id = store.begin_run(who, str(plan.file), shlex.join(options.argv), log_dir)
        lock.note_run(run_id)
        log = structlog.get_logger().bind(run=run_id)
        for why in dead:
            log.warning("recovered", why=why)
        release_all(store, log, "left running by an earlier run")
        store.set_meta(DIGEST_KEY, None)
        store.sync_plan(todo_specs(plan), run_id)
        if rearm:
            store.arm(rearm, f"armed again: orch rollback --completed (run #{run_id})", run_id)
        runner = Runner(
            plan,
            store,
            selection,
            options,
            log,
            leases=Leases(store, log, run_id, plan.resources),
            checks=Checks(plan, store, log_dir, log),
            mending=Mending(plan, store, run_id, log, options.rollback),
            run_id=run_id,
            log_dir=log_dir,
            tag=store_tag(store_path),
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


def undone_steps_guards(plan: Plan, store: Store) -> list[str]:
    """The compensations of the plan's completed steps: what `orch rollback --completed` arms
    again (a completed plan disarmed them: nothing was to undo then; Store.arm leaves one
    that is armed as it is)."""
    completed = {
        r["id"] for r in store.todos() if r["status"] == Status.COMPLETED and not r["role"]
    }
    return [g for t in plan.tasks if t.id in completed for g in plan.guarded.get(t.id, [])]


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
    """The loop of one run (as doit's runner.py is the loop of a `doit` run):

    - first, the compensations and `finally` tasks an earlier run left due (mending); if one
      of them does not complete, nothing else starts;
    - then the ready tasks (graphlib), in the plan's order among them; for each: decide (keep,
      block, run: selection) -> when -> preconditions -> in_progress -> run -> record
      (attempts);
    - up to `jobs` at once, each in a thread of its own, a task waiting while the named
      resources it holds are short (leases);
    - after a failure nothing new starts, unless keep_going;
    - compensations and `finally` tasks are armed as tasks go, and run at the end (wind_up).

    Its collaborators are passed in: the plan, the store, what to run of the plan (selection),
    the run's options, the reporter (`log`: a structlog logger, every event of the run goes
    through it), what the run's tasks hold (leases), their params and preconditions (checks),
    their compensations and `finally` tasks (mending)."""

    def __init__(
        self,
        plan: Plan,
        store: Store,
        selection: Selection,
        options: RunOptions,
        log: Any,
        leases: Leases,
        checks: Checks,
        mending: Mending,
        run_id: int,
        log_dir: Path,
        tag: str = "",
    ) -> None:
        self.plan, self.store, self.options, self.log = plan, store, options, log
        self.leases, self.mending, self.run_id = leases, mending, run_id
        self.home = plan.file.absolute().parent  # where the plan's relative paths start
        rows, statuses = read_todos(store)
        # What an earlier run was asked to redo and did not; then resolved again knowing who
        # held what: the rerun's cut, revived holders, their releasers.
        self.selection, revived, freshness = selection.knowing(plan, store, statuses)
        for task_id, why in revived.items():
            log.info("task.revived", task=task_id, why=why)
        if carried := sorted(self.selection.carried):
            log.warning("run.carried", tasks=", ".join(carried), why=owed_why(self.selection))
        if not options.rollback:  # a rollback redoes nothing: what is owed stays owed
            now_owed = self.selection.owing(run_id, store.last_transition(), asked(options))
            store.set_meta(OWED_KEY, now_owed.to_json() if now_owed else None)
        self.tally = Tally(rows, statuses, freshness, options.keep_going)
        self.stale: dict[str, tuple[str, ...]] = {}
        self.jobs = options.jobs or plan.jobs
        self.threads: dict[str, int] = {}  # task id -> the thread running it (--jobs)
        self.attempts = Attempts(
            plan,
            store,
            log,
            self.tally,
            checks,
            leases,
            mending.change,
            run_id,
            log_dir,
            tag=tag,
            jobs=self.jobs,
            approve=options.approve,
            argv=options.argv,
        )

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
            mended = self.mending.first(self.attempts)
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
            with hold_interrupts():
                self.store.close_run(
                    self.run_id, RunOutcome.INTERRUPTED, f"stopped by {signal_name(exc)}"
                )
                self.not_started(f"the run was stopped by {signal_name(exc)}")
                self.log.error("run.interrupted", by=signal_name(exc))
            raise
        if self.options.rollback:
            return self.result(RunOutcome.COMPLETED)
        if not mended:
            self.not_started("a compensation or finally task did not complete")
            return self.result(RunOutcome.FAILED)
        tally = self.tally
        in_scope = [tally.statuses[i] for i in self.selection.scope]
        outcome = RunOutcome.COMPLETED if all(s.done for s in in_scope) else RunOutcome.FAILED
        if tally.gates and not {Status.FAILED, Status.BLOCKED, Status.INTERRUPTED} & set(in_scope):
            outcome = RunOutcome.WAITING
            self.log.warning(
                "run.waiting",
                gates=", ".join(tally.gates),
                hint=f"{self.attempts.approve_command(tally.gates[0])}, then run again",
            )
        waiting = [i for i in self.selection.scope if tally.statuses[i] is Status.PENDING]
        if tally.stopped_by and waiting:
            self.log.warning(
                "run.stopped",
                after=tally.stopped_by,
                not_started=len(waiting),
                hint="--keep-going runs what does not depend on the failure",
            )
        if tally.stopped_by:
            how = "was blocked" if tally.statuses[tally.stopped_by] is Status.BLOCKED else "failed"
            self.not_started(f"the run stopped after {tally.stopped_by} {how}")
        elif tally.gates:
            self.not_started(f"the run waits for approval of {', '.join(tally.gates)}")
        return self.result(outcome)

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
        pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="orch-task")
        try:
            while ready or running:
                waiting = []
                while ready and len(running) < self.jobs:
                    item = heapq.heappop(ready)
                    task = self.plan.by_id[item[1]]
                    if short := self.leases.short(task):
                        waiting.append(item)
                        self.leases.wait_for(task, short, running.values())
                        continue
                    self.leases.take(task)
                    running[pool.submit(self.visit_in_thread, task)] = task
                for item in waiting:
                    heapq.heappush(ready, item)
                if not running:
                    return  # what is left waits on nothing that could end: not reached
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    task = running.pop(future)
                    self.leases.put_back(task)
                    future.result()  # a bug or a storage fault in a task thread ends the run
                    sorter.done(task.id)
                    push(sorter.get_ready())
        except BaseException:
            self.stop_threads(running)
            raise
        finally:
            pool.shutdown(wait=True)

    def visit_in_thread(self, task: PlannedTask) -> None:
        self.threads[task.id] = threading.get_ident()
        try:
            self.visit(task)
        finally:
            del self.threads[task.id]
            # It may have ended before its lease (skipped, blocked, interrupted).
            self.leases.end_turn(task.id)

    def stop_threads(self, running: dict[Future[None], PlannedTask]) -> None:
        """Ctrl-C (or a failure of the run itself) while tasks run in threads: each gets the
        interrupt the main thread got, ends its processes and records itself interrupted, as a
        task alone does; then the run ends. Each task is told once per Ctrl-C: told again while
        it ends its processes and records itself, it would hold the interrupt until its group
        has ended (hold_interrupts), then stop recording. A task that starts meanwhile is told
        as it starts; a second Ctrl-C is passed on to all."""
        told: set[str] = set()
        while running:
            for task_id, tid in list(self.threads.items()):
                if task_id not in told:
                    told.add(task_id)
                    raise_in_thread(tid, KeyboardInterrupt)
            try:
                done, _ = wait(running, timeout=0.5)
            except KeyboardInterrupt:
                told.clear()
                continue
            for future in done:
                running.pop(future)

    def visit(self, task: PlannedTask) -> None:
        tally = self.tally
        decision = decide(
            task, tally.rows.get(task.id), self.selection, tally.statuses, tally.freshness
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
            return self.attempts.settle(task, Status.BLOCKED, decision.reason)
        if tally.stopped_by is not None or tally.gates:
            return  # fail fast (or a gate waits): nothing new starts; the task stays as it was
        self.attempts.perform(task)
        if tally.statuses[task.id] in (Status.FAILED, Status.BLOCKED):
            tally.stop_after(task)

    def not_started(self, why: str) -> None:
        """As the run ends (before its compensations and `finally` tasks): the steps in scope it
        left pending say why now; a wait it noted, or an earlier run's reason, is over."""
        if self.options.rollback:  # runs no step: theirs are what the rollback made them
            return
        pending = [i for i in self.selection.scope if self.tally.statuses[i] is Status.PENDING]
        self.store.note_not_started(sorted(pending), f"not started: {why}")

    def wind_up(self, result: RunResult) -> RunResult:
        """After the plan's steps (and after the servers they left were ended): what is due of
        the compensations and `finally` tasks (mending), then the run's end, recorded."""
        outcome = self.mending.wind_up(result.outcome, self.attempts)
        self.log.info("run.finished", outcome=outcome, tasks_started=self.tally.started)
        return self.result(outcome)

    def result(self, outcome: RunOutcome) -> RunResult:
        code = {RunOutcome.COMPLETED: EXIT_OK, RunOutcome.WAITING: EXIT_WAITING}.get(
            outcome, EXIT_FAILED
        )
        return RunResult(self.run_id, outcome, code, self.stale)


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
