"""Task statuses and the transitions allowed between them: one table, checked by the store."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"  # not run yet in this plan's life (or forgotten: orch forget)
    IN_PROGRESS = "in_progress"  # an orchestrator is running it now (or died while it did)
    COMPLETED = "completed"  # ran and succeeded; its findings are recorded
    FAILED = "failed"  # ran and failed; last_error says why
    SKIPPED = "skipped"  # its `when` was false
    BLOCKED = "blocked"  # a dependency did not complete, or a precondition failed
    INTERRUPTED = "interrupted"  # the orchestrator died or was stopped mid-task
    WAITING = "waiting"  # an approval gate no one has approved yet (for this plan, these findings)

    @property
    def done(self) -> bool:
        """Satisfies the tasks that need it."""
        return self in (Status.COMPLETED, Status.SKIPPED)


class RunOutcome(StrEnum):
    """How a run ended: the `outcome` of its runs row (None there while it goes on)."""

    COMPLETED = "completed"  # every task in its scope done
    FAILED = "failed"  # a task in its scope not done (failed, blocked), or a fault stopped it
    WAITING = "waiting"  # stopped at an approval gate no one has approved yet: nothing failed
    INTERRUPTED = "interrupted"  # stopped by a signal (Ctrl-C, SIGTERM)
    CRASHED = "crashed"  # its orchestrator died unrecorded: a later orch closed it


_NOT_RUNNING = {s for s in Status if s is not Status.IN_PROGRESS}

ALLOWED: dict[Status, frozenset[Status]] = {
    # Anything not running may start, be skipped or blocked on a later run, or fail to start
    # (a ${...} that cannot be resolved).
    # `orch forget` / `orch reset` make a task not running pending again.
    **{
        s: frozenset(
            {
                Status.IN_PROGRESS,
                Status.SKIPPED,
                Status.BLOCKED,
                Status.FAILED,
                Status.PENDING,
                Status.WAITING,
            }
        )
        for s in _NOT_RUNNING
    },
    Status.IN_PROGRESS: frozenset({Status.COMPLETED, Status.FAILED, Status.INTERRUPTED}),
}

# A todo with no kind runs nothing: whoever keeps it (an agent, a person) moves it anywhere.
MANUAL: dict[Status, frozenset[Status]] = {s: frozenset(Status) for s in Status}

# The statuses of the todowrite tool's schema (opencode / Claude Code todo lists).
TODOWRITE: dict[Status, str] = {
    Status.PENDING: "pending",
    Status.IN_PROGRESS: "in_progress",
    Status.COMPLETED: "completed",
    Status.SKIPPED: "cancelled",
    Status.FAILED: "pending",  # still to do: the agent's view of a failed step
    Status.BLOCKED: "pending",
    Status.INTERRUPTED: "pending",
    Status.WAITING: "pending",
}
