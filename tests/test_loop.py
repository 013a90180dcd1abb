"""The run loop driven in-process, with its collaborators built as `execute` builds them: a real
store on disk, a real plan of shell tasks, real Leases, and a reporter that keeps each event
the loop reports (a structlog logger whose one processor records it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.core.status import RunOutcome, Status
from orchestrator.plan.model import load_plan
from orchestrator.run.checks import Checks
from orchestrator.run.leases import LEASE_KIND, Leases
from orchestrator.run.loop import Runner, RunOptions, RunResult, from_folder, store_tag
from orchestrator.run.mending import Mending
from orchestrator.run.selection import Selection
from orchestrator.run.todos import todo_specs
from orchestrator.store.db import Store, runs_dir
from orchestrator.store.liveness import current_identity


class Reporter:
    """What the loop reports, in order: each event with its level, its fields, and when (the
    monotonic clock) it was reported; from any thread."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.log = structlog.wrap_logger(
            None, processors=[self.keep], wrapper_class=structlog.BoundLogger
        )

    def keep(self, _logger: Any, level: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
        self.events.append({**event, "level": level, "at": time.monotonic()})
        raise structlog.DropEvent

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def started(self) -> list[str]:
        """The tasks the loop started, in the order it started them."""
        return [e["task"] for e in self.of("task.started")]

    def span(self, task: str) -> tuple[float, float]:
        """When `task` started and when it completed."""
        (start,) = [e["at"] for e in self.of("task.started") if e["task"] == task]
        (end,) = [e["at"] for e in self.of("task.completed") if e["task"] == task]
        return start, end


@dataclass
class Run:
    result: RunResult
    statuses: dict[str, Status]
    reporter: Reporter
    leases: Leases
    store: Store


@pytest.fixture
def run_plan(tmp_path: Path) -> Iterator[Any]:
    """run_plan(PLAN_TEXT, **RunOptions fields): the plan run once by a Runner built here."""
    stores: list[Store] = []

    def run(text: str, **options: Any) -> Run:
        plan_file = tmp_path / "plan.yaml"
        plan_file.write_text(text)
        plan = load_plan(plan_file)
        store_path = tmp_path / ".orch" / f"{plan.name}.db"
        store_path.parent.mkdir(exist_ok=True)
        store = Store.open(store_path)
        stores.append(store)
        store.bind_plan(plan.name)
        log_dir = runs_dir(store_path) / str(store.next_run_id())
        log_dir.mkdir(parents=True)
        run_id = store.begin_run(current_identity(), str(plan_file), "orch run", log_dir)
        store.sync_plan(todo_specs(plan), run_id)
        opts = RunOptions(argv=["orch", "run", str(plan_file)], **options)
        reporter = Reporter()
        log = reporter.log.bind(run=run_id)
        leases = Leases(store, log, run_id, plan.resources)
        runner = Runner(
            plan,
            store,
            Selection.of(plan, opts.rerun, opts.from_task, opts.only),
            opts,
            log,
            leases=leases,
            checks=Checks(plan, store, log_dir, log),
            mending=Mending(plan, store, run_id, log, opts.rollback),
            run_id=run_id,
            log_dir=log_dir,
            tag=store_tag(store_path),
        )
        with from_folder(runner.home):
            result = runner.wind_up(runner.run())
        statuses = {r["id"]: r["status"] for r in store.todos()}
        return Run(result, statuses, reporter, leases, store)

    yield run
    for store in stores:
        store.close()


def test_among_ready_tasks_the_plans_order_decides(run_plan: Any) -> None:
    """`a` and `c` are ready at once; `a` done, `b` (after `a` in the plan) is ready too, and
    goes before `c`, ready since the start: the plan's order, not the order they became ready."""
    run = run_plan("""
name: t
tasks:
  - {id: a, kind: shell, params: {command: "true"}}
  - {id: b, kind: shell, needs: [a], params: {command: "true"}}
  - {id: c, kind: shell, params: {command: "true"}}
  - {id: d, kind: shell, needs: [b], params: {command: "true"}}
""")
    assert run.result.outcome == RunOutcome.COMPLETED and run.result.exit_code == 0
    assert run.reporter.started() == ["a", "b", "c", "d"]
    assert set(run.statuses.values()) == {"completed"}
    (finished,) = run.reporter.of("run.finished")
    assert finished["tasks_started"] == 4 and finished["run"] == run.result.run_id


FAILING = """
name: t
tasks:
  - {id: first, kind: shell, params: {command: "true"}}
  - {id: bad, kind: shell, params: {command: "exit 3"}}
  - {id: later, kind: shell, params: {command: "true"}}
  - {id: after_bad, kind: shell, needs: [bad], params: {command: "true"}}
"""


def test_after_a_failure_nothing_new_starts(run_plan: Any) -> None:
    """`later` needs nothing that failed, yet does not start; `after_bad` is blocked by the
    failure (recorded, not started)."""
    run = run_plan(FAILING)
    assert run.result.outcome == RunOutcome.FAILED and run.result.exit_code == 1
    assert run.reporter.started() == ["first", "bad"]
    assert run.statuses == {
        "first": "completed",
        "bad": "failed",
        "later": "pending",
        "after_bad": "blocked",
    }
    (failed,) = run.reporter.of("task.failed")
    assert failed["task"] == "bad" and failed["level"] == "error"
    (stopped,) = run.reporter.of("run.stopped")
    assert stopped["after"] == "bad" and stopped["not_started"] == 1
    later = run.store.todo("later")
    assert later is not None and later["reason"] == "not started: the run stopped after bad failed"


def test_with_keep_going_the_rest_runs(run_plan: Any) -> None:
    """What does not depend on the failure runs; what does is blocked, not started."""
    run = run_plan(FAILING, keep_going=True)
    assert run.result.outcome == RunOutcome.FAILED
    assert run.reporter.started() == ["first", "bad", "later"]
    assert run.statuses == {
        "first": "completed",
        "bad": "failed",
        "later": "completed",
        "after_bad": "blocked",
    }
    assert not run.reporter.of("run.stopped")


def test_two_jobs_run_two_sleeping_tasks_at_once(run_plan: Any) -> None:
    run = run_plan(
        """
name: t
tasks:
  - {id: s0, kind: shell, params: {command: "sleep 0.6"}}
  - {id: s1, kind: shell, params: {command: "sleep 0.6"}}
""",
        jobs=2,
    )
    assert run.result.outcome == RunOutcome.COMPLETED
    (start0, end0), (start1, end1) = run.reporter.span("s0"), run.reporter.span("s1")
    assert start0 < end1 and start1 < end0, "the two tasks did not overlap"


def test_a_pool_member_is_leased_to_one_task_at_a_time(
    run_plan: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GPU of a recorded host is free (the other holds a process): two tasks that want one
    each, with two jobs, take turns on it; the second waits, saying for what."""
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps([{"index": 0, "used_mib": 300}, {"index": 1, "pids": [4121]}]))
    monkeypatch.setenv("ORCH_GPU_STATE", str(state))
    run = run_plan(
        """
name: t
tasks:
  - {id: g0, kind: shell, resources: {gpus: 1}, params: {command: "sleep 1"}}
  - {id: g1, kind: shell, resources: {gpus: 1}, params: {command: "sleep 1"}}
""",
        jobs=2,
    )
    assert run.result.outcome == RunOutcome.COMPLETED
    leased = {e["task"]: e["gpus"] for e in run.reporter.of("task.leased")}
    assert leased == {"g0": "0", "g1": "0"}
    (first, first_end), (second, second_end) = sorted(
        [run.reporter.span("g0"), run.reporter.span("g1")]
    )
    assert first_end <= second, "both tasks held GPU 0 at once"
    waits = [e for e in run.reporter.of("task.waiting") if "gpus" in e.get("why", "")]
    assert waits and "1 gpus (0 free of 2" in waits[0]["why"], waits
    assert run.leases.leased == {} and run.leases.turns == []
    held = [r for r in run.store.resources() if r["kind"] == LEASE_KIND]
    assert [r["name"] for r in held] == ["gpus:0"] and all(r["released_at"] for r in held)
