"""The engine's one way in: a Runbook is a plan file, its store and its vars, and everything
a front end does to them. `orch` (cli.py) and the agent server (agent/) go through it, as any
other front end would (a fleet's per-host call, say); none of them takes the lock, loads the
plan or writes the store itself (`orch logs`, `report` and `events` only read the store).

What a Runbook owns, so no front end re-does it: finding the store (--store, beside the plan,
the one .orch/*.db here), the finished fast path (an unchanged plan whose tasks are all done
answers from the store without loading the plan), closing runs whose orchestrator died (taking
a snapshot or starting a run does), the plan as run (the file plus the tasks added to the
store), checking approval gates before anything is written, the run lock (the loop takes it),
and turning a storage fault or a Ctrl-C into a recorded outcome.

Nothing heavy is imported here at start-up: `orch status` on a finished plan must stay a hash
and one query (bench/bench_engine.py). Each method imports what it needs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WAITING,
    OrchError,
    PlanError,
    StoreError,
    UsageError,
)
from orchestrator.core.status import RunOutcome

if TYPE_CHECKING:
    from orchestrator.core.findings import Finding, FindingValue
    from orchestrator.core.status import Status
    from orchestrator.plan.model import Plan
    from orchestrator.run.todos import Merge
    from orchestrator.store.db import Store
    from orchestrator.views.snapshot import Snapshot

Event = dict[str, Any]  # one of `orch events --json`'s objects (views/events.py)
EVENT_POLL_S = 0.25


class RunRequest(NamedTuple):
    """What to run: by default every task not done, resuming after what completed."""

    rerun: Sequence[str] = ()  # these and what depends on them, even if completed
    from_task: str | None = None  # this task and every later one in plan order
    only: Sequence[str] = ()  # just these (their needs must be completed)
    keep_going: bool = False  # after a failure, still run what does not depend on it
    jobs: int | None = None  # ready tasks at once; None: the plan's `jobs`
    approve: Sequence[str] = ()  # gates approved for this run, as the person running it

    @property
    def selects(self) -> bool:
        """Asks for something besides "what is not done" (the fast path cannot answer it)."""
        return bool(self.rerun or self.from_task or self.only)


RESUME = RunRequest()  # every task not done, resuming after what completed (immutable)


class RunSummary(NamedTuple):
    """How a run ended. `run_id` is None when no run was recorded: the plan was finished
    already (`nothing_to_do`) or a rollback found nothing to undo."""

    outcome: RunOutcome  # nothing to do: completed, with `nothing_to_do`
    exit_code: int
    run_id: int | None
    store: Path
    stale: Mapping[str, Sequence[str]]
    plan: Plan | None  # None on the fast path: the plan was not loaded
    nothing_to_do: bool = False


class Runbook:
    """A plan file (or none: a store alone, for reading), its store and its --var values."""

    def __init__(
        self,
        plan_file: Path | None,
        store: str | Path | None = None,
        var_args: Sequence[str] = (),
    ) -> None:
        if var_args and plan_file is None:
            raise UsageError("--var and --vars-file need PLAN: they change what is stale in it")
        self.plan_file = plan_file
        self.store_opt = str(store) if store else None
        self.var_args = tuple(var_args)
        self._plan: Plan | None = None
        self._store_path: Path | None = None

    # --- the plan and its store ------------------------------------------------------------

    def load(self) -> Plan:
        """The plan file, validated (PlanError lists every problem); loaded once."""
        if self._plan is None:
            if self.plan_file is None:
                raise UsageError("this needs the PLAN file, not only its store")
            self._plan = _load(self.plan_file, self.var_args)
        return self._plan

    def mask_secrets(self) -> None:
        """Mask the plan's secret values in what this process writes from now on, as a run
        does: for a reader that runs a plugin's code (`orch report`: a kind's error may quote
        a token it read). With no plan, or one that does not load, nothing more is masked:
        the store's own text was masked as it was written."""
        from orchestrator.core import redact

        if self.plan_file is None:
            return
        try:
            redact.register(self.load().secret_values)
        except OrchError:
            return

    @property
    def store_path(self) -> Path:
        """--store / ORCH_STORE, else .orch/<plan name>.db beside the plan, else the single
        .orch/*.db around the working directory. The plan file is read for its name only."""
        if self._store_path is None:
            self._store_path = _store_path(self.store_opt, self._plan, self.plan_file)
        return self._store_path

    def plan_as_run(self) -> Plan:
        """The plan a run on this store runs: the file's tasks and those added to the store.
        Read by a peek, which writes nothing; a store that cannot be read adds nothing here
        (the open that follows says why)."""
        from contextlib import closing

        from orchestrator.run.todos import plan_as_run
        from orchestrator.store.db import SQLITE_ERRORS, Store

        plan = self.load()
        if not self.store_path.exists():
            return plan
        try:
            with closing(Store.peek(self.store_path)) as store:
                return plan_as_run(plan, store)
        except (*SQLITE_ERRORS, StoreError):
            return plan

    @cached_property
    def _digest(self) -> str | None:
        """The plan file's bytes, vars and environment as first read: what a completed run
        records, and what the fast path compares (None: the file cannot be read)."""
        from orchestrator.store.finished import plan_digest

        return plan_digest(self.plan_file, self.var_args) if self.plan_file else None

    @cached_property
    def _guess(self) -> Path | None:
        """The store, found without loading the plan (its name read by a pattern)."""
        from orchestrator.store.finished import guess_store

        return guess_store(self.plan_file, self.store_opt) if self.plan_file else None

    def finished(self) -> bool:
        """The fast path: the plan file and vars are byte-identical to those of a run that
        completed every task, and the store says nothing changed since (no plan load)."""
        from orchestrator.store.finished import already_finished

        digest, guess = self._digest, self._guess
        if not (digest and guess and already_finished(guess, digest)):
            return False
        self._store_path = self._store_path or guess
        return True

    # --- reading ---------------------------------------------------------------------------

    def status(self, warn: Callable[[str], None] = lambda _: None) -> Snapshot:
        """The board now: each task, its findings, the latest run, what is stale. Closes the
        runs whose orchestrator died. A plan that does not load still gives its store's board
        (staleness unknown), with `warn` naming the problem; no store is then the error."""
        from orchestrator.views.snapshot import take

        if self.plan_file is not None and self._plan is None:
            if (fast := self.cached_status(warn)) is not None:
                return fast
            try:
                self.load()
            except PlanError as exc:  # mid-edit, mid-incident: the board matters all the more
                return take(self._store_despite(exc, warn), None, None, warn)
        return take(self.store_path, self._plan, None, warn)

    def cached_status(self, warn: Callable[[str], None]) -> Snapshot | None:
        """The board with what the last run found stale, if that still holds: one open of the
        store, with its checks, for both (a store that fails them: the full path says why)."""
        from orchestrator.run.stale import cached_stale
        from orchestrator.store.db import Store
        from orchestrator.views.snapshot import take_open

        digest, guess = self._digest, self._guess
        if not (digest and guess and guess.exists()):
            return None
        try:
            store = Store.open(guess, create=False)
        except StoreError:
            return None
        try:
            if (stale := cached_stale(store, digest)) is None:
                return None
            self._store_path = self._store_path or guess
            return take_open(store, None, stale, warn)
        finally:
            store.close()

    def _store_despite(self, exc: PlanError, warn: Callable[[str], None]) -> Path:
        """The store of a plan that does not load, found as the fast path guesses it; `exc`
        again when there is none."""
        assert self.plan_file is not None
        path = self._guess if self.plan_file.is_file() else None
        if path is None or not path.exists():
            raise exc
        more = len(exc.issues) - 1
        also = f" (and {more} more: orch validate {self.plan_file})" if more else ""
        warn(
            f"warning: {exc.issues[0]}{also}; the board is {path} as recorded: "
            "staleness could not be computed"
        )
        return path

    def dry_run(self, request: RunRequest = RESUME) -> list[dict[str, Any]]:
        """What `run(request)` would run, skip or find stale, and why. Changes nothing."""
        from orchestrator.run.dryrun import dry_run

        plan = self.load()
        store = self._open() if self.store_path.exists() else None
        try:
            return dry_run(plan, store, request.rerun, request.from_task, request.only)
        finally:
            if store is not None:
                store.close()

    def transitions(self, task_id: str | None = None, limit: int = 200) -> list[Any]:
        """The status transitions of one task (or of all), newest first."""
        store = self._open()
        try:
            return list(store.transitions(task_id, limit=limit))
        finally:
            store.close()

    def holder(self) -> str | None:
        """Who holds the store's run lock, described; None while no run holds it."""
        from orchestrator.store.lock import RunLock

        lock = RunLock(self.store_path)
        if not self.store_path.exists() or lock.try_probe():
            return None
        return lock.describe_holder()

    # --- running ---------------------------------------------------------------------------

    def run(
        self,
        request: RunRequest = RESUME,
        *,
        console: str = "info",
        argv: Sequence[str] | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> RunSummary:
        """Run the plan (see RunRequest), resuming after what completed. `console`: the
        level of log lines on stderr ("critical": none, for a live board). `on_event`: called
        with each transition, finding and run event as the store records it, from a thread.
        Ctrl-C (or SIGTERM, SIGHUP: see `stoppable`) ends the running tasks and returns the
        outcome `interrupted`; a bad plan or selection, a store in use or damaged: OrchError,
        before anything ran."""
        if not request.selects and self.finished():
            stale: dict[str, tuple[str, ...]] = {}
            done = RunOutcome.COMPLETED
            return RunSummary(done, EXIT_OK, None, self.store_path, stale, None, nothing_to_do=True)
        return self._execute(request, console, argv, on_event, rollback=False)

    def rollback(
        self,
        *,
        console: str = "info",
        argv: Sequence[str] | None = None,
        on_event: Callable[[Event], None] | None = None,
        completed: bool = False,
    ) -> RunSummary:
        """Run the armed compensations (the latest armed first), then the armed `finally`
        tasks; what they undo is pending again. Nothing else runs. `completed`: a completed
        plan is undone too (its steps' compensations, disarmed when it completed, armed
        again first)."""
        return self._execute(
            RESUME, console, argv, on_event, rollback=True, undo_completed=completed
        )

    def _execute(
        self,
        request: RunRequest,
        console: str,
        argv: Sequence[str] | None,
        on_event: Callable[[Event], None] | None,
        rollback: bool,
        undo_completed: bool = False,
    ) -> RunSummary:
        import sys

        from orchestrator.run.loop import RunOptions, execute

        digest = None if rollback else self._digest  # the bytes as read before the load
        plan = self.load()
        path = self.store_path
        if request.approve:
            ran = self.plan_as_run()  # a gate may be one added to the store
            for gate in request.approve:
                _check_gate(ran, gate)  # a mistyped --approve would leave the run at its gate
        options = RunOptions(
            keep_going=request.keep_going,
            rerun=request.rerun,
            from_task=request.from_task,
            only=request.only,
            jobs=request.jobs,
            approve=request.approve,
            rollback=rollback,
            undo_completed=undo_completed,
            console_level=console,
            argv=list(argv if argv is not None else sys.argv),
            plan_digest=digest,
        )
        feed = _EventFeed(path, on_event) if on_event is not None else None
        try:
            result = execute(plan, path, options)
        except OrchError as exc:
            _record_stop(path, str(exc))
            raise
        except OSError as exc:
            fault = _storage_fault(path, exc)
            if fault is None:
                raise
            _record_stop(path, fault)
            raise StoreError(fault) from None
        except KeyboardInterrupt:  # the loop ended the tasks and recorded `interrupted`
            return RunSummary(RunOutcome.INTERRUPTED, EXIT_INTERRUPTED, None, path, {}, plan)
        finally:
            if feed is not None:
                feed.close()
        waiting = result.exit_code == EXIT_WAITING  # stopped at a gate: nothing failed
        outcome = RunOutcome.WAITING if waiting else RunOutcome(result.outcome)
        return RunSummary(outcome, result.exit_code, result.run_id, path, result.stale, plan)

    # --- writing beside a run --------------------------------------------------------------

    def approve(self, task_id: str, note: str | None, by: str | None = None) -> dict[str, Any]:
        """Approve gate `task_id` for the next run, recorded with who, when, the plan's hash
        and the findings upstream of it (a changed plan or findings void it)."""
        from orchestrator.core.status import Status
        from orchestrator.run import approvals
        from orchestrator.run.todos import ensure_plan

        plan = self.load()
        ran = self.plan_as_run()  # the gate may be one added to the store
        _check_gate(ran, task_id)  # before anything is written: a mistyped ID changes nothing
        store = self._open(create=True)  # approving before the first run is allowed
        try:
            if store.todo(task_id) is None:
                ensure_plan(plan, store)
            plan_digest, seen = approvals.hashes(ran, task_id, store)
            by = by or approvals.who()
            store.approve(task_id, by, note, plan_digest, seen, "orch approve")
            if (row := store.todo(task_id)) is not None and row["status"] == Status.WAITING:
                store.note_reason(task_id, f"approved by {by}: the next `orch run` passes it")
        finally:
            store.close()
        return {"task": task_id, "by": by, "note": note, "plan_hash": plan_digest,
                "findings_hash": seen}  # fmt: skip

    def forget(
        self,
        task_ids: Sequence[str] | None,
        why: str,
        confirm: Callable[[str], bool] = lambda _: True,
    ) -> list[str]:
        """Forget what the store knows of these tasks (all: None): pending again, their past
        kept in the history. Refused while a run holds the store; `confirm` is asked first."""
        from orchestrator.core.errors import did_you_mean
        from orchestrator.store.finished import DIGEST_KEY
        from orchestrator.store.liveness import close_dead_runs, current_identity
        from orchestrator.store.lock import RunLock

        path = self.store_path
        store = self._open()
        lock = RunLock(path)
        try:
            known = [r["id"] for r in store.todos()]
            for task_id in task_ids or ():
                if task_id not in known:
                    raise UsageError(f"no task {task_id!r} in {path}{did_you_mean(task_id, known)}")
            ids = list(task_ids or known)
            if not confirm(f"forget all {len(ids)} tasks recorded in {path}?"):
                raise UsageError("nothing was changed")
            who = current_identity()
            lock.acquire({"pid": who.pid, "host": who.host, "argv": f"orch {why.split()[-1]}"})
            close_dead_runs(store, holding_lock=True)  # a dead run's task: interrupted first
            done = store.forget(ids, why)
            store.set_meta(DIGEST_KEY, None)  # a finished plan has work again
        finally:
            lock.release()
            store.close()
        return done

    def reset(self, confirm: Callable[[str], bool] = lambda _: True) -> list[str]:
        """Forget every task: the next run starts over (their past stays in the history)."""
        return self.forget(None, "reset by orch reset", confirm)

    def add_task(self, definition: Mapping[str, Any], author: str) -> str:
        """Put a task on the board: with a `kind` it is validated as part of the plan and runs
        at the next run; without one it is a todo kept by hand. Returns its id."""
        from orchestrator.run import todos

        plan = self.load()
        store = self._open(create=True)
        try:
            return todos.add(plan, store, definition, author)
        finally:
            store.close()

    def set_todo(self, task_id: str, status: Status, note: str | None, author: str) -> None:
        """Set the status of a todo with no kind (a task with a kind gets it from its runs)."""
        store = self._open(create=True)
        try:
            store.set_todo(task_id, status, note, author)
        finally:
            store.close()

    def remove_task(self, task_id: str, author: str) -> None:
        """Remove an added task from the board; its history stays."""
        from orchestrator.run import todos

        store = self._open(create=True)
        try:
            todos.remove(store, task_id, author)
        finally:
            store.close()

    def record(
        self,
        task_id: str,
        author: str,
        note: str | None = None,
        key: str | None = None,
        value: FindingValue | None = None,
        unit: str | None = None,
    ) -> Finding:
        """Record a finding (key, value, unit; `note` its comment) or a note on a task."""
        from orchestrator.run import todos

        store = self._open(create=True)
        try:
            return todos.note(store, task_id, author, note, key, value, unit)
        finally:
            store.close()

    def todowrite(self, items: Sequence[Mapping[str, Any]], author: str) -> Merge:
        """Merge an agent's todo list into the board (see run/todos.py `todowrite`)."""
        from orchestrator.run import todos

        store = self._open(create=self.plan_file is not None)
        try:
            if self.plan_file is not None:
                todos.ensure_plan(self.load(), store)
            return todos.todowrite(store, items, author)
        finally:
            store.close()

    def ensure_board(self) -> None:
        """Put the declared tasks on the board of a store no run has synced yet."""
        from orchestrator.run.todos import ensure_plan

        store = self._open(create=True)
        try:
            ensure_plan(self.load(), store)
        finally:
            store.close()

    def _open(self, create: bool = False) -> Store:
        from orchestrator.store.db import Store

        return Store.open(self.store_path, create=create)


def stoppable() -> None:
    """Ctrl-C, SIGTERM and SIGHUP end a run cleanly (outcome interrupted, exit 130), whatever
    the shell did. Call it in the main thread of a process that runs a plan."""
    import signal

    from orchestrator.proc.interrupts import on_signal

    signal.signal(signal.SIGTERM, on_signal)  # first thing: SIGTERM at any moment exits 130
    signal.signal(signal.SIGHUP, on_signal)
    # Started with `&` from a script, orch inherits SIGINT ignored (POSIX) and Python then
    # installs no handler: `kill -INT` would do nothing. A run must always be stoppable.
    signal.signal(signal.SIGINT, on_signal)


class _EventFeed:
    """The run's events as the store records them, handed to `on_event` from a thread: its
    own read connection (WAL: it never blocks the run's writes), starting after what was
    recorded before the run, and drained once more when the run ends."""

    def __init__(self, path: Path, on_event: Callable[[Event], None]) -> None:
        from orchestrator.views.events import Cursor

        self.path, self.on_event, self.cursor = path, on_event, Cursor()
        self.store: Store | None = None
        self.stop = threading.Event()
        self._read()  # before the run: what is there is not this run's
        self.thread = threading.Thread(target=self._loop, name="orch-events", daemon=True)
        self.thread.start()

    def _read(self, report: bool = False) -> None:
        from orchestrator.store.db import Store
        from orchestrator.views.events import read

        if self.store is None:
            if not self.path.exists():
                return  # the run creates it: every event then is this run's
            self.store = Store.open(self.path, create=False)
        for event in read(self.store, self.cursor):
            if report:
                self.on_event(event)

    def _loop(self) -> None:
        try:
            while not self.stop.wait(EVENT_POLL_S):
                self._read(report=True)
        except OrchError:
            return  # the run reports what is wrong with the store

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        try:
            self._read(report=True)
        except OrchError:
            pass
        finally:
            if self.store is not None:
                self.store.close()


def _load(plan_file: Path, var_args: Sequence[str]) -> Plan:
    import gc

    from orchestrator.plan.model import load_plan, parse_var

    try:
        overrides = dict(parse_var(v) for v in var_args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # Loading makes many objects and no garbage cycles: collecting meanwhile costs a third of
    # the load time of a 1000-task plan (bench/bench_engine.py).
    gc.disable()
    try:
        return load_plan(plan_file, overrides)
    finally:
        gc.enable()


def _store_path(store_opt: str | None, plan: Plan | None, plan_file: Path | None) -> Path:
    if store_opt:
        return Path(store_opt)
    if plan is not None:
        return plan.file.parent / ".orch" / f"{plan.name}.db"
    if plan_file is not None:
        from orchestrator.plan.yamlsource import load_yaml

        data = load_yaml(plan_file).data
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str):
            raise UsageError(f"{plan_file}: the plan has no `name`")
        return plan_file.parent / ".orch" / f"{name}.db"
    found = sorted({*Path.cwd().glob(".orch/*.db"), *Path.cwd().glob("*/.orch/*.db")})
    if len(found) == 1:
        return found[0].relative_to(Path.cwd())
    if not found:
        raise UsageError("no store found here: give the PLAN, --store PATH or ORCH_STORE")
    listing = ", ".join(str(p.relative_to(Path.cwd())) for p in found)
    raise UsageError(f"several stores here ({listing}): choose one with PLAN or --store")


def _check_gate(plan: Plan, task_id: str) -> None:
    """A usage error unless `task_id` is an approval gate of `plan` (the plan as run)."""
    from orchestrator.core.errors import did_you_mean
    from orchestrator.run.approvals import GATE_KIND

    task = plan.by_id.get(task_id)
    if task is None or task.spec.kind != GATE_KIND:
        gates = [t.id for t in plan.tasks if t.spec.kind == GATE_KIND]
        raise UsageError(
            f"{task_id!r} is not an approval gate of {plan.file}"
            f"{did_you_mean(task_id, gates)} (gates: {', '.join(gates) or 'none'})"
        )


def describe_os_error(exc: OSError) -> str:
    where = f" writing {exc.filename}" if exc.filename else ""
    return (
        f"{exc.strerror}{where}: the run stopped, what the store recorded is intact; "
        "fix the storage (free space), then run again"
    )


def _storage_fault(path: Path, exc: OSError) -> str | None:
    """What an OSError that ended a run means, if the storage is to blame: the store or its
    logs removed under the run (a task's log gone), a full or failing disk. None: a bug."""
    from orchestrator.store.db import STORAGE_ERRNOS, lost_message, runs_dir

    if not path.exists():
        return lost_message(path)
    if exc.errno in STORAGE_ERRNOS:
        return describe_os_error(exc)
    runs = runs_dir(path).absolute()
    if exc.filename and Path(os.path.abspath(exc.filename)).is_relative_to(runs):
        return (
            f"{exc.filename}: {exc.strerror}: orch's logs were removed or changed during "
            "the run, so the run stopped; run again to retry what did not complete"
        )
    return None


def _record_stop(path: Path, why: str) -> None:
    """After a fault stopped this run, try to close it and mark its task interrupted, so the
    board says why rather than "died"; where the store cannot take even that (still full,
    gone, read-only), the next run or status closes the run as crashed."""
    from orchestrator.store.db import Store

    try:
        store = Store.open(path, create=False)
    except OrchError:
        return
    try:
        for r in store.open_runs():
            if r["pid"] == os.getpid() and not store.readonly:
                store.close_run(r["id"], RunOutcome.FAILED, f"the run stopped: {why}")
    except OrchError:
        pass
    finally:
        store.close()
