"""The engine API driven in-process, as a front end drives it (orchestrator/api.py): no CLI,
no child process. The CLI's and the agent server's own tests drive the same calls from outside.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Runbook, RunRequest
from orchestrator.core.errors import PlanError, UsageError

from conftest import PlanDir

PLAN = """
    name: t
    tasks:
      - id: first
        kind: shell
        params: {command: "echo '::finding size_mb=3 unit=MB'"}
      - id: second
        kind: shell
        needs: [first]
        params: {command: "true"}
      - id: gate
        kind: approve
        params: {message: "go on?"}
        needs: [second]
      - id: last
        kind: shell
        needs: [gate]
        params: {command: "true"}
"""


def test_a_run_reports_its_events_and_a_second_has_nothing_to_do(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    events: list[dict[str, Any]] = []
    book = Runbook(plan)
    first = book.run(RunRequest(), console="critical", on_event=events.append)
    assert (first.outcome, first.exit_code) == ("waiting", 4)  # stopped at the gate
    moves = [(e["task"], e["to"]) for e in events if e["type"] == "transition"]
    assert moves.index(("first", "completed")) < moves.index(("second", "in_progress"))
    assert ("gate", "waiting") in moves
    found = [e for e in events if e["type"] == "finding"]
    assert [(e["task"], e["key"], e["value"]) for e in found] == [("first", "size_mb", 3)]

    with pytest.raises(UsageError, match="not an approval gate"):
        book.approve("second", None)  # checked before anything is written
    book.approve("gate", "window open", by="tester")
    again = Runbook(plan).run(RunRequest(), console="critical")
    assert (again.outcome, again.exit_code) == ("completed", 0)
    assert first.run_id is not None and again.run_id == first.run_id + 1

    third = Runbook(plan).run(RunRequest(), console="critical")
    assert third.nothing_to_do and third.run_id is None and third.plan is None  # no plan load
    board = Runbook(plan).status().as_json()
    assert board["summary"]["completed"] == 4


def test_the_dry_run_and_a_selection_go_through_the_same_checks(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    book = Runbook(plan)
    steps = {s["id"]: s["action"] for s in book.dry_run()}
    assert steps == {"first": "run", "second": "run", "gate": "run", "last": "run"}
    with pytest.raises(UsageError, match="firts"):
        book.run(RunRequest(only=["firts"]), console="critical")
    assert not pdir.store_path().exists() or Runbook(plan).status().run is None


def test_a_bad_plan_is_the_error_of_load_and_nothing_is_written(pdir: PlanDir) -> None:
    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shel}\n")
    with pytest.raises(PlanError) as caught:
        Runbook(plan).run(RunRequest(), console="critical")
    assert caught.value.issues[0].line == 3
    assert not pdir.store_path().exists()


def test_sigint_mid_run_is_an_interrupted_outcome_with_the_task_recorded(pdir: PlanDir) -> None:
    """Ctrl-C as a front end meets it: the call returns `interrupted` (exit 130) and the store
    records the task interrupted; the next run resumes it."""
    go = pdir.root / "go"
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: slow, kind: shell, params: {{command: "touch {go}; sleep 60"}}}}
    """)
    # A front end has Python's Ctrl-C handler; a pytest started in the background (`&` in a
    # script) inherits SIGINT ignored, and the kill below would do nothing but wait 60 s.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Thread(target=_interrupt_when, args=(go,), daemon=True)
        timer.start()
        summary = Runbook(plan).run(RunRequest(), console="critical")
        timer.join()
    finally:
        signal.signal(signal.SIGINT, before)
    assert (summary.outcome, summary.exit_code) == ("interrupted", 130)
    assert pdir.status_of("slow") == "interrupted"


def _interrupt_when(path: Path) -> None:
    import time

    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)  # the main thread gets KeyboardInterrupt
