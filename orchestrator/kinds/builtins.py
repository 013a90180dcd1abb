"""The engine's generic kinds: `shell`, `python` and `approve` tasks, the `command` precondition."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from orchestrator.core.durations import format_seconds
from orchestrator.core.errors import TaskError, TaskTimeout
from orchestrator.core.findings import Finding
from orchestrator.core.sizes import parse_size
from orchestrator.core.umask import user_umask
from orchestrator.kinds import registry
from orchestrator.kinds.task import CheckResult, Command, Context, Precondition, Task
from orchestrator.proc.interrupts import raise_in_thread
from orchestrator.proc.procfs import terminate_group
from orchestrator.proc.spawn import LOG_LIMIT

# How a command string runs, as GitHub Actions runs a bash step: a failing command in it
# fails the task (`dd: invalid number` must not complete with the last run's file), and so
# does one in a pipe. `-e` has bash's exceptions: a command in `if`, `&&`, `||` or `!`.
# `--norc`: bash started with SSH_CLIENT set and SHLVL unset (orch run over ssh, a fleet host)
# reads ~/.bashrc even when not interactive; a task's PATH (pyenv's shims, a conda env) and its
# time would then depend on how orch was started. Its BASH_ENV, an explicit choice, still counts.
BASH = ("bash", "--norc", "-eo", "pipefail", "-c")


class ShellParams(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    command: Command = Field(
        description="a string run by `bash --norc -eo pipefail -c` (a failing command fails the "
        "task; no ~/.bashrc), or an argv list run directly; no finding in it: put one in `env`"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for the command: where a finding goes, as data "
        '(`env: {SIZE: "${tasks.w.findings.size}"}`, then `dd bs="$SIZE" ...`)',
    )
    cwd: str | None = None
    paths: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict,
        description="paths the command gets as environment variables of these names; one built "
        "from a finding must stay inside the folder written before it, as `cwd` (`paths: {LOG: "
        '/srv/logs/${tasks.x.findings.name}}`, then `cat "$LOG"`): the way to use a finding '
        "as a path in a command, where shell text alone cannot confine it",
    )
    success_codes: list[int] = [0]
    grace: float = Field(10.0, ge=0, description="seconds between SIGTERM and SIGKILL")
    log_limit: Annotated[int, BeforeValidator(parse_size)] = Field(
        LOG_LIMIT, gt=0, description="most output kept in the task log (64MiB): head and tail"
    )


class ShellTask(Task[ShellParams]):
    """Run a command; lines `::finding key=value unit=...` it prints become findings."""

    Params = ShellParams
    shell_params = frozenset({"command"})
    env_params = frozenset({"env", "paths"})
    path_params = frozenset({"cwd", "paths"})

    def run(self, ctx: Context) -> None:
        p = self.params
        argv = [*BASH, p.command] if isinstance(p.command, str) else p.command
        ctx.run(
            argv,
            env={**p.env, **p.paths},
            cwd=p.cwd,
            success_codes=p.success_codes,
            grace=p.grace,
            log_limit=p.log_limit,
        )


class PythonParams(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    function: str = Field(description="module:function, called with `args` as keywords")
    # A factory, not `= {}`: pydantic deep-copies a mutable default at every validation.
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("function")
    @classmethod
    def _findable(cls, target: str, info: ValidationInfo) -> str:
        """`module:function`, both names Python could import; when the plan is validated
        (its loader passes `plan_file`), the module must be found, as the run would look:
        from the plan's folder (registry.search while the plan loads), then sys.path."""
        module, _, name = target.partition(":")
        if not (name.isidentifier() and all(p.isidentifier() for p in module.split("."))):
            raise ValueError(f"{target!r} is not module:function (e.g. mypkg.tools:main)")
        context = info.context or {}
        plan_file = context.get("plan_file")
        memo = context.setdefault("memo", {}).setdefault("python.modules", {})
        if plan_file is not None and not _module_found(module, memo):
            top = module.partition(".")[0]
            raise ValueError(
                f"module {top!r} not found (searched from {plan_file}'s folder and sys.path)"
            )
        return target


def _module_found(module: str, memo: dict[str, bool]) -> bool:
    """Whether the top-level package of `module` can be found, without running any of it.
    Only the top level: finding `pkg.sub` imports `pkg` (its __init__ runs), and validating a
    plan runs none of the user's code; a missing `sub` shows when the task runs. `memo`: the
    load's answers (a search of sys.path costs ~10 us: once a load, not once a task)."""
    top = module.partition(".")[0]
    if top not in memo:
        memo[top] = registry.findable(top)
    return memo[top]


class PythonTask(Task[PythonParams]):
    """Call a Python function in-process.

    It may accept a `ctx` keyword to record findings. What it returns is recorded too: a dict
    as one finding per key, a number or a string as the finding `result`; what it prints goes
    to the task's log, masked, its `::finding` lines recorded as a shell task's. The timeout
    interrupts Python code, not a blocking C call (see _alarm).
    """

    Params = PythonParams
    code_params = frozenset({"function"})

    def run(self, ctx: Context) -> None:
        func = _load_function(self.params.function, registry.where())
        kwargs = dict(self.params.args)
        if _accepts_ctx(func):
            kwargs["ctx"] = ctx
        with ctx.printing(), _alarm(ctx.remaining(), ctx.timeout):
            result = func(**kwargs)
        for finding in _findings_from(result):
            ctx.finding(finding.key, finding.value, finding.unit, finding.note)


