"""What a guard (a compensation, `on_failure`, or a `finally` task) does, in words: the one
source for the board, `orch plan`, the arming and undoing transitions, the run's log and the
errors that name a guard. Imports only the standard library, so `orch status` stays fast."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class GuardRole(StrEnum):
    """What a guard is: the `role` of its todos row (None there: a step of the plan's flow)."""

    ON_FAILURE = "on_failure"  # a compensation: undoes the task it `protects` if the plan fails
    FINALLY = "finally"  # a `finally` task: runs at the end of every run that did work


def does(role: str | None, protects: str | None) -> str:
    """What it is for: `undoes X if the plan fails after it` (a compensation of X) or `runs at
    the end of the run` (a `finally` task)."""
    if role == GuardRole.FINALLY:
        return "runs at the end of the run"
    return f"undoes {protects} if the plan fails after it"


def note(role: str | None, protects: str | None, armed_run: int | None) -> str:
    """`does`, and the run that armed it, if one did: `armed (run #3): undoes X if ...`."""
    what = does(role, protects)
    return f"armed (run #{armed_run}): {what}" if armed_run is not None else what


def due_because(armed_runs: Iterable[int | None]) -> str:
    """Why armed guards run before anything else (Store.due: their rows' `armed_run`, never
    None there)."""
    runs = ", #".join(str(r) for r in sorted({r for r in armed_runs if r is not None}))
    return f"armed by run #{runs}, which did not complete"


def undone_by(guard_id: str) -> str:
    """The reason of a step a compensation made pending again."""
    return f"undone by {guard_id}"
