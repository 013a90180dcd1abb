"""systemd services: stop, start, restart a unit and verify the result; the `systemd.unit` check.

Idempotent like Ansible's systemd module: stopping an inactive unit (or starting an active one)
changes nothing and says so. A job is queued with `systemctl --no-block` and followed by polling
the unit until the job is gone, so a long stop reports progress and ends at our deadline, not
systemd's. A stop is verified twice: the unit is inactive (or failed) and its control group is
empty, because with KillMode=process a stopped unit leaves its children running, e.g. vLLM's
EngineCore and workers holding the GPUs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from orchestrator import (
    CheckResult,
    Context,
    Duration,
    Precondition,
    Task,
    TaskError,
    TaskTimeout,
)
from orchestrator.kinds.task import as_list
from orchestrator.proc.procfs import is_alive, process_start_time, terminate_pids
from probes.systemd import (
    STOPPED,
    SystemdUnavailable,
    UnitNotFound,
    UnitProcess,
    UnitState,
    cgroup_processes,
    read_unit,
    unit_name,
)

UnitName = Annotated[str, AfterValidator(unit_name)]
ActiveState = Literal["active", "inactive", "failed", "activating", "deactivating", "reloading"]
LoadState = Literal["loaded", "not-found", "masked", "error", "bad-setting"]

MARGIN = 30.0  # seconds beyond the unit's own TimeoutStopSec/TimeoutStartSec, by default
LEFTOVER_GRACE = 10.0  # seconds between SIGTERM and SIGKILL for processes a stop left behind
PROGRESS_EVERY = 10.0


class UnitParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: UnitName = Field(description="unit name; `.service` is added when no type is given")
    timeout: Duration | None = Field(
        None,
        description="how long to wait for the job, e.g. 2m (default: the unit's own "
        "TimeoutStopSec / TimeoutStartSec plus 30s)",
    )
    kill_leftovers: bool = Field(
        False,
        description="end processes left in the unit's control group after it stopped "
        "(SIGTERM, SIGKILL after 10s) instead of failing",
    )


class _UnitJob(Task[UnitParams]):
    """One systemctl job on one unit, waited for and verified."""

    Params = UnitParams
    verb: ClassVar[str]
    state_only = True  # a unit's state: redone, it changes no later task's result

    def run(self, ctx: Context) -> None:
        before = _known(self.params.unit)
        ctx.finding("previous_state", before.state, note=_pid_note(before))
        if self.nothing_to_do(before):
            self.already(ctx, before)
            return
        if before.children_survive_stop:
            _warn_kill_mode(ctx, before)
        started = time.monotonic()
        _queue(ctx, self.verb, before.unit)
        after = _wait(ctx, before, self.verb, self.deadline(ctx, before))
        self.verify(ctx, before, after, time.monotonic() - started)

    def nothing_to_do(self, before: UnitState) -> bool:
        raise NotImplementedError

    def already(self, ctx: Context, before: UnitState) -> None:
        raise NotImplementedError

    def verify(self, ctx: Context, before: UnitState, after: UnitState, took: float) -> None:
        raise NotImplementedError

    def deadline(self, ctx: Context, before: UnitState) -> float | None:
        """A monotonic deadline: the `timeout` param, else the unit's own timeout plus a margin;
        never later than the task's own timeout."""
        own = self.params.timeout
        if own is None:
            spans = [
                before.timeout_stop if self.verb != "start" else 0.0,
                before.timeout_start if self.verb != "stop" else 0.0,
            ]
            own = None if None in spans else sum(s or 0.0 for s in spans) + MARGIN
        limits = [x for x in (own, ctx.remaining()) if x is not None]
        return time.monotonic() + min(limits) if limits else None


class SystemdStop(_UnitJob):
    """Stop a unit; ok when it is already stopped. Verifies it is inactive and its cgroup empty."""

    verb = "stop"

    def nothing_to_do(self, before: UnitState) -> bool:
        return before.is_stopped

    def already(self, ctx: Context, before: UnitState) -> None:
        ctx.finding("final_state", before.state, note=f"already {before.active_state}")
        ctx.finding("duration", 0.0, "s")
        _check_cgroup_empty(ctx, self.params, before, before.processes or ())

    def verify(self, ctx: Context, before: UnitState, after: UnitState, took: float) -> None:
        note = None
        if after.result == "timeout":
            note = (
                f"SIGTERM was not enough: systemd sent SIGKILL after TimeoutStopSec="
                f"{_span(before.timeout_stop)}"
            )
        elif after.main_exit() and after.active_state == "failed":
            note = f"main process {after.main_exit()}"
        elif after.load_state == "not-found":
            note = "unloaded once stopped (a transient unit)"
        ctx.finding("final_state", after.state, note=note)
        ctx.finding("duration", round(took, 2), "s")
        if after.result == "timeout":
            ctx.progress(f"{after.unit} stopped: {note}")
        if after.active_state not in STOPPED:
            raise TaskError(
                f"{after.describe()} after the stop: something started it again "
                "(a socket, a timer or a unit that needs it?)"
            )
        _check_cgroup_empty(ctx, self.params, after, after.processes or ())


