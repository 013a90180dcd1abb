"""The rows that leave the store (store/rows.py): plain dicts whose keys are the TypedDicts',
statuses as Status, and a module that `orch status` never imports at run time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.core.findings import Finding
from orchestrator.core.guards import GuardRole
from orchestrator.core.status import RunOutcome, Status
from orchestrator.store import rows
from orchestrator.store.db import GuardChange, RunIdentity, Store, TodoSpec
from orchestrator.store.schema import BOARD_COLUMNS, COLUMNS


def test_each_row_type_has_its_tables_columns() -> None:
    whole: dict[str, Any] = {
        "runs": rows.RunRow,
        "todos": rows.TodoRow,
        "transitions": rows.TransitionRow,
        "findings": rows.FindingRow,
        "resources": rows.HeldResourceRow,
        "approvals": rows.ApprovalRow,
    }
    for table, shape in whole.items():
        assert set(shape.__required_keys__) == set(COLUMNS[table]), table
    assert set(rows.ListedTodoRow.__required_keys__) == {*COLUMNS["todos"], "run_attempts"}
    assert set(rows.BoardRow.__required_keys__) == {*BOARD_COLUMNS, "run_attempts"}
    assert set(BOARD_COLUMNS) < set(COLUMNS["todos"])
    assert set(rows.ResourceRow.__required_keys__) == set(COLUMNS["resources"]) - {"data"}


def test_reads_give_plain_dicts_of_those_keys_with_statuses_as_status(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    try:
        who = RunIdentity(1, 2.0, "host", "boot")
        run_id = store.begin_run(who, "plan.yaml", "orch run", tmp_path)
        specs = [
            TodoSpec("a", 0, "a", "medium", "shell", (), "h", "{}"),
            TodoSpec("u", 1, "u", "medium", "shell", (), "h", "{}", role=GuardRole.ON_FAILURE),
        ]
        store.sync_plan(specs, run_id)
        store.transition("a", Status.IN_PROGRESS, None, run_id)
        store.transition(
            "a",
            Status.COMPLETED,
            None,
            run_id,
            [Finding("k", 1, None, None)],
            GuardChange(arm=["u"]),
        )
        store.hold("srv", "a", "shell", run_id, {"pid": 1})
        store.approve("a", "me", None, "p", "f", "orch approve")
        store.end_run(run_id, RunOutcome.FAILED)

        transitions, findings = store.events_after(0, 0)
        got: list[tuple[type[Any], list[Any]]] = [
            (rows.ListedTodoRow, store.todos()),
            (rows.BoardRow, store.board()),
            (rows.TodoRow, [store.todo("a"), *store.armed(), *store.due()]),
            (rows.RunRow, [*store.runs(), *store.runs_after(0, set())]),
            (rows.TransitionRow, [*transitions, *store.transitions()]),
            (rows.FindingRow, findings),
            (rows.ResourceRow, store.resources()),
            (rows.HeldResourceRow, store.held()),
            (rows.ApprovalRow, [store.latest_approval("a")]),
        ]
        for shape, found in got:
            assert found, shape
            for row in found:
                assert type(row) is dict and set(row) == set(shape.__required_keys__), shape
        assert all(type(t["status"]) is Status for t in store.todos())
        shown = [{k: t[k] for k in rows.BoardRow.__required_keys__} for t in store.todos()]
        assert store.board() == shown  # the same tasks, in the same order
        assert all(type(t["to_status"]) is Status for t in transitions)
        assert transitions[0]["from_status"] is None
        assert [t["id"] for t in store.due()] == ["u"]
        guard = store.todo("u")
        assert guard is not None and guard["role"] == GuardRole.ON_FAILURE
        assert store.runs()[0]["outcome"] == "failed"  # the text stored, as before
    finally:
        store.close()


def test_rows_imports_the_standard_library_and_core_only() -> None:
    tree = ast.parse(Path(rows.__file__).read_text())
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    engine = {m for m in imported if m.startswith("orchestrator")}
    assert all(m.startswith("orchestrator.core.") for m in engine), engine
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in imported - engine)


def test_orch_status_does_not_import_rows_at_run_time(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.close()
    code = (
        "import sys\nfrom orchestrator.shortcut import main\n"
        "sys.argv = ['orch', 'status', '--store', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "assert 'orchestrator.store.rows' not in sys.modules, 'rows imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s.db")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
