"""`orch events`: every transition, finding and run of a store as it happens, from any process.

The store's append-only tables are the feed: `transitions` and `findings` carry a sequence
number each, so a reader keeps two cursors and asks for what came after them; runs are
followed by id and by their end. A reader holds no lock and writes nothing (WAL: it never
blocks the run it watches). Events are dicts of the documented schema `orch.event/v1`:

- `{"type": "transition", "task", "from", "to", "reason", "run", "attempt", "at", "seq"}`
  (`type` is `changed` when from == to: a task added again, removed, edited);
- `{"type": "finding", "task", "key", "value", "unit", "note", "author", "run", "attempt", ...}`;
- `{"type": "run", "run", "state": "started" | <outcome>, "pid", "at"}`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.findings import Finding, summarize
from orchestrator.store.db import Store, decode
from orchestrator.views.board import iso

if TYPE_CHECKING:
    from orchestrator.store.rows import RunRow

EVENT_SCHEMA = "orch.event/v1"
POLL_S = 0.2


@dataclass
class Cursor:
    """Where a reader is: the last transition and finding seen, the runs seen and open."""

    transition: int = 0
    finding: int = 0
    run: int = 0
    open_runs: set[int] = field(default_factory=set)


def read(store: Store, cursor: Cursor) -> list[dict[str, Any]]:
    """Events after `cursor`, oldest first; moves the cursor past them."""
    transitions, findings = store.events_after(cursor.transition, cursor.finding)
    events: list[tuple[float, int, dict[str, Any]]] = []
    for t in transitions:
        cursor.transition = t["seq"]
        changed = t["from_status"] is not None and t["from_status"] == t["to_status"]
        events.append(
            (
                t["at"],
                0,
                {
                    "type": "changed" if changed else "transition",
                    "task": t["task_id"],
                    "from": t["from_status"],
                    "to": t["to_status"],
                    "reason": t["reason"],
                    "run": t["run_id"],
                    "attempt": t["attempt"],
                    "at": iso(t["at"]),
                    "seq": t["seq"],
                },
            )
        )
    for f in findings:
        cursor.finding = f["seq"]
        events.append(
            (
                f["at"],
                1,
                {
                    "type": "finding",
                    "task": f["task_id"],
                    "key": f["key"],
                    "value": decode(f["value"]),
                    "unit": f["unit"],
                    "note": f["note"],
                    "author": f["author"],
                    "run": f["run_id"],
                    "attempt": f["attempt"],
                    "at": iso(f["at"]),
                    "seq": f["seq"],
                },
            )
        )
    for r in store.runs_after(cursor.run, cursor.open_runs):
        if r["id"] > cursor.run:
            cursor.run = r["id"]
            events.append((r["started_at"], -1, _run_event(r, "started", r["started_at"])))
            cursor.open_runs.add(r["id"])
        if r["ended_at"] is not None and r["id"] in cursor.open_runs:
            cursor.open_runs.discard(r["id"])
            events.append((r["ended_at"], 2, _run_event(r, r["outcome"], r["ended_at"])))
    events.sort(key=lambda e: (e[0], e[1]))
    return [{"schema": EVENT_SCHEMA, **e} for _, _, e in events]


def _run_event(r: RunRow, state: str | None, at: float) -> dict[str, Any]:
    return {"type": "run", "run": r["id"], "state": state, "pid": r["pid"], "at": iso(at)}


def follow(path: Path, last: int | None, keep_following: bool) -> Iterator[dict[str, Any]]:
    """The `last` events recorded so far (all: None), then, with `keep_following`, each new
    one as it is committed, until the caller stops."""
    while not path.exists():
        if not keep_following:
            Store.open(path, create=False)  # the error that says there is no store
        time.sleep(POLL_S)
    store = Store.open(path, create=False)
    try:
        cursor = Cursor()
        backlog = read(store, cursor)
        yield from backlog if last is None else backlog[len(backlog) - last :] if last else []
        while keep_following:
            time.sleep(POLL_S)
            yield from read(store, cursor)
    finally:
        store.close()


def format_event(e: dict[str, Any]) -> str:
    """One line: `14:02:07  #3 bench_base  in_progress -> completed  (why)`."""
    at = (e["at"] or "")[11:19]
    run = f"#{e['run']}" if e.get("run") else "  "
    if e["type"] == "run":
        return f"{at} {run} run {e['state']} (pid {e['pid']})"
    if e["type"] == "finding":
        finding = Finding(e["key"], e["value"], e["unit"], e["note"], e["author"])
        return f"{at} {run} {e['task']}  {summarize([finding])}"
    why = f"  ({e['reason']})" if e["reason"] else ""
    if e["type"] == "changed":
        return f"{at} {run} {e['task']}{why}"
    return f"{at} {run} {e['task']}  {e['from'] or 'new'} -> {e['to']}{why}"
