"""`server.launch` and `server.stop`: an OpenAI-compatible inference server as a resource.

`server.launch` renders the engine's real command line from typed params (a flavour is an
engine's adapter, tasks/serving/engines/, or `command`: any argv), starts it under a
supervisor, and waits until it serves:
connection refused during a load is normal (neither engine listens before its weights are
in), so it polls `/health`, then `/v1/models` for the served name, then one tiny real
completion, with a long deadline; every `progress_every` seconds it
says how long it has been loading, the server's last log line and the GPU memory in use (NVML,
where there is a GPU), so a 10-minute load of a 547 GB model is visibly a load. If the process
dies it stops at once with the log's tail. Once ready it records what the server resolved:
/v1/models' max_model_len, and what its engine's adapter reads of it (its version, its
resolved cap and speculative settings).

The server outlives the task: it is held as a resource (orchestrator/run/leases.py) until
`server.stop`, the end of the run, or the next run after a crash ends it.

Supervisors: a transient systemd unit (`systemd-run --collect`, KillMode=mixed: SIGTERM to the
main process, then SIGKILL to the whole control group) where systemd runs, else a process
group of its own whose every process carries the ORCH_SERVER environment marker (SIGTERM to
every marked process on the host, SIGKILL after `stop_timeout`, scanned again until none is
left, so one that left the group with `setsid` is ended too). Either way every process the
engine forks is ended: killing the API process alone leaves vLLM's EngineCore and SGLang's
schedulers holding the GPUs. A unit starts with systemd's clean environment: PATH and the
task's `env` are passed, nothing else of orch's (set CUDA_*, HF_* and the like in `env`); a
process group inherits orch's environment plus `env`.
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator import Argv, Context, Duration, OptionValue, Task, TaskError
from orchestrator.proc.procfs import last_line, tail
from orchestrator.proc.stalls import StallPolicy, StallWatcher, act, evidence_path
from probes import http
from probes.nvml import NvmlUnavailable, open_nvml
from probes.procs import listeners
from tasks.serving.engines import ENGINES, engine
from tasks.serving.engines.base import Speculative
from tasks.serving.supervise import new_handle, supervisor

COMMAND = "command"  # the flavour that is any argv: no engine's adapter


LOG_TAIL_LINES = 15


# A load with nothing moving (no log line, no CPU, no GPU memory or utilisation change) for this
# long is reported stalled with a stack, unless the task sets its own `stall_after`.
LOADING_STALL_AFTER = 600.0


class LaunchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flavour: str = Field(description="an engine (serving/engines: vllm, sglang, ...) or command")
    model: OptionValue | None = Field(None, description="weights dir or hub id (vllm, sglang)")
    served_model_name: OptionValue | None = None
    host: OptionValue = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    tensor_parallel: int = Field(1, ge=1)
    max_running_requests: int | None = Field(
        None, ge=1, description="SGLang --max-running-requests, vLLM --max-num-seqs"
    )
    speculative: Speculative | None = None
    extra_args: Argv = []
    launcher: Argv | None = Field(
        None,
        description="argv before the flags (vllm: [vllm, serve]; sglang: [python3, -m, "
        "sglang.launch_server]): the venv's interpreter, say",
    )
    command: Argv | None = Field(None, description="flavour command: the whole argv")
    env: dict[str, str] = {}
    cwd: str | None = None
    name: str | None = Field(None, description="the resource's name; default: the task id")
    supervisor: Literal["auto", "systemd", "process"] = "auto"
    ready_timeout: Duration = 1800.0  # a 0.5 TB checkpoint loads for 30-45 min
    stop_timeout: Duration = 60.0
    progress_every: Duration = 10.0
    check_completion: bool = Field(True, description="one tiny real completion before ready")

    @field_validator("flavour")
    @classmethod
    def _known(cls, flavour: str) -> str:
        if flavour != COMMAND and flavour not in ENGINES:
            known = [*ENGINES, COMMAND]
            near = difflib.get_close_matches(flavour, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"{flavour!r} is none of {', '.join(known)}{hint}")
        return flavour

    @model_validator(mode="after")
    def _shape(self) -> LaunchParams:
        if self.flavour == COMMAND:
            if not self.command:
                raise ValueError("flavour command needs `command`: the server's argv")
            if self.model or self.speculative or self.launcher:
                raise ValueError(
                    "flavour command takes `command` only, not model, speculative "
                    "or launcher: put them in the argv"
                )
        else:
            if self.command:
                raise ValueError(
                    f"flavour {self.flavour} renders its command; `command` is for flavour command"
                )
            if not self.model:
                raise ValueError(f"flavour {self.flavour} needs `model`")
        return self

    @property
    def served_name(self) -> str | None:
        return self.served_model_name or self.model

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def common_flags(self) -> list[str]:
        """The flags every engine here spells alike: where to listen, the served name."""
        flags = ["--host", self.host, "--port", str(self.port)]
        return flags + (
            ["--served-model-name", self.served_model_name] if self.served_model_name else []
        )


def render(p: LaunchParams) -> list[str]:
    """The server's command line: the argv given (flavour command), or the engine's (its
    adapter renders it)."""
    if p.flavour == COMMAND:
        assert p.command is not None
        return list(p.command)
    return engine(p.flavour).command(p)


class _GpuMemory:
    """Total GPU memory in use, for progress; silent where there is no GPU."""

    def __init__(self) -> None:
        nvml = open_nvml()
        self.nvml = None if isinstance(nvml, NvmlUnavailable) else nvml
        self.first: int | None = None

    def describe(self) -> str:
        if self.nvml is None:
            return ""
        snap = self.nvml.snapshot(processes=False)
        if isinstance(snap, NvmlUnavailable):
            return ""
        used = sum(g.used_bytes for g in snap.gpus)
        self.first = used if self.first is None else self.first
        return (
            f"; GPU memory used {used / 2**30:.1f} GiB "
            f"({(used - self.first) / 2**30:+.1f} since launch)"
        )

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


def _wait_ready(ctx: Context, p: LaunchParams, handle: dict[str, Any], log: Path) -> float:
    """Seconds until the server answered health, models and a completion; TaskError if it
    died or the deadline passed."""
    started = time.monotonic()
    deadline = started + p.ready_timeout
    if (left := ctx.remaining()) is not None:
        deadline = min(deadline, time.monotonic() + left)
    next_note = started + p.progress_every
    stage = "connection refused"
    gpu = _GpuMemory()
    # Loading and hung look alike from outside: the watcher tells them apart, with a stack.
    watch = StallWatcher(
        ctx.stall or StallPolicy(LOADING_STALL_AFTER),
        lambda: supervisor(handle).leftovers(handle),
        log,
        evidence=evidence_path(ctx.log_path),
    )
    try:
        while True:
            if not supervisor(handle).alive(handle):
                lines = "\n".join(tail(log, LOG_TAIL_LINES))
                raise TaskError(
                    f"the server exited while loading ({stage}); its log {log} ends:\n{lines}"
                )
            try:
                _probe(p)
                return time.monotonic() - started
            except http.Unreachable as exc:
                stage = str(exc)
            if (report := watch.check()) is not None:
                ctx.stalled(report)
                act(report)  # on_stall fail or restart: TaskStalled, and run() stops the server
            now = time.monotonic()
            if now >= deadline:
                raise TaskError(
                    f"not ready after {now - started:.0f}s ({stage}); last log line: "
                    f"{last_line(log)}"
                )
            if now >= next_note:
                state = (
                    f"stalled: nothing moved for {watch.idle():.0f}s, loading for"
                    if watch.reported
                    else "loading for"
                )
                ctx.progress(
                    f"{state} {now - started:.0f}s ({stage}){gpu.describe()}; "
                    f"log: {last_line(log, limit=120)}"
                )
                next_note = now + p.progress_every
            time.sleep(0.5)
    finally:
        gpu.close()
        watch.close()


def _probe(p: LaunchParams) -> None:
    """One readiness look: health, the served name, a real completion."""
    http.request(p.url + "/health", timeout=5)
    models = http.request_json(p.url + "/v1/models", timeout=5)
    ids = [m.get("id") for m in models.get("data", [])] if isinstance(models, dict) else []
    name = p.served_model_name or (ids[0] if p.flavour == COMMAND and ids else p.served_name)
    if name not in ids:
        raise http.Unreachable(f"/v1/models lists {ids}, not {name!r} yet")
    if p.check_completion:
        http.request_json(
            p.url + "/v1/completions",
            {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
            timeout=60,
        )


def _resolved(p: LaunchParams) -> dict[str, Any]:
    """What the server made of its settings: /v1/models, and what its engine reports."""
    found: dict[str, Any] = {}
    models = http.request_json(p.url + "/v1/models")
    first = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    found["served_model"] = first.get("id")
    if first.get("max_model_len"):
        found["max_model_len"] = first["max_model_len"]
    if p.flavour in ENGINES:
        adapter = engine(p.flavour)
        found.update(adapter.settings(p.url) or {})
        found.update({k: v for k, v in adapter.configured(p).items() if k not in found})
    return {k: v for k, v in found.items() if v is not None}


class ServerLaunch(Task[LaunchParams]):
    """Start an inference server, wait until it serves, keep it running for later tasks."""

    Params = LaunchParams
    # The program, its flags and its environment; the model's path is data (a drafter an
    # earlier step trained is a finding) and may be confined (path_params).
    code_params = frozenset({"launcher", "command", "extra_args", "env"})

    def run(self, ctx: Context) -> None:
        p = with_leased_gpus(self.params, ctx)
        name = p.name or ctx.task_id
        if taken := listeners(p.port):
            who = taken[0].process
            raise TaskError(
                f"port {p.port} is already in use by "
                f"{who.label() if who else 'a process this user cannot see'}: "
                "stop it first (server.stop, systemd.stop)"
            )
        if p.flavour in ENGINES and (note := engine(p.flavour).launch_note(p)):
            ctx.progress(note)
        argv = render(p)
        log = (ctx.log_path.parent / f"{name}.server.log").resolve()
        ctx.log(f"$ {' '.join(argv)}\n(server output: {log})")
        spec = p.speculative
        held = {
            "url": p.url,
            "flavour": p.flavour,
            "log": str(log),
            "served_model": p.served_name,
            "grace": p.stop_timeout,
            "draft_tokens": spec.draft_tokens if spec else None,
            "algorithm": spec.algorithm if spec else None,
            "draft_model": spec.draft_model if spec else None,
        }
        handle = new_handle(p.supervisor, name, ctx)
        ctx.hold(name, {**held, **handle})  # committed before the start: never unaccounted for
        try:
            handle = supervisor(handle).start(
                handle, p.env, p.stop_timeout, argv, log, str(Path(p.cwd or ".").resolve())
            )
        except TaskError:
            ctx.release(name)
            raise
        held.update(handle)
        ctx.hold(name, held)
        try:
            took = _wait_ready(ctx, p, handle, log)
            resolved = _resolved(p)
        except (TaskError, http.Unreachable) as exc:  # a retry must find the port free
            _stop_all(handle, p.stop_timeout)
            ctx.release(name)
            if isinstance(exc, TaskError):
                raise  # as it is: a TaskStalled is restarted when on_stall says so
            raise TaskError(str(exc)) from None
        ctx.hold(name, {**held, **resolved, "ready": True})  # bench.serve reads these
        ctx.finding("url", p.url)
        ctx.finding("ready_after", round(took, 1), "s")
        ctx.finding("supervisor", handle.get("unit") or f"pid {handle['pid']}")
        if (pid := supervisor(handle).main_pid(handle)) is not None:
            ctx.finding("pid", pid)
        ctx.finding("log", str(log))
        for key, value in resolved.items():
            ctx.finding(key, value, note=engine(p.flavour).finding_note(key, value, p))

    @classmethod
    def release(cls, data: dict[str, Any]) -> str:
        return _stop_all(data, _release_grace(data))

    @classmethod
    def releasing(cls, data: dict[str, Any]) -> str:
        grace, pid = _release_grace(data), data.get("pid")
        what = f"unit {data['unit']}" if data.get("unit") else f"pid {pid} and its processes"
        why = (
            "its stop_timeout: time to drain requests in flight"
            if data.get("ready")
            else f"it never became ready: no request to drain (stop_timeout {data.get('grace')}s)"
        )
        return f"SIGTERM to {what}, SIGKILL after {grace:.0f}s if any is left ({why})"


UNREADY_GRACE = 10.0


def _release_grace(data: dict[str, Any]) -> float:
    """Seconds between SIGTERM and SIGKILL when the engine ends a server. The stop_timeout is
    for draining requests; a server that never answered ready (its launch was cut short: vLLM
    may ignore SIGTERM while it loads) has none, so it waits at most UNREADY_GRACE."""
    grace = float(data.get("grace", 60.0))
    return grace if data.get("ready") else min(grace, UNREADY_GRACE)


def _stop_all(handle: dict[str, Any], grace: float) -> str:
    """Stop the server, then scan for survivors: it is stopped only when none is left."""
    done = supervisor(handle).stop(handle, grace)
    if left := supervisor(handle).leftovers(handle):
        raise TaskError(f"{done}, but processes {left} are still alive")
    return done


class StopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(description="the server's name: the id of the task that launched it")
    timeout: Duration = 60.0


class ServerStop(Task[StopParams]):
    """Stop a server that server.launch started; verify no process of it is left."""

    Params = StopParams
    releases = "server"  # the engine re-runs it after a revived launch's users (selection.py)
    state_only = True  # the server is gone: redone, it changes no later task's result

    def run(self, ctx: Context) -> None:
        handle = ctx.held(self.params.server)
        if handle is None:
            ctx.finding(
                "stopped",
                False,
                note=f"no server {self.params.server!r} is running (already stopped)",
            )
            return
        started = time.monotonic()
        done = _stop_all(handle, self.params.timeout)
        ctx.release(self.params.server)
        ctx.log(done)
        ctx.finding("stopped", True, note=done)
        ctx.finding("stop_took", round(time.monotonic() - started, 2), "s")


def with_leased_gpus(p: LaunchParams, ctx: Context) -> LaunchParams:
    """The GPUs the task holds (`resources: {gpus: N}`) are the server's: its environment
    gets their CUDA_VISIBLE_DEVICES (the server runs outside the task's process group, so it
    is passed on here), and a tensor-parallel size they cannot hold is refused before a model
    is loaded for minutes."""
    visible = ctx.env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return p
    devices = [d for d in visible.split(",") if d]
    if p.tensor_parallel > len(devices):
        raise TaskError(
            f"tensor_parallel {p.tensor_parallel} needs {p.tensor_parallel} GPUs; the task "
            f"holds {len(devices)} ({visible}): hold `resources: {{gpus: {p.tensor_parallel}}}`"
        )
    leased = {k: v for k, v in ctx.env.items() if k.startswith("CUDA_")}
    return p.model_copy(update={"env": {**leased, **p.env}})