class SystemdStart(_UnitJob):
    """Start a unit; ok when it is already active. Verifies that it is active."""

    verb = "start"
    code_params = frozenset({"unit"})  # what it starts runs

    def nothing_to_do(self, before: UnitState) -> bool:
        return before.active_state in ("active", "reloading") and not before.job

    def already(self, ctx: Context, before: UnitState) -> None:
        ctx.finding("final_state", before.state, note=_join("already active", _pid_note(before)))
        ctx.finding("duration", 0.0, "s")

    def verify(self, ctx: Context, before: UnitState, after: UnitState, took: float) -> None:
        _check_started(ctx, after, took, self.verb)


class SystemdRestart(_UnitJob):
    """Restart a unit (start it if stopped). Verifies that it is active and that no process of
    the previous instance survived in its control group."""

    verb = "restart"
    code_params = frozenset({"unit"})

    def nothing_to_do(self, before: UnitState) -> bool:
        return False

    def verify(self, ctx: Context, before: UnitState, after: UnitState, took: float) -> None:
        _check_started(ctx, after, took, self.verb)
        # Same pid and same start time: the very process of the previous instance.
        old = {p.pid: process_start_time(p.pid) for p in before.processes or ()}
        survivors = [
            p
            for p in after.processes or ()
            if p.pid in old and old[p.pid] == process_start_time(p.pid)
        ]
        _check_cgroup_empty(ctx, self.params, after, survivors, "of the previous instance ")


def _known(unit: str) -> UnitState:
    """The unit's state; TaskError when systemd is not there or the unit does not exist."""
    probe = read_unit(unit)
    if isinstance(probe, SystemdUnavailable | UnitNotFound):
        raise TaskError(probe.describe())
    return probe


def _queue(ctx: Context, verb: str, unit: str) -> None:
    """Queue the job (`--no-block`: systemctl returns once systemd accepted it)."""
    argv = ["systemctl", "--no-block", "--no-ask-password", verb, "--", unit]
    result = ctx.run(argv, success_codes=range(256))
    if result.returncode != 0:
        said = [ln for ln in result.lines() if ln.strip()]
        raise TaskError(
            said[-1] if said else f"systemctl {verb} {unit} exited with {result.describe()}"
        )


def _wait(ctx: Context, before: UnitState, verb: str, deadline: float | None) -> UnitState:
    """Poll the unit until its job is gone and it is no longer changing; progress every 10 s;
    TaskTimeout at the deadline."""
    unit = before.unit
    started = time.monotonic()
    next_note = started + PROGRESS_EVERY
    pause = 0.05
    last = ""
    while True:
        probe = read_unit(unit)
        if isinstance(probe, SystemdUnavailable):
            raise TaskError(probe.describe())
        if isinstance(probe, UnitNotFound):
            if verb != "stop":
                raise TaskError(
                    f"{unit} disappeared during the {verb}: a transient unit that "
                    f"failed and was collected? see `journalctl -u {unit}`"
                )
            # A transient unit (systemd-run --collect) is unloaded once stopped; systemd
            # collects no unit whose cgroup still holds processes, but look at it anyway.
            return dataclasses.replace(
                before,
                load_state="not-found",
                active_state="inactive",
                sub_state="dead",
                main_pid=0,
                job="",
                result="",
                processes=cgroup_processes(before.control_group),
            )
        state = probe
        if state.state != last:
            ctx.log(state.describe())
            last = state.state
        if state.is_settled:
            return state
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            hint = ""
            if verb != "start" and state.active_state == "deactivating":
                hint = (
                    f"; systemd sends SIGKILL after TimeoutStopSec={_span(state.timeout_stop)}"
                    " and its job goes on"
                )
            raise TaskTimeout(
                f"{verb} of {unit} did not finish within {now - started:.1f}s: "
                f"{state.describe()}{hint}"
            )
        if now >= next_note:
            ctx.progress(f"waiting for {unit} to {verb}: {state.state} for {now - started:.0f}s")
            next_note = now + PROGRESS_EVERY
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
        pause = min(pause * 1.5, 0.5)


