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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.kinds.registry import resolve
from orchestrator.store.db import Store

LEASE_KIND = "lease"  # a resources row for a pool member (a GPU) leased to a task


def release_all(store: Store, log: Any, why: str) -> None:
    """End every resource still held, through its kind; one that fails stays held (and is
    tried again next run), the others are still ended."""
    for row in store.held():
        if row["kind"] == LEASE_KIND:  # a pool member a task held: nothing runs to be ended
            store.release(row["name"], None, why)
            continue
        kind, data = resolve(row["kind"]), json.loads(row["data"])
        log.warning(  # before the wait, which can be long: what it waits for, and how long
            "resource.ending",
            resource=row["name"],
            task=row["task_id"],
            why=why,
            how=kind.releasing(data),
        )
        try:
            with _heartbeat(log, row["name"]):
                done = kind.release(data)
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


HEARTBEAT_S = 5.0  # a silent wait longer than this looks like a hang at 2 a.m.


@contextmanager
def _heartbeat(log: Any, name: str) -> Iterator[None]:
    """Log that the ending of `name` goes on, every HEARTBEAT_S seconds, until it returns."""
    done, started = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            log.info(
                "resource.still_ending", resource=name, waited=f"{time.monotonic() - started:.0f}s"
            )

    thread = threading.Thread(target=beat, name=f"orch-heartbeat-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
