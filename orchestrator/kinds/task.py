"""What task authors write against: Task, Precondition, Pool, Context, Finding.

A task class knows its parameters (a pydantic model, validated when the plan loads) and how to
do one thing; it knows nothing of SQL, the board or the other tasks. It reports through the
Context: findings, the processes it starts, progress.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from orchestrator.core.durations import parse_duration
from orchestrator.core.errors import TaskError
from orchestrator.core.findings import Finding, FindingValue, parse_finding_line
from orchestrator.core.safeopen import open_for_append
from orchestrator.proc.printed import printed_into
from orchestrator.proc.spawn import LOG_LIMIT, ProcessResult, run_process
from orchestrator.proc.tasklog import log_lines

if TYPE_CHECKING:
    from orchestrator.kinds.sections import Section
    from orchestrator.proc.stalls import StallPolicy, StallReport

# A params field written as `30s`, `5m`, `1h30m` or seconds; pydantic holds it as float seconds.
Duration = Annotated[float, BeforeValidator(parse_duration)]


def as_list(value: object) -> object:
    """A params field that takes one item or a list: `needs: a` is `needs: [a]`."""
    return [value] if isinstance(value, str) else value


def _argv_items(value: object) -> object:
    """`[--max-model-len, 512]`: YAML makes 512 an int; an argv item is its text."""
    if isinstance(value, list):
        return [
            str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value
        ]
    return value


# A params field that is an argv list: numbers YAML parsed are taken as their text.
Argv = Annotated[list[str], BeforeValidator(_argv_items)]


def _not_an_option(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(
            f"{value[:60]!r} starts with '-': the program would read it as an option, not as "
            f"this value (a path can be written ./{value[:60]})"
        )
    return value


# A params field a kind passes to a program as one argv item, a positional or after its flag
# (`vllm serve MODEL`): never an option, even when a finding wrote it (`--trust-remote-code`).
OptionValue = Annotated[str, AfterValidator(_not_an_option)]


def _command_shape(value: object) -> object:
    """One clear error for `command: true` instead of one per member of the union."""
    if not isinstance(value, str | list):
        raise ValueError(
            f"a command is a string (run by bash) or an argv list, not "
            f"{type(value).__name__} {value!r}: quote it"
        )
    return value


# A command: a string run by a shell, or an argv list run directly.
Command = Annotated[str | Argv, BeforeValidator(_command_shape)]


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


P = TypeVar("P", bound=BaseModel)


class ContextSink(Protocol):
    """Where a Context sends what it learns; the run loop implements it."""

    def finding(self, finding: Finding) -> None: ...
    def process_started(self, pgid: int, started_at: float) -> None: ...
    def progress(self, message: str) -> None: ...
    def hold(self, name: str, data: dict[str, Any]) -> None: ...
    def held(self, name: str) -> dict[str, Any] | None: ...
    def release(self, name: str) -> None: ...
    def stalled(self, report: StallReport) -> None: ...


@dataclass
class Context:
    """Handed to a running task: where to log, how long it may take, how to report."""

    task_id: str
    attempt: int
    run_id: int
    log_path: Path
    deadline: float | None  # time.monotonic() value, or None for no timeout
    sink: ContextSink
    env: Mapping[str, str] = field(default_factory=dict)  # marks processes as this task's
    approval: Mapping[str, Any] | None = None  # an approval gate's, once approved
    stall: StallPolicy | None = None  # the task's stall_after and on_stall (stalls.py)
    timeout: float | None = None  # the task's own, in seconds, to name it (deadline is when)

    def finding(
        self, key: str, value: FindingValue, unit: str | None = None, note: str | None = None
    ) -> None:
        """Record a finding; it is committed with the task's completion."""
        self.sink.finding(Finding(key, value, unit, note))

    def progress(self, message: str) -> None:
        """Say what a long wait is waiting for (shown on the terminal, kept in the run log)."""
        self.sink.progress(message)

    def hold(self, name: str, data: dict[str, Any]) -> None:
        """Record that this task leaves `name` running for later tasks (run/leases.py);
        `data` (JSON) is what this kind's `release` needs to end it. Committed at once."""
        self.sink.hold(name, data)

    def held(self, name: str) -> dict[str, Any] | None:
        """The data of a resource some task holds now, or None."""
        return self.sink.held(name)

    def release(self, name: str) -> None:
        """Record that this task has ended the resource `name`."""
        self.sink.release(name)

    def stalled(self, report: StallReport) -> None:
        """Record a stall of this task's processes: the `stalled` finding (committed at once)
        and a line in the task's log naming the evidence file. `ctx.run` calls it; a kind that
        waits on processes of its own (server.launch) calls it from its StallWatcher."""
        self.log(f"[orch: stalled: {report.summary}; evidence: {report.evidence or 'not written'}]")
        self.sink.stalled(report)

    def log(self, text: str) -> None:
        """Append `text` (a line, or lines) to this task's log: what `orch logs ID` shows."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open_for_append(self.log_path) as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def remaining(self) -> float | None:
        """Seconds left before the task's timeout, or None."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        success_codes: Sequence[int] = (0,),
        grace: float = 10.0,
        log_limit: int | None = LOG_LIMIT,
    ) -> ProcessResult:
        """Run argv in its own process group, output appended to this task's log.

        Findings the process prints (see parse_finding_line) are recorded. A non-success exit
        raises TaskError with the tail of the output; the deadline and Ctrl-C end the whole
        group (SIGTERM, then SIGKILL after `grace` seconds).
        """
        result = run_process(
            argv,
            log_path=self.log_path,
            env={**(env or {}), **self.env},
            cwd=cwd,
            deadline=self.deadline,
            timeout=self.timeout,
            grace=grace,
            on_start=self.sink.process_started,
            on_wait=self.sink.progress,
            log_limit=log_limit,
            stall=self.stall,
            on_stall=self.stalled,
        )
        last_words = self._output(result.lines())
        if result.returncode not in success_codes:
            # The process's own last words say most at 2 a.m.; the command line is in the log.
            raise TaskError(
                f"{result.describe()}: {last_words[:300]}"
                if last_words
                else f"{result.describe()} from {shlex.join(argv)[:200]}"
            )
        return result

    @contextmanager
    def printing(self) -> Iterator[None]:
        """What Python code run in this thread prints while the block runs (print, sys.stdout
        and sys.stderr, from threads it starts too) is this task's output, as a process's is:
        appended to its log masked, its `::finding` lines recorded (proc/printed.py)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            with printed_into(self.log_path):
                yield
        finally:
            # After a failure too, as a failed process's findings are; not after Ctrl-C.
            if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                self._output(log_lines(self.log_path, offset))

    def _output(self, lines: Iterable[str]) -> str:
        """Record the findings among a task's output lines; returns the last other line that
        says something (a failure's last words)."""
        last_words = ""  # one pass: a server's log can be large
        for line in lines:
            if (found := parse_finding_line(line)) is not None:
                self.sink.finding(found)
            elif line.strip() and not line.startswith("::"):
                last_words = line
        return last_words


class Task(Generic[P]):
    """Base of every task kind. Subclasses set `Params` and implement `run`."""

    Params: ClassVar[type[BaseModel]] = NoParams
    # Params a shell or an interpreter parses: shell text, or an argv list. No finding may be
    # in them (plan/trust.py); a var spliced into shell text must be an inert word.
    shell_params: ClassVar[frozenset[str]] = frozenset()
    # Environment mappings the process gets: where a finding reaches it as data ("$NAME"),
    # never in a variable's name nor in one that chooses code (trust.CODE_ENV).
    env_params: ClassVar[frozenset[str]] = frozenset()
    # Filesystem paths the task writes or reads: one built from a finding stays inside the
    # folder written before it (confine.py).
    path_params: ClassVar[frozenset[str]] = frozenset()
    # Params that name code to run or what gets installed (a function, a module, an
    # interpreter, a venv, a package, a program, its flags): no finding may be in them.
    code_params: ClassVar[frozenset[str]] = frozenset()
    # The param naming a resource this kind lets go (ctx.release), e.g. "server" for
    # server.stop: a revived holder's releasers run again after its users (selection.py).
    releases: ClassVar[str | None] = None
    # Its completion is a state of the host (a service or server stopped, a process ended,
    # GPUs free, a gate passed) that later tasks need for order, not a result they read:
    # done again (a compensation undid it, a revival), it makes none of them stale unless
    # they read its findings (selection.Freshness).
    state_only: ClassVar[bool] = False

    def __init__(self, params: P) -> None:
        self.params = params

    def run(self, ctx: Context) -> None:
        """Do the work; raise TaskError to fail with a plain message."""
        raise NotImplementedError

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        """What `orch report` shows for a task of this kind beyond the board: figures and text
        made from its latest attempt's findings (orchestrator.views.report.Section). Called only by
        `orch report`, so a kind may import its plotting code here."""
        return ()

    @classmethod
    def release(cls, data: dict[str, Any]) -> str:
        """End a resource a task of this kind held (ctx.hold) and no task released; called by
        the engine at the end of the run or after a crash. Returns what it did, for the log."""
        raise NotImplementedError(f"{cls.__name__} holds resources but cannot release them")

    @classmethod
    def releasing(cls, data: dict[str, Any]) -> str:
        """What `release(data)` will do and how long it may wait, logged before it starts."""
        return ""


@dataclass(frozen=True)
class CheckResult:
    """A precondition's verdict and what it saw, e.g. 'port 8000 is held by pid 4121 (python)'."""

    ok: bool
    found: str


class Precondition(Generic[P]):
    """Base of every precondition kind: a read-only check of the host."""

    Params: ClassVar[type[BaseModel]] = NoParams
    shell_params: ClassVar[frozenset[str]] = frozenset()  # as Task's
    env_params: ClassVar[frozenset[str]] = frozenset()
    path_params: ClassVar[frozenset[str]] = frozenset()
    code_params: ClassVar[frozenset[str]] = frozenset()  # as Task's
    # Only looks (NVML, systemd, sockets, the file system): `orch plan` may call it. False for
    # a check that runs the plan's own code (`command`), which a dry run must not.
    read_only: ClassVar[bool] = True

    def __init__(self, params: P) -> None:
        self.params = params

    def check(self) -> CheckResult:
        raise NotImplementedError


class PoolUnavailable(Exception):
    """A pool cannot say which of its members are free now (no NVML, say): the message says
    why; a task waiting on it waits, with this reason on the board."""


class Pool:
    """Resources the host has by id, that a task holds while it runs (`resources: {gpus: 2}`
    or `{gpus: [0, 1]}`): the engine leases ids that `look` says are free and that no other
    task of the run holds, records the lease in the store, and hands the task `env(ids)`."""

    every: ClassVar[float] = 2.0  # seconds between looks while a task waits for members

    def look(self) -> dict[str, str | None]:
        """Every member by id, in the order to lease them: None if free now, else what holds
        it (`GPU 3 holds 71.2 GiB: pid 4121 ...`). PoolUnavailable if it cannot tell."""
        raise NotImplementedError

    def env(self, ids: Sequence[str]) -> dict[str, str]:
        """What the processes of a task holding `ids` are told (CUDA_VISIBLE_DEVICES)."""
        return {}