def _check_started(ctx: Context, after: UnitState, took: float, verb: str) -> None:
    ran_once = after.active_state == "inactive" and after.result == "success"  # Type=oneshot
    note = _pid_note(after) if after.active_state == "active" else None
    if ran_once:
        note = "ran to completion and exited (a oneshot unit without RemainAfterExit)"
    ctx.finding("final_state", after.state, note=note)
    ctx.finding("duration", round(took, 2), "s")
    if after.active_state == "active" or ran_once:
        return
    how = after.main_exit()
    raise TaskError(
        f"{after.unit} failed to {verb}: {after.describe()}"
        f"{'; main process ' + how if how else ''}; "
        f"see `journalctl -u {after.unit}`"
    )


def _check_cgroup_empty(
    ctx: Context,
    params: UnitParams,
    state: UnitState,
    left: tuple[UnitProcess, ...] | list[UnitProcess],
    whose: str = "",
) -> None:
    """Fail, or with kill_leftovers end them, when processes remain that must be gone."""
    if state.processes is None:
        ctx.progress(f"warning: cannot read the control group of {state.unit}; not verified")
        ctx.finding("cgroup", "unknown", note="no cgroup file system visible here")
        return
    if not left:
        if state.active_state in STOPPED:
            ctx.finding("cgroup", "empty")
        return
    listing = "; ".join(str(p) for p in left)
    count = f"{len(left)} process{'es remain' if len(left) > 1 else ' remains'}"
    why = f" (KillMode={state.kill_mode})" if state.children_survive_stop else ""
    if not params.kill_leftovers:
        ctx.finding("leftovers", len(left), note=listing[:300])
        raise TaskError(
            f"{state.unit} is {state.state}, but {count} {whose}in its "
            f"control group {state.control_group}{why}: {listing[:300]}; end them "
            "with `kill_leftovers: true` or fix the unit's KillMode"
        )
    ctx.progress(f"ending what remains {whose}in {state.control_group}{why}: {listing[:300]}")
    pids = [p.pid for p in left]
    terminate_pids(pids, LEFTOVER_GRACE)
    alive = [p for p in left if is_alive(p.pid)]
    ctx.finding("leftovers", len(left), note=f"ended: {listing[:300]}")
    if alive:
        raise TaskError(
            f"{len(alive)} process(es) in {state.control_group} survived SIGKILL: "
            + "; ".join(str(p) for p in alive)
        )
    if state.active_state in STOPPED:
        ctx.finding("cgroup", "empty")


def _warn_kill_mode(ctx: Context, state: UnitState) -> None:
    """KillMode=process/none: a stop ends the main process only (systemd.kill(5))."""
    text = (
        f"stopping {state.unit} leaves its main process's children running "
        "(use KillMode=mixed or control-group)"
    )
    ctx.progress(f"warning: KillMode={state.kill_mode}: {text}")
    ctx.finding("kill_mode", state.kill_mode, note=f"warning: {text}")


def _pid_note(state: UnitState) -> str | None:
    return f"main pid {state.main_pid}" if state.main_pid else None


def _join(*parts: str | None) -> str:
    return ", ".join(p for p in parts if p)


def _span(seconds: float | None) -> str:
    return "infinity" if seconds is None else f"{seconds:g}s"


class UnitCheckParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: UnitName
    state: Annotated[list[ActiveState] | None, BeforeValidator(as_list)] = Field(
        None, description="the ActiveState wanted, or a list of those accepted"
    )
    load: LoadState | None = Field(
        None,
        description="the LoadState wanted, e.g. loaded, not-found; with neither this nor "
        "`state`, the check holds when the unit exists",
    )


class UnitInState(Precondition[UnitCheckParams]):
    """The unit is in the wanted state: `vllm.service is active (running), main pid 4121`."""

    Params = UnitCheckParams

    def check(self) -> CheckResult:
        p = self.params
        wanted = p.state
        probe = read_unit(p.unit)
        if isinstance(probe, SystemdUnavailable):
            return CheckResult(False, probe.describe())
        if isinstance(probe, UnitNotFound):
            ok = p.load == "not-found" and (wanted is None or "inactive" in wanted)
            return CheckResult(ok, probe.describe())
        ok = (p.load is None or probe.load_state == p.load) and (
            wanted is None or probe.active_state in wanted
        )
        want = ", ".join(
            w for w in (" or ".join(wanted or []), p.load and f"load state {p.load}") if w
        )
        return CheckResult(ok, probe.describe() + ("" if ok else f" (wanted: {want})"))
