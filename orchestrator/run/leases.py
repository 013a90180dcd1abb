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

Within one run, `Leases` keeps what its tasks hold while they run: units of the plan's named
resources (`disk-heavy: 1`: counted, so that with --jobs a task starts only when its units are
free) and members of the host's pools by id (`gpus: 2`: leased, each lease a resource of kind
`lease` in the store until the task ends).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from orchestrator.core.errors import TaskError, TaskTimeout
from orchestrator.core.periodic import every
from orchestrator.kinds.registry import POOL_GROUP, resolve
from orchestrator.kinds.task import PoolUnavailable
from orchestrator.plan.model import PlannedTask
from orchestrator.proc.interrupts import nap
from orchestrator.store.db import Store

LEASE_KIND = "lease"  # a resources row for a pool member (a GPU) leased to a task
NOT_HERE = "not on this host"  # a pool member asked for by id that the host does not have


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


def _heartbeat(log: Any, name: str) -> AbstractContextManager[None]:
    """Log that the ending of `name` goes on, every HEARTBEAT_S seconds, until it returns."""

    def beat(waited: float) -> None:
        log.info("resource.still_ending", resource=name, waited=f"{waited:.0f}s")

    return every(HEARTBEAT_S, beat, f"orch-heartbeat-{name}")


class Leases:
    """What this run's tasks hold while they run. Named units are counted by the loop's thread
    (short, wait_for, take, put_back); pool members are leased by each task's own thread
    (lease, unlease), under `lock`: who holds which member, and whose turn it is to choose."""

    def __init__(self, store: Store, log: Any, run_id: int, named: Mapping[str, int]) -> None:
        self.store, self.log, self.run_id = store, log, run_id
        self.named = named  # the plan's `resources`: name -> units; any other name is a pool
        self.held: Counter[str] = Counter()  # named resource -> units held by running tasks
        self.waiting: dict[str, str] = {}  # task id -> the waiting reason last written
        self.leased: dict[tuple[str, str], str] = {}  # (pool, member) -> the task holding it
        self.lock = threading.Lock()
        # Tasks started together that lease from a pool, in plan order, until their first try:
        # threads reach lease() in any order, the earlier task must choose its members first.
        self.turns: list[str] = []

    # --- named resources (--jobs) --------------------------------------------------------------

    def units(self, task: PlannedTask) -> dict[str, int]:
        """The plan's named resources the task holds (pools are leased by id: lease())."""
        return {
            n: u
            for n, u in task.spec.resources.items()
            if n in self.named and isinstance(u, int)  # validated: plan names are units
        }

    def short(self, task: PlannedTask) -> list[str]:
        """The named resources of which too few units are free for `task` now."""
        return [n for n, u in self.units(task).items() if self.held[n] + u > self.named[n]]

    def wait_for(self, task: PlannedTask, short: list[str], running: Iterable[PlannedTask]) -> None:
        """Say on the board what a ready task waits for (once per change)."""
        holders = [t.id for t in running if set(t.spec.resources) & set(short)]
        why = (
            "waiting for "
            + ", ".join(f"{n} ({self.held[n]} of {self.named[n]} held)" for n in short)
            + (f" by {', '.join(holders)}" if holders else "")
        )
        if self.waiting.get(task.id) != why:  # written once per change, not every look
            self.waiting[task.id] = why
            self.store.note_reason(task.id, why)

    def take(self, task: PlannedTask) -> None:
        """`task` starts: its units are held, its wait is over, and it joins the line of those
        that lease from a pool."""
        self.held.update(self.units(task))
        if self.waiting.pop(task.id, None) is not None:  # its wait is over
            self.store.note_reason(task.id, None)
        if any(n not in self.named for n in task.spec.resources):
            with self.lock:
                self.turns.append(task.id)

    def put_back(self, task: PlannedTask) -> None:
        """`task` ended: its units are free."""
        self.held.subtract(self.units(task))

    # --- pools ---------------------------------------------------------------------------------

    def lease(self, task: PlannedTask) -> dict[str, list[str]]:
        """Members of the pools the task holds (`gpus: 2`): free now by the pool's look and
        not leased to another task of this run; recorded in the store (`lease` resources, so
        a dead run's are released by the next) before the task starts. Until they are free
        the task waits, its reason saying for what, up to its timeout."""
        wanted = {n: v for n, v in task.spec.resources.items() if n not in self.named}
        if not wanted:
            return {}
        self.store.flush()  # the lease may wait
        deadline = None if task.spec.timeout is None else time.monotonic() + task.spec.timeout
        shown = None
        while True:
            with self.lock:
                if turn := task.id not in self.turns[1:]:  # first in line, or not in it
                    self._drop_turn(task.id)
            if not turn:
                time.sleep(0.005)
                continue
            with self.lock:
                granted, why = self.try_lease(wanted)
                if never := [w for w in why if NOT_HERE in w]:
                    raise TaskError("; ".join(never))
                if not why:
                    for name, ids in granted.items():
                        for member in ids:
                            self.leased[(name, member)] = task.id
                            data = {"pool": name, "member": member}
                            self.store.hold(
                                f"{name}:{member}", task.id, LEASE_KIND, self.run_id, data
                            )
                    self.log.info(
                        "task.leased", task=task.id, **{n: ",".join(i) for n, i in granted.items()}
                    )
                    return granted
            text = "waiting for " + "; ".join(why)
            if text != shown:
                self.store.note_reason(task.id, text)
                self.log.info("task.waiting", task=task.id, why=text)
                shown = text
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeout(f"timed out {text}")
            nap(min(resolve(n, POOL_GROUP).every for n in wanted))

    def try_lease(
        self, wanted: dict[str, int | list[int | str]]
    ) -> tuple[dict[str, list[str]], list[str]]:
        """The members to lease now, by pool; else, for each pool short of them, why."""
        granted: dict[str, list[str]] = {}
        why: list[str] = []
        for name, want in wanted.items():
            try:
                members = resolve(name, POOL_GROUP)().look()
            except PoolUnavailable as exc:
                why.append(f"{name}: {exc}")
                continue
            free = [
                m for m, busy in members.items() if busy is None and (name, m) not in self.leased
            ]
            if isinstance(want, int):
                if len(free) >= want:
                    granted[name] = free[:want]
                else:
                    taken = [
                        f"{m} ({members[m] or 'leased to ' + self.leased[(name, m)]})"
                        for m in members
                        if m not in free
                    ]
                    why.append(
                        f"{want} {name} ({len(free)} free of {len(members)}: {'; '.join(taken)})"
                    )
                continue
            asked = [str(m) for m in want]
            if unknown := [m for m in asked if m not in members]:
                why.append(
                    f"{name} {', '.join(unknown)}: {NOT_HERE} "
                    f"(it has {', '.join(members) or 'none'})"
                )
            elif held := [m for m in asked if m not in free]:
                why.append(
                    f"{name} "
                    + "; ".join(
                        f"{m}: {members[m] or 'leased to ' + self.leased[(name, m)]}" for m in held
                    )
                )
            else:
                granted[name] = asked
        return granted, why

    def unlease(self, task: PlannedTask, granted: dict[str, list[str]]) -> None:
        with self.lock:
            for name, ids in granted.items():
                for member in ids:
                    self.leased.pop((name, member), None)
                    self.store.release(f"{name}:{member}", task.id, f"{task.id} ended")

    def end_turn(self, task_id: str) -> None:
        """`task` ended, perhaps before its lease (skipped, blocked, interrupted): the next in
        line chooses."""
        with self.lock:
            self._drop_turn(task_id)

    def _drop_turn(self, task_id: str) -> None:
        if task_id in self.turns:
            self.turns.remove(task_id)
