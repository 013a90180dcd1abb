"""Resources: what a task leaves running for later tasks (an inference server, say).

A task holds one through `ctx.hold(name, data)`; the store keeps `data` (what the task's kind
needs to end it: a pid, a unit name) from that moment, committed, so the resource is never
lost track of. It is let go by a later task (`ctx.release(name)`, e.g. `server.stop`), or by
the engine: at the end of the run that holds it, whatever its outcome, and at the start of the
next run if the holder died. The engine ends it through the holding kind's `Task.release`; it
knows nothing of what a resource is.

Decision: nothing a plan started outlives `orch run` (at 2 a.m. a forgotten server holding
eight GPUs is worse than relaunching one). The price is on resume: a completed task whose
resource is not held now (the engine ended it, or a releasing task let it go) is run again
when a task that needs it has still to run, and the releasers after those users
(selection.py).
"""

from __future__ import annotations

import json
from typing import Any

from .registry import resolve
from .store import Store

LEASE_KIND = "lease"  # a resources row for a pool member (a GPU) leased to a task


def release_all(store: Store, log: Any, why: str) -> None:
    """End every resource still held, through its kind; one that fails stays held (and is
    tried again next run), the others are still ended."""
    for row in store.held():
        if row["kind"] == LEASE_KIND:  # a pool member a task held: nothing runs to be ended
            store.release(row["name"], None, why)
            continue
        try:
            done = resolve(row["kind"]).release(json.loads(row["data"]))
        except Exception as exc:  # a kind's bug must not keep the rest running
            log.error(
                "resource.release_failed",
                resource=row["name"],
                task=row["task_id"],
                error=f"{type(exc).__name__}: {exc}",
            )
            continue
        store.release(row["name"], None, why)
        log.warning(
            "resource.released", resource=row["name"], task=row["task_id"], why=why, done=done
        )
