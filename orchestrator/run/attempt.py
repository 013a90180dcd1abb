"""One task, once the loop has decided it runs: when -> preconditions -> approval -> lease ->
attempts (up to its retries) -> record.

Every status change is committed (Store.transition) before the side effect that follows it:
`in_progress`, with the marker every process of the attempt carries, before the task's first
process starts; a completion with the findings it recorded. What a dead run's attempt left
running is ended, found by that marker, before the task runs again (end_leftovers).
"""

from __future__ import annotations

import json
import shlex
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator.core import redact
from orchestrator.core.errors import TaskError, TemplateError
from orchestrator.core.findings import Finding, checked, summarize
from orchestrator.core.safeopen import open_for_append
from orchestrator.core.status import Status
from orchestrator.kinds import registry
from orchestrator.kinds.task import Context
from orchestrator.plan.model import Plan, PlannedTask
from orchestrator.plan.templating import evaluate_when
from orchestrator.proc.containment import jail
from orchestrator.proc.interrupts import nap
from orchestrator.proc.procfs import tail
from orchestrator.proc.stalls import MAX_RESTARTS, StallPolicy, StallReport, TaskStalled
from orchestrator.run import approvals
from orchestrator.run.approvals import approve_command
from orchestrator.run.checks import Checks
from orchestrator.run.leases import Leases
from orchestrator.run.selection import Freshness
from orchestrator.store.db import GuardChange, Store
from orchestrator.store.rows import ListedTodoRow

PROCESS_MARKER = "ORCH_TASK"  # env var: run:task:attempt@store, in every process a task starts
OUTPUT_TAIL_LINES = 20

# What a transition of a task does to compensations and `finally` tasks (Mending.change).
Arming = Callable[[PlannedTask, Status], GuardChange | None]


def read_todos(store: Store) -> tuple[dict[str, ListedTodoRow], dict[str, Status]]:
    """The store's rows by task id, and each task's status."""
    rows = {r["id"]: r for r in store.todos()}
    return rows, {task_id: Status(r["status"]) for task_id, r in rows.items()}


@dataclass
class Tally:
    """What the run knows of its tasks as it goes, shared by the loop and the attempts: the
    store's rows as it started (or after its compensations), each task's status now, what it
    redid (freshness), the failure after which nothing new starts, the approval gates it
    stopped at, and how many tasks it started (0: nothing to do, all was done)."""

    rows: dict[str, ListedTodoRow]
    statuses: dict[str, Status]
    freshness: Freshness
    keep_going: bool = False
    stopped_by: str | None = None
    gates: list[str] = field(default_factory=list)
    started: int = 0

    def reread(self, store: Store) -> None:
        """The store's rows and statuses again (after compensations undid steps)."""
        self.rows, self.statuses = read_todos(store)

    def stop_after(self, task: PlannedTask) -> None:
        """Fail fast: after this task's failure nothing new starts (unless --keep-going)."""
        if not self.keep_going:
            self.stopped_by = self.stopped_by or task.id