@cache  # what an import gives is fixed for the process anyway; failures are not kept
def _load_function(target: str, folders: tuple[str, ...]) -> Callable[..., Any]:
    """`folders`: where the user's modules are looked for (registry.where), part of the key:
    two plans' `helpers:fn` are two functions."""
    try:
        func = registry.import_user(target)
    except (ImportError, AttributeError) as exc:
        raise TaskError(f"cannot load {target!r}: {exc}") from None
    if not callable(func):
        raise TaskError(f"{target!r} is not callable")
    return func  # type: ignore[no-any-return]


@cache
def _accepts_ctx(func: Callable[..., Any]) -> bool:
    try:
        return "ctx" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _findings_from(result: object) -> Iterator[Finding]:
    if isinstance(result, dict):
        for key, value in result.items():
            if isinstance(value, int | float | str | bool):
                yield Finding(str(key), value)
    elif isinstance(result, int | float | str | bool):
        yield Finding("result", result)


@contextmanager
def _alarm(seconds: float | None, timeout: float | None = None) -> Iterator[None]:
    """TaskTimeout in this thread once `seconds` have passed: SIGALRM in the main thread; in
    a worker thread (`--jobs`), where no signal can be handled, an asynchronous exception (as
    Ctrl-C reaches the tasks' threads: Runner.stop_threads). Either lands at the next Python
    instruction, so a blocking C call finishes first."""
    if seconds is None:
        yield
        return
    # The task's timeout, as written, not what was left of it when the call began.
    message = f"timed out after {format_seconds(seconds if timeout is None else timeout)}"
    if threading.current_thread() is not threading.main_thread():
        with _thread_alarm(seconds, message):
            yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TaskTimeout(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _thread_alarm(seconds: float, message: str) -> Iterator[None]:
    tid, lock, state = threading.get_ident(), threading.Lock(), {"done": False}

    def expire() -> None:
        with lock:  # never once the block has ended
            if not state["done"]:
                raise_in_thread(tid, TaskTimeout)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except TaskTimeout as exc:
        raise (exc if exc.args else TaskTimeout(message)) from None
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        # One set just before `done` and not yet raised must not land after the block.
        raise_in_thread(tid, None)


class CommandParams(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    command: str = Field(description="run by `bash -c`; exit 0 means the condition holds")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for the command: where a finding goes (`env: {RATE: "
        '"${tasks.x.findings.rate}"}`, then `test "$RATE" != 0`)',
    )
    timeout: float = Field(60.0, gt=0, description="seconds the command may take")


class CommandSucceeds(Precondition[CommandParams]):
    """Holds when a shell command exits 0."""

    Params = CommandParams
    shell_params = frozenset({"command"})
    env_params = frozenset({"env"})
    read_only = False  # the plan's own command: `orch plan` does not run it

    def check(self) -> CheckResult:
        cmd = self.params.command
        proc = subprocess.Popen(
            [*BASH, cmd],
            env={**os.environ, **self.params.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            umask=user_umask(),
        )
        try:
            output, _ = proc.communicate(timeout=self.params.timeout)
        except subprocess.TimeoutExpired:
            return CheckResult(
                False, f"`{cmd}` did not finish in {format_seconds(self.params.timeout)}"
            )
        finally:  # on a timeout or Ctrl-C too: nothing the check started outlives it
            terminate_group(proc.pid, grace=2.0, leader=proc)
            proc.communicate()
        out = output.strip().splitlines()
        # The command's own last words say most; the command line only when it said nothing.
        found = out[-1][:300] if out else f"`{cmd}` exited {proc.returncode}"
        return CheckResult(proc.returncode == 0, found)


class ApproveParams(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # as the kinds' above

    message: str = Field(description="what the person is asked to approve")
    show: dict[str, Any] = Field(
        {},
        description="findings to show with it (label: ${tasks.ID.findings.KEY}); each must exist",
    )


class ApproveTask(Task[ApproveParams]):
    """An approval gate: the run stops here (the task `waiting`, exit code 4) until someone
    runs `orch approve PLAN ID` (or the run has `--approve ID`); approved, it passes and
    records who approved, when and their note. A changed plan or changed findings upstream
    void an approval. The engine decides (approvals.py); this class records the verdict."""

    Params = ApproveParams
    state_only = True  # passed: redone, it changes no later task's result

    def run(self, ctx: Context) -> None:
        approval = ctx.approval
        if approval is None:  # the engine runs a gate only once approved
            raise TaskError("not approved")
        ctx.log(f"{self.params.message}\napproved by {approval['by']} ({approval['how']})")
        ctx.finding("approved_by", approval["by"], note=approval["note"])
        ctx.finding("approved_how", approval["how"])
        for label, value in self.params.show.items():
            ctx.finding(label, value if isinstance(value, int | float | str) else str(value))
