"""One consistent look at a store: its tasks, findings, latest run and what is stale.

What `orch status`, `--watch` and the MCP server's board show. Taking it closes the runs
whose orchestrator died (when no live run holds the lock), so a board never shows a dead
run's task as running.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import OrchError
from orchestrator.core.findings import Finding
from orchestrator.store.db import DoneMark, Store
from orchestrator.views.board import status_json

if TYPE_CHECKING:
    from orchestrator.plan.model import Plan

# What the last run found stale, for the plan file (and --var values) it ran, as of the last
# transition then: `orch status PLAN` answers from it while both are unchanged (no plan load).
STALE_KEY = "stale_cache"


@dataclass(frozen=True)
class Snapshot:
    name: str
    path: Path
    rows: Sequence[sqlite3.Row]
    findings: Mapping[str, list[Finding]]
    run: sqlite3.Row | None
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
            from orchestrator.plan.model import with_added
            from orchestrator.run.todos import added_tasks

            stale = stale_of(
                with_added(plan, added_tasks(store)), rows, store.done_marks(), store.findings_as_of
            )
    finally:
        store.close()
    return Snapshot(name, path, rows, findings, runs[0] if runs else None, stale)


def remember_stale(store: Store, plan: Plan, digest: str | None) -> None:
    """At the end of a run: what is stale now, keyed by the plan's digest and the store's last
    transition (a later forget, todo or run moves it, and the cache no longer answers)."""
    import json

    if digest is None:
        return
    stale = stale_of(plan, store.todos(), store.done_marks(), store.findings_as_of)
    value = {"digest": digest, "seq": store.last_transition(), "stale": stale}
    store.set_meta(STALE_KEY, json.dumps(value))


def cached_stale(path: Path, digest: str) -> dict[str, Any] | None:
    """What is stale, if the last run's answer still holds for this plan digest; else None."""
    import json

    if not path.exists():
        return None
    try:
        store = Store.open(path, create=False)
    except OrchError:
        return None  # the full path says what is wrong
    try:
        raw = store.meta(STALE_KEY)
        cached = json.loads(raw) if raw else None
        if not cached or cached["digest"] != digest or cached["seq"] != store.last_transition():
            return None
        return dict(cached["stale"])
    except (ValueError, TypeError, KeyError):  # a cache damaged or hand-edited: computed anew
        return None
    finally:
        store.close()


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


def stale_of(
    plan: Plan,
    rows: Sequence[sqlite3.Row],
    done: Mapping[str, DoneMark],
    findings_as_of: Callable[[str, int | None], Sequence[Any]],
) -> dict[str, Any]:
    """The done tasks whose spec changed since they ran, or that are behind what they need
    (`done`: store.done_marks()): id -> what changed."""
    from orchestrator.core.status import Status
    from orchestrator.run.selection import Action, Freshness, Selection, decide

    statuses = {r["id"]: Status(r["status"]) for r in rows}
    by_id = {r["id"]: r for r in rows}
    selection = Selection.of(plan)
    freshness = Freshness(plan, done, findings_as_of)
    stale = {}
    for task in plan.tasks:
        d = decide(task, by_id.get(task.id), selection, statuses, freshness)
        if d.action is Action.KEEP and d.stale:
            stale[task.id] = d.stale
    return stale
