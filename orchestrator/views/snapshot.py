"""One consistent look at a store: its tasks, findings, latest run and what is stale.

What `orch status`, `--watch` and the MCP server's board show. Taking it closes the runs
whose orchestrator died (when no live run holds the lock), so a board never shows a dead
run's task as running.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.errors import OrchError
from orchestrator.store.db import Store
from orchestrator.views.board import Snapshot as Snapshot  # where the views take it from

if TYPE_CHECKING:
    from orchestrator.plan.model import Plan


def take(
    path: Path,
    plan: Plan | None,
    stale: Mapping[str, Sequence[str]] | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> Snapshot:
    """The store at `path` now; with `plan` (and no `stale` given), what is stale."""
    store = Store.open(path, create=False)
    try:
        return take_open(store, plan, stale, warn)
    finally:
        store.close()


def take_open(
    store: Store,
    plan: Plan | None,
    stale: Mapping[str, Sequence[str]] | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> Snapshot:
    """`take` of a store opened (with its checks) by the caller, who closes it."""
    close_dead_runs_if_free(store, warn)
    snap = read(store, store.path, plan.name if plan else store.path.stem, stale)
    if stale is None and plan is not None:
        from orchestrator.run.stale import stale_of
        from orchestrator.run.todos import plan_as_run

        ran = plan_as_run(plan, store)
        found = stale_of(ran, store.todos(), store.done_marks(), store.findings_as_of)
        snap = snap._replace(stale=found)
    return snap


def read(
    store: Store, path: Path, name: str, stale: Mapping[str, Sequence[str]] | None = None
) -> Snapshot:
    """The board of an open store as it is, closing nothing (`name`: when the store has none)."""
    runs = store.runs(1)
    rows, findings = store.board(), store.findings()
    return Snapshot(
        store.plan_name() or name, path, rows, findings, runs[0] if runs else None, stale
    )


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
