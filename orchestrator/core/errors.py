"""One error hierarchy; each error knows the exit code the CLI turns it into.

Leaf module: imports nothing from the project.
"""

from collections.abc import Iterable
from typing import Any, NamedTuple

EXIT_OK = 0
EXIT_FAILED = 1  # a task failed or is blocked; `orch report`: a kind's section failed
EXIT_USAGE = 2  # bad plan or bad usage
EXIT_LOCKED = 3  # another live `orch run` holds the store
EXIT_WAITING = 4  # stopped at an approval gate: `orch approve PLAN ID`, then run again
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM, as a shell reports SIGINT


class OrchError(Exception):
    """Base of every error the CLI reports without a traceback."""

    exit_code = EXIT_USAGE


class PlanIssue(NamedTuple):
    """One problem in a plan file, located for the user."""

    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


class PlanError(OrchError):
    """A plan failed to load or validate; carries every problem found, not just the first."""

    def __init__(self, issues: list[PlanIssue]) -> None:
        self.issues = sorted(issues, key=lambda i: (i.file, i.line or 0))
        super().__init__("\n".join(str(i) for i in self.issues))

    def as_json(self) -> dict[str, Any]:
        """The one JSON shape of a bad plan: `--json` of every command, the agent's tools."""
        problems = [{"file": i.file, "line": i.line, "message": i.message} for i in self.issues]
        return {"ok": False, "problems": problems}


class UsageError(OrchError):
    """The command line asks for something impossible (unknown task id, no store found, ...)."""


class StoreLocked(OrchError):
    """Another live orchestrator holds the store."""

    exit_code = EXIT_LOCKED


class StoreError(OrchError):
    """The store cannot be used (different plan, newer schema, corrupt)."""


class UnsafePath(OrchError):
    """orch's folder, or a file it would write, could send its writes elsewhere: a link, a
    folder another user owns or may write (core/safeopen.py)."""


class TaskError(Exception):
    """Raised by a task (or a precondition) to fail with a plain message and no traceback."""


class TaskTimeout(TaskError):
    """The task ran past its `timeout`."""


class TemplateError(TaskError):
    """A `${...}` reference could not be resolved when the task started."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: end the running group, record, exit 130."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or nothing."""
    if len(word) > MAX_SUGGEST_CHARS:  # no name is this long, and difflib is quadratic in it
        return ""
    import difflib  # only on a typo: ~1 ms of every CLI start otherwise

    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


MAX_SUGGEST_CHARS = 128


class Suggester:
    """did_you_mean for one load, with a budget of candidates compared: each call costs
    O(choices), so thousands of unknown names among thousands of ids would be O(n^2). A small
    plan never runs out; past the budget, errors come without a suggestion."""

    def __init__(self, budget: int = 20_000) -> None:
        self.budget = budget

    def __call__(self, word: str, choices: Iterable[str]) -> str:
        candidates = list(choices)
        if len(candidates) > self.budget:
            return ""
        self.budget -= len(candidates)
        return did_you_mean(word, candidates)
