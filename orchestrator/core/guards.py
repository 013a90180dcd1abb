"""What a guard (a compensation, `on_failure`, or a `finally` task) does, in words: the one
source for the board, `orch plan`, the arming and undoing transitions, the run's log and the
errors that name a guard. Imports nothing, so `orch status` stays fast."""

from __future__ import annotations

from collections.abc import Iterable


def does(role: str | None, protects: str | None) -> str:
    """What it is for: `undoes X if the plan fails after it` (a compensation of X) or `runs at
    the end of the run` (a `finally` task)."""
    if role == "finally":
        return "runs at the end of the run"
    return f"undoes {protects} if the plan fails after it"


def note(role: str | None, protects: str | None, armed_run: int | None) -> str:
    """`does`, and the run that armed it, if one did: `armed (run #3): undoes X if ...`."""
    what = does(role, protects)
    return f"armed (run #{armed_run}): {what}" if armed_run is not None else what


def due_because(armed_runs: Iterable[int]) -> str:
    """Why armed guards run before anything else (Store.due)."""
    runs = ", #".join(str(r) for r in sorted(set(armed_runs)))
    return f"armed by run #{runs}, which did not complete"


def undone_by(guard_id: str) -> str:
    """The reason of a step a compensation made pending again."""
    return f"undone by {guard_id}"
