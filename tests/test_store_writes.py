"""The store's writes and the reads that judge them (store/db.py), through its API on a real
SQLite file: forgetting tasks, tasks added and removed at run time, a todo's hand-set status,
guards armed, disarmed and undoing, why a task waits, and what staleness is computed from.

The CLI's view of the same (orch reset, orch todo, compensations in a real run) is tested in
test_cli.py, test_todos.py and test_compensations_and_gates.py; each test here pins one rule
of the store itself, seen to fail when that rule is broken (bench/mutation_probe.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import UsageError
from orchestrator.core.findings import Finding
from orchestrator.core.guards import GuardRole
from orchestrator.core.status import RunOutcome, Status
from orchestrator.store.db import DoneMark, GuardChange, RunIdentity, Store, TodoSpec


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """a, b (needs a) of the plan; u undoes a if the plan fails; z runs `finally`."""
    store = Store.open(tmp_path / "s.db")
    store.sync_plan(
        [
            TodoSpec("a", 0, "A", "medium", "shell", (), "h", "{}"),
            TodoSpec("b", 1, "B", "medium", "shell", ("a",), "h", "{}"),
            TodoSpec(
                "u",
                2,
                "U",
                "medium",
                "shell",
                (),
                "h",
                "{}",
                role=GuardRole.ON_FAILURE,
                protects="a",
            ),
            TodoSpec("z", 3, "Z", "medium", "shell", (), "h", "{}", role=GuardRole.FINALLY),
        ],
        None,
    )
    yield store
    store.close()


def begin(store: Store, tmp_path: Path) -> int:
    return store.begin_run(RunIdentity(1, 2.0, "host", "boot"), "plan.yaml", "orch run", tmp_path)


def complete(
    store: Store,
    task_id: str,
    run_id: int | None,
    *found: Finding,
    guards: GuardChange | None = None,
) -> None:
    store.transition(task_id, Status.IN_PROGRESS, None, run_id)
    store.transition(task_id, Status.COMPLETED, None, run_id, found, guards)


def row(store: Store, task_id: str) -> dict[str, object]:
    found = store.todo(task_id)
    assert found is not None
    return dict(found)


def transitions_of(store: Store, task_id: str) -> int:
    return len(store.transitions(task_id))


# --- forget ----------------------------------------------------------------------------------


def test_forget_makes_done_and_failed_tasks_pending_and_leaves_pending_ones(store: Store) -> None:
    complete(store, "a", None, Finding("k", 1))
    store.transition("b", Status.IN_PROGRESS, None, None)
    store.transition("b", Status.FAILED, "boom", None, last_error="boom")
    logged = transitions_of(store, "z")
    assert store.forget(["a", "b", "z", "nope"], "reset by me") == ["a", "b"]
    for task_id in ("a", "b"):
        a = row(store, task_id)
        assert a["status"] == Status.PENDING and a["reason"] == "reset by me"
        assert a["started_at"] is None and a["ended_at"] is None and a["last_error"] is None
        assert a["attempts"] == 1  # its history stays: attempts still number the findings
    assert transitions_of(store, "z") == logged  # pending already: nothing written
    assert store.findings() == {}  # a forgotten task has no current findings


# --- tasks added at run time -----------------------------------------------------------------


def added(task_id: str, title: str, kind: str = "", needs: tuple[str, ...] = ()) -> TodoSpec:
    return TodoSpec(task_id, 99, title, "low", kind, needs, "h", "{}", origin="agent")


def test_a_kindless_todo_goes_last_and_a_task_keeps_its_place(store: Store) -> None:
    store.add_todo(added("x", "X"), "agent", None)
    assert row(store, "x")["position"] == 4  # after a, b, u, z
    store.add_todo(added("y", "Y", kind="shell"), "agent", '{"id": "y"}')
    assert row(store, "y")["position"] == 99  # where the plan's loader placed it
    assert row(store, "y")["kind"] == "shell" and row(store, "x")["kind"] is None
    assert [t["id"] for t in store.added()] == ["x", "y"]


def test_an_id_on_the_board_cannot_be_added_again(store: Store) -> None:
    with pytest.raises(UsageError, match="'a' is already on the board"):
        store.add_todo(added("a", "again"), "agent", None)
    store.add_todo(added("x", "X"), "agent", None)
    with pytest.raises(UsageError, match="'x' is already on the board"):
        store.add_todo(added("x", "X"), "agent", None)
    assert row(store, "x")["title"] == "X"


def test_a_removed_todo_added_again_comes_back_pending_and_new(store: Store) -> None:
    store.add_todo(added("x", "X"), "agent", None)
    store.set_todo("x", Status.FAILED, "broke", "me")
    store.remove_todo("x", "me")
    assert "x" not in {t["id"] for t in store.todos()}
    assert row(store, "x")["in_plan"] == 0  # hidden, kept for its history
    store.add_todo(added("x", "X2"), "agent", None)
    x = row(store, "x")
    assert (x["status"], x["title"], x["in_plan"]) == (Status.PENDING, "X2", 1)
    assert x["reason"] == "added again by agent" and x["ended_at"] is None
    assert [t["id"] for t in store.todos()][-1] == "x"


def test_remove_refuses_a_plan_task_a_running_task_and_a_needed_one(store: Store) -> None:
    with pytest.raises(UsageError, match="declared in the plan file"):
        store.remove_todo("a", "me")
    store.add_todo(added("k", "K", kind="shell"), "agent", None)
    store.transition("k", Status.IN_PROGRESS, None, None)
    with pytest.raises(UsageError, match="'k' is running"):
        store.remove_todo("k", "me")
    store.add_todo(added("m", "M"), "agent", None)
    store.add_todo(added("n", "N", needs=("m",)), "agent", None)
    with pytest.raises(UsageError, match="'m' is needed by n"):
        store.remove_todo("m", "me")
    store.set_todo("m", Status.IN_PROGRESS, None, "me")  # a kindless todo: nothing runs it
    store.remove_todo("n", "me")
    store.remove_todo("m", "me")
    assert {"m", "n"}.isdisjoint(t["id"] for t in store.todos())


def test_a_todos_status_set_by_hand_keeps_its_times(store: Store) -> None:
    store.add_todo(added("t", "T"), "agent", None)
    store.set_todo("t", Status.IN_PROGRESS, None, "me")
    t = row(store, "t")
    assert t["reason"] == "set by me"
    assert isinstance(t["started_at"], float) and t["ended_at"] is None
    store.set_todo("t", Status.COMPLETED, "done by hand", "me")
    t2 = row(store, "t")
    assert t2["started_at"] == t["started_at"] and isinstance(t2["ended_at"], float)
    assert t2["reason"] == "done by hand"
    store.set_todo("t", Status.PENDING, None, "me")
    assert row(store, "t")["ended_at"] == t2["ended_at"]  # pending says nothing of when
    with pytest.raises(UsageError, match="'a' has a kind"):
        store.set_todo("a", Status.COMPLETED, None, "me")


# --- guards ----------------------------------------------------------------------------------


def test_an_armed_guard_keeps_the_run_that_armed_it_first(store: Store, tmp_path: Path) -> None:
    first = begin(store, tmp_path)
    complete(store, "a", first, guards=GuardChange(arm=["u", "nope"]))
    assert row(store, "u")["armed_run"] == first and row(store, "u")["reason"] == ""
    store.end_run(first, RunOutcome.FAILED)
    second = begin(store, tmp_path)
    store.forget(["a"], "again")
    complete(store, "a", second, guards=GuardChange(arm=["u"]))
    assert row(store, "u")["armed_run"] == first  # still owes the first run's failure
    assert [t["id"] for t in store.armed()] == ["u"]


def test_a_guard_that_ran_is_disarmed_and_undoes_its_task(store: Store, tmp_path: Path) -> None:
    run_id = begin(store, tmp_path)
    complete(store, "a", run_id, guards=GuardChange(arm=["u"]))
    complete(store, "u", run_id, guards=GuardChange(disarm="u", undo="a"))
    assert row(store, "u")["armed_run"] is None and row(store, "u")["armed_at"] is None
    a = row(store, "a")
    assert a["status"] == Status.PENDING and "undone" in str(a["reason"])
    logged = transitions_of(store, "b")
    complete(store, "z", run_id, guards=GuardChange(undo="b"))
    assert row(store, "b")["status"] == Status.PENDING  # never done: nothing to undo
    assert transitions_of(store, "b") == logged


def test_a_run_with_no_end_makes_a_guard_due_only_when_counted_as_crashed(
    store: Store, tmp_path: Path
) -> None:
    run_id = begin(store, tmp_path)
    complete(store, "a", run_id, guards=GuardChange(arm=["u"]))
    assert store.due() == []  # the run is going, as far as anyone knows
    assert [t["id"] for t in store.due(unended_crashed=True)] == ["u"]
    store.end_run(run_id, RunOutcome.FAILED)
    assert [t["id"] for t in store.due()] == ["u"]


def test_disarm_skips_each_guard_with_the_reason(store: Store, tmp_path: Path) -> None:
    run_id = begin(store, tmp_path)
    complete(store, "a", run_id, guards=GuardChange(arm=["u"]))
    store.disarm(["u"], "the plan completed: nothing to undo", run_id)
    u = row(store, "u")
    assert u["status"] == Status.SKIPPED and u["reason"] == "the plan completed: nothing to undo"
    assert u["armed_run"] is None and u["armed_at"] is None
    assert store.armed() == []


# --- why a task waits --------------------------------------------------------------------------


def test_note_reason_says_and_unsays_why_a_task_waits(store: Store) -> None:
    logged = transitions_of(store, "a")
    store.note_reason("a", "waits for a GPU")
    assert row(store, "a")["reason"] == "waits for a GPU"
    store.note_reason("a", None)
    assert row(store, "a")["reason"] is None
    assert transitions_of(store, "a") == logged  # no status change, no transition


def test_not_started_is_said_of_pending_plan_tasks_only(store: Store) -> None:
    complete(store, "a", None)
    store.note_not_started(["a", "b", "u"], "the run stopped before it")
    assert row(store, "b")["reason"] == "the run stopped before it"
    assert row(store, "a")["reason"] is None  # done: it did start
    assert row(store, "u")["reason"] != "the run stopped before it"  # a guard waits to guard
    store.note_not_started([], "nothing")
    assert row(store, "b")["reason"] == "the run stopped before it"


# --- what staleness is computed from ---------------------------------------------------------


def test_last_transition_is_the_latest_sequence_number(store: Store, tmp_path: Path) -> None:
    fresh = Store.open(tmp_path / "fresh.db")
    try:
        assert fresh.last_transition() == 0
    finally:
        fresh.close()
    before = store.last_transition()
    complete(store, "a", None)
    with sqlite3.connect(store.path) as conn:
        (latest,) = conn.execute("SELECT max(seq) FROM transitions").fetchone()
    assert store.last_transition() == latest and latest > before


def test_done_marks_and_findings_as_of_each_done_attempt(store: Store, tmp_path: Path) -> None:
    run_id = begin(store, tmp_path)
    assert store.findings_as_of("a", None) == []  # never done
    complete(store, "a", run_id, Finding("k", 1, "ms"), Finding("j", "x"))
    first = store.last_transition()
    store.note("a", Finding("note", "looked fine"), "agent")  # not the task's own: left out
    store.forget(["a"], "again")
    complete(store, "a", run_id, Finding("k", 2, "ms"))
    second = store.last_transition()
    store.transition("b", Status.SKIPPED, "not needed", None)
    marks = store.done_marks()
    assert marks["a"] == DoneMark(second, run_id, "completed")
    assert marks["b"] == DoneMark(store.last_transition(), None, "skipped")
    assert set(marks) == {"a", "b"}
    assert store.findings_as_of("a", first) == [("k", 1, "ms"), ("j", "x", None)]
    assert store.findings_as_of("a", second) == [("k", 2, "ms")]
    assert store.findings_as_of("a", None) == [("k", 2, "ms")]
    assert store.findings_as_of("a", first - 1) == []  # before it was ever done
