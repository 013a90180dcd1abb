"""The records a caller hands the store, or gets from it besides rows (rows.py): what the plan
says of a task, who runs, what a transition does to guards, when a task last became done.

No `from __future__ import annotations` here, unlike the rest of the engine: a NamedTuple's
string annotations are each compiled into a ForwardRef when the class is made, at every start
of orch (~0.3 ms for these four); real types cost nothing more.
"""

from collections.abc import Sequence
from typing import NamedTuple

from orchestrator.core.guards import GuardRole

PLAN_ORIGIN = "plan"


class DoneMark(NamedTuple):
    """When a task last became done: its transition's seq, the run, and how (completed/skipped)."""

    seq: int
    run_id: int | None
    status: str


class TodoSpec(NamedTuple):
    """What the plan says about a task, as the store keeps it."""

    id: str
    position: int
    title: str
    priority: str
    kind: str
    needs: Sequence[str]
    spec_hash: str
    spec: str  # JSON of what the hash covers
    origin: str = PLAN_ORIGIN  # or who added it (todos.py)
    role: GuardRole | None = None  # a compensation or a `finally` task; None: the plan's flow
    protects: str | None = None  # the task a compensation undoes


class GuardChange(NamedTuple):
    """What a transition does to compensations and `finally` tasks, in its own transaction:
    `arm` them (the protected task completed; a run began its work), `disarm` one (it ran),
    and `undo`: the task a compensation undid is pending again, so the next run redoes it."""

    arm: Sequence[str] = ()
    arm_reason: str = ""
    disarm: str | None = None
    undo: str | None = None


class RunIdentity(NamedTuple):
    """Who runs: enough to tell later, from another process, whether it is still alive."""

    pid: int
    started_at: float
    host: str
    boot_id: str
