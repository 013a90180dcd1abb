"""What is stale in a plan as run: done tasks whose spec changed since they ran, or that are
behind a task they need. Computed at the end of a run and cached in the store's meta, so that
`orch status PLAN` answers from the cache while the plan file and the store are unchanged.
Imports only the store at first: the cache is read on `orch status`'s fast path."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import OrchError
from orchestrator.store.db import SQLITE_ERRORS, DoneMark, Store

if TYPE_CHECKING:
    from orchestrator.plan.model import Plan
    from orchestrator.store.rows import TodoRow

# What the last run found stale, for the plan file (and --var values) it ran, as of the last
# transition then: `orch status PLAN` answers from it while both are unchanged (no plan load).
STALE_KEY = "stale_cache"


def remember_stale(store: Store, plan: Plan, digest: str | None) -> None:
    """At the end of a run: what is stale now, keyed by the plan's digest and the store's last
    transition (a later forget, todo or run moves it, and the cache no longer answers)."""
    if digest is None:
        return
    stale = stale_of(plan, store.todos(), store.done_marks(), store.findings_as_of)
    value = {"digest": digest, "seq": store.last_transition(), "stale": stale}
    store.set_meta(STALE_KEY, json.dumps(value))


def cached_stale(store: Store, digest: str) -> dict[str, Any] | None:
    """What is stale, if the last run's answer still holds for this plan digest; else None.
    `store`: opened with its checks, for the board read next from the same connection."""
    try:
        raw = store.meta(STALE_KEY)
        cached = json.loads(raw) if raw else None
        if not cached or cached["digest"] != digest or cached["seq"] != store.last_transition():
            return None
        return dict(cached["stale"])
    except (*SQLITE_ERRORS, OrchError):
        return None  # the full path says what is wrong
    except (ValueError, TypeError, KeyError):  # a cache damaged or hand-edited: computed anew
        return None


def stale_of(
    plan: Plan,
    rows: Sequence[TodoRow],
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
