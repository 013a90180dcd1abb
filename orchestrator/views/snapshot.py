"""One consistent look at a store: its tasks, findings, latest run and what is stale.

What `orch status`, `--watch` and the MCP server's board show. Taking it closes the runs
whose orchestrator died (when no live run holds the lock), so a board never shows a dead
run's task as running.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import OrchError
from orchestrator.core.findings import Finding
from orchestrator.store.db import Store
from orchestrator.views.board import status_json

if TYPE_CHECKING:
    from orchestrator.plan.model import Plan
    from orchestrator.store.rows import ListedTodoRow, RunRow


@dataclass(frozen=True)
class Snapshot:
    name: str
    path: Path
    rows: Sequence[ListedTodoRow]
    findings: Mapping[str, list[Finding]]
    run: RunRow | None
    stale: Mapping[str, Sequence[str]] | None

    @property
    def going(self) -> bool:
        """A run is going now."""
        return self.run is not None and self.run["ended_at"] is None

    def as_json(self) -> dict[str, Any]:
        """The documented `orch status --json` object."""
        return status_json(
            self.name, str(self.path), self.rows, self.findings, self.run, self.stale
        )


def take(
    path: Path,
    plan: Plan | None,
    stale: Mapping[str, Sequence[str]] | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> Snapshot:
    """The store at `path` now; with `plan` (and no `stale` given), what is stale."""
    store = Store.open(path, create=False)
    try:
        close_dead_runs_if_free(store, warn)
        rows, findings = store.todos(), store.findings()
        runs = store.runs(1)
        name = store.plan_name() or (plan.name if plan else path.stem)
        if stale is None and plan is not None:
            from orchestrator.run.stale import stale_of
            from orchestrator.run.todos import plan_as_run

            ran = plan_as_run(plan, store)
            stale = stale_of(ran, rows, store.done_marks(), store.findings_as_of)
    finally:
        store.close()
    return Snapshot(name, path, rows, findings, runs[0] if runs else None, stale)


def close_dead_runs_if_free(store: Store, warn: Callable[[str], None]) -> None:
    """If no run holds the lock, record the open runs that are dead, and their tasks."""
    if store.readonly or not store.open_runs():
        return  # a read-only store is shown as it is: a dead run stays open in it
    from orchestrator.store.liveness import close_dead_runs
    from orchestrator.store.lock import RunLock

    if RunLock(store.path).try_probe():
        try:
            close_dead_runs(store, holding_lock=False)
        except OrchError as exc:  # a full disk, say: the board is still worth showing
            warn(f"could not record the dead run ({exc})")