class Attempts:
    """Runs one task of a run (perform) and records each of its transitions (settle).

    `jobs`: tasks at once (alone, a completion is committed with what comes next); `approve`:
    the gates approved for this run (--approve); `argv`: the run's command line, to say how to
    approve a gate; `tag`: tells this store's task markers from another store's."""

    def __init__(
        self,
        plan: Plan,
        store: Store,
        log: Any,
        tally: Tally,
        checks: Checks,
        leases: Leases,
        arming: Arming,
        run_id: int,
        log_dir: Path,
        tag: str = "",
        jobs: int = 1,
        approve: Sequence[str] = (),
        argv: Sequence[str] = (),
    ) -> None:
        self.plan, self.store, self.log, self.tally = plan, store, log, tally
        self.checks, self.leases, self.arming = checks, leases, arming
        self.run_id, self.log_dir, self.tag = run_id, log_dir, tag
        self.jobs, self.approve, self.argv = jobs, approve, argv

    def perform(self, task: PlannedTask) -> None:
        """when -> preconditions -> approval -> lease -> attempts; the outcome is recorded."""
        # Before anything looks at the host: a dead run's leftover would fail port.free etc.
        self.end_leftovers(task)
        approval = resolved = None
        try:
            if not evaluate_when(task.spec.when, self.checks.lookup):
                return self.settle(task, Status.SKIPPED, f"when {task.spec.when!r} is false")
            problem = self.checks.check_preconditions(task)
            if problem is None and task.spec.kind == approvals.GATE_KIND:
                if (passed := self.approval(task)) is None:
                    return
                approval, resolved = passed
        except TemplateError as exc:
            return self.settle(task, Status.FAILED, str(exc), last_error=str(exc))
        if problem is not None:
            return self.settle(task, Status.BLOCKED, problem, last_error=problem)
        try:
            granted = self.leases.lease(task)
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
            self.leases.unlease(task, granted)

    def approval(self, task: PlannedTask) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The approval that lets this gate pass now (one given with --approve is recorded
        first) and the gate's params, resolved (its attempts take them as they are); None
        after recording the gate as waiting, saying for what."""
        # A missing finding fails it.
        params = self.checks.resolve_params(task.cls, task.spec.params)
        plan_digest, seen = approvals.hashes(self.plan, task.id, self.store)
        verdict = approvals.judge(self.store.latest_approval(task.id), plan_digest, seen)
        if verdict.approval is None and task.id in self.approve:
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
        self.tally.gates.append(task.id)
        return None

    def approve_command(self, gate: str) -> str:
        """What a person types to approve `gate` for this run (its plan file and vars)."""
        argv = redact.mask(shlex.join(self.argv))
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
                resolved = self.checks.resolve_params(task.cls, task.spec.params)
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
            guards=self.arming(task, Status.IN_PROGRESS),
            started_at=started,
            ended_at=None,
            last_error=None,
            output_tail=None,
            log_path=str(log_path),
            pgid=None,
            pgid_started_at=None,
        )
        self.tally.statuses[task.id] = Status.IN_PROGRESS
        self.tally.started += 1
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
                f"stopped by {signal_name(exc)}",
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
            with open_for_append(log_path) as f:
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
            # Said once committed and synced (with the successor's start, when held): a
            # completion orch reports survives a power cut (tests/crashharness.py).
            self.store.after_commit(
                partial(self.log.info, "task.completed", task=task.id, took=f"{duration:.2f}s",
                        **found)
            )  # fmt: skip
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
        guards = self.arming(task, to)
        self.store.transition(task.id, to, reason, self.run_id, findings, guards, hold, **fields)
        self.tally.statuses[task.id] = to
        if to.done:
            self.tally.freshness.redone.add(task.id)
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
            self.tally.stop_after(task)

    def marker(self, run_id: int, task_id: str, attempt: int) -> str:
        return f"{run_id}:{task_id}:{attempt}@{self.tag}"

    def end_leftovers(self, task: PlannedTask) -> None:
        """End what a dead run's attempt of this task left running, before running it again.

        Found by the attempt's marker alone (its cgroup or scope is named from it, and every
        process carries it): it was committed before the spawn, so there is no moment of a kill
        after which the processes are unrecorded. The recorded pgid is not needed."""
        row = self.tally.rows.get(task.id)
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

    def __init__(self, attempts: Attempts, task_id: str, findings: list[Finding]) -> None:
        self.attempts, self.task_id, self.findings = attempts, task_id, findings

    def finding(self, finding: Finding) -> None:
        self.findings.append(checked(finding))

    def process_started(self, pgid: int, started_at: float) -> None:
        self.attempts.store.set_process(self.task_id, pgid, started_at)

    def progress(self, message: str) -> None:
        self.attempts.log.info("task.progress", task=self.task_id, msg=message)

    def hold(self, name: str, data: dict[str, Any]) -> None:
        kind = self.attempts.plan.by_id[self.task_id].spec.kind
        self.attempts.store.hold(name, self.task_id, kind, self.attempts.run_id, data)

    def held(self, name: str) -> dict[str, Any] | None:
        rows = self.attempts.store.held(name)
        return json.loads(rows[0]["data"]) if rows else None

    def release(self, name: str) -> None:
        self.attempts.store.release(name, self.task_id, f"by task {self.task_id}")

    def stalled(self, report: StallReport) -> None:
        finding = Finding("stalled", round(report.idle, 1), "s", report.summary)
        self.attempts.store.finding_now(self.task_id, checked(finding), self.attempts.run_id)
        self.attempts.log.warning(
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


def signal_name(exc: BaseException) -> str:
    """What stopped the run: Ctrl-C, or the signal an Interrupted names (SIGTERM, SIGHUP)."""
    return getattr(exc, "signal_name", "Ctrl-C")
