"""`server.launch` and `server.stop`: an OpenAI-compatible inference server as a resource.

`server.launch` renders the engine's real command line from typed params (flavours `vllm`,
`sglang`, or `command`: any argv), starts it under a supervisor, and waits until it serves:
connection refused during a load is normal (neither engine listens before its weights are
in), so it polls `/health`, then `/v1/models` for the served name, then one tiny real
completion, with a long deadline; every `progress_every` seconds it
says how long it has been loading, the server's last log line and the GPU memory in use (NVML,
where there is a GPU), so a 10-minute load of a 547 GB model is visibly a load. If the process
dies it stops at once with the log's tail. Once ready it records what the server resolved
(SGLang: /server_info's max_running_requests and speculative settings; vLLM: max_model_len).

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

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import Argv, Context, Duration, OptionValue, Task, TaskError
from orchestrator.core.safeopen import ensure_private_dir, open_for_append
from orchestrator.core.terminal import plural
from orchestrator.core.umask import user_umask
from orchestrator.proc.containment import Jail, jail
from orchestrator.proc.procfs import is_alive, last_line, tail
from orchestrator.proc.stalls import StallPolicy, StallWatcher, act, evidence_path
from probes import http
from probes.nvml import NvmlUnavailable, open_nvml
from probes.procs import listeners
from probes.systemd import UnitNotFound, UnitState, read_unit, systemctl, systemd_unavailable

Flavour = Literal["vllm", "sglang", "command"]
LAUNCHERS: dict[str, list[str]] = {
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}
LOG_TAIL_LINES = 15
# A load with nothing moving (no log line, no CPU, no GPU memory or utilisation change) for this
# long is reported stalled with a stack, unless the task sets its own `stall_after`.
LOADING_STALL_AFTER = 600.0
_children: dict[int, subprocess.Popen[bytes]] = {}  # ours to reap once ended


class Speculative(BaseModel):
    """Speculative decoding, one meaning of k for both engines."""

    model_config = ConfigDict(extra="forbid")

    algorithm: OptionValue = Field(
        description="SGLang: EAGLE3, EAGLE, NGRAM, ...; vLLM method: eagle3, "
        "draft_model, ngram, ..."
    )
    draft_model: OptionValue | None = None
    draft_tokens: int | None = Field(
        None,
        ge=1,
        description="k: drafts per verify step (SGLang --speculative-num-steps with "
        "topk 1; vLLM num_speculative_tokens)",
    )
    topk: int = Field(1, ge=1, description="SGLang --speculative-eagle-topk")
    num_draft_tokens: int | None = Field(
        None, ge=2, description="SGLang --speculative-num-draft-tokens; k+1 when topk is 1"
    )
    config: dict[str, Any] = Field(
        {}, description="vLLM: more keys of --speculative-config (prompt_lookup_max, ...)"
    )

    @model_validator(mode="after")
    def _tree(self) -> Speculative:
        if self.topk > 1 and (self.num_draft_tokens is None or self.draft_tokens is None):
            raise ValueError("topk > 1 (tree drafting) needs draft_tokens and num_draft_tokens")
        return self

    @property
    def verify_tokens(self) -> int | None:
        if self.num_draft_tokens is not None or self.draft_tokens is None:
            return self.num_draft_tokens
        return self.draft_tokens + 1


class LaunchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flavour: Flavour
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

    @model_validator(mode="after")
    def _shape(self) -> LaunchParams:
        if self.flavour == "command":
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


def render(p: LaunchParams) -> list[str]:
    """The engine's command line: `vllm serve MODEL` or `python3 -m sglang.launch_server`."""
    if p.flavour == "command":
        assert p.command is not None
        return list(p.command)
    assert p.model is not None
    launcher = p.launcher or LAUNCHERS[p.flavour]
    common = ["--host", p.host, "--port", str(p.port)]
    if p.served_model_name:
        common += ["--served-model-name", p.served_model_name]
    spec = p.speculative
    if p.flavour == "vllm":
        argv = [*launcher, p.model, *common, "--tensor-parallel-size", str(p.tensor_parallel)]
        if p.max_running_requests:
            argv += ["--max-num-seqs", str(p.max_running_requests)]
        if spec:
            config: dict[str, Any] = {"method": spec.algorithm}
            if spec.draft_model:
                config["model"] = spec.draft_model
            if spec.draft_tokens:
                config["num_speculative_tokens"] = spec.draft_tokens
            argv += ["--speculative-config", json.dumps({**config, **spec.config})]
        return [*argv, *p.extra_args]
    argv = [
        *launcher,
        "--model-path",
        p.model,
        *common,
        "--tp-size",
        str(p.tensor_parallel),
        "--enable-metrics",
    ]
    if p.max_running_requests:
        argv += ["--max-running-requests", str(p.max_running_requests)]
    if spec:
        argv += ["--speculative-algorithm", spec.algorithm]
        if spec.draft_model:
            argv += ["--speculative-draft-model-path", spec.draft_model]
        if spec.draft_tokens:  # all three or none: SGLang asserts on a partial set
            argv += [
                "--speculative-num-steps",
                str(spec.draft_tokens),
                "--speculative-eagle-topk",
                str(spec.topk),
                "--speculative-num-draft-tokens",
                str(spec.verify_tokens),
            ]
    return [*argv, *p.extra_args]


# --- supervisors ---------------------------------------------------------------------------------
# A server is a handle (JSON, kept in the store): {"supervisor": "systemd", "unit": ...} or
# {"supervisor": "process", "marker": ..., "pid": ...}. The handle is named (`name`) and held
# before anything starts, so an orch killed between the start and the commit still left the
# name of what it started: the unit, or the environment marker that every process of the server
# inherits. `supervisor(handle)` gives the class that knows how to look at it and end it.


class _Unit:
    """A transient systemd unit: KillMode=mixed, so a stop takes its whole control group."""

    @staticmethod
    def name(name: str, ctx: Context) -> dict[str, Any]:
        unit = f"orch-{name.replace('_', '-')}-{ctx.run_id}-{secrets.token_hex(3)}.service"
        return {"supervisor": "systemd", "unit": unit}

    @staticmethod
    def start(
        handle: dict[str, Any], p: LaunchParams, argv: list[str], log: Path, cwd: str
    ) -> dict[str, Any]:
        unit = handle["unit"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **p.env}
        cmd = [
            "systemd-run",
            "--quiet",
            "--collect",
            f"--unit={unit}",
            "--property=KillMode=mixed",
            f"--property=TimeoutStopSec={int(p.stop_timeout)}s",
            f"--property=StandardOutput=append:{log}",
            "--property=StandardError=inherit",
            f"--working-directory={cwd}",
            *[f"--setenv={k}={v}" for k, v in env.items()],
            "--",
            *argv,
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
        )
        if done.returncode != 0:
            raise TaskError(f"systemd-run failed: {done.stderr.strip() or done.returncode}")
        return handle

    @staticmethod
    def alive(handle: dict[str, Any]) -> bool:
        state = read_unit(handle["unit"])
        return isinstance(state, UnitState) and state.active_state in (
            "active",
            "activating",
            "reloading",
        )

    @staticmethod
    def main_pid(handle: dict[str, Any]) -> int | None:
        state = read_unit(handle["unit"])
        return state.main_pid if isinstance(state, UnitState) and state.main_pid else None

    @staticmethod
    def leftovers(handle: dict[str, Any]) -> list[int]:
        state = read_unit(handle["unit"])
        return [p.pid for p in state.processes or ()] if isinstance(state, UnitState) else []

    @staticmethod
    def stop(handle: dict[str, Any], grace: float) -> str:
        unit, started = handle["unit"], time.monotonic()
        if isinstance(read_unit(unit), UnitNotFound):
            return f"{unit} had already stopped"
        # systemctl stop waits for the job; systemd itself SIGKILLs after TimeoutStopSec.
        done = systemctl(["stop", "--no-ask-password", "--", unit], timeout=grace + 30)
        if done.returncode != 0 and not isinstance(read_unit(unit), UnitNotFound):
            raise TaskError(f"systemctl stop {unit}: {done.stderr.strip()}")
        return f"stopped {unit} in {time.monotonic() - started:.1f}s"


class _Group:
    """A process group of its own in the host's containment (containment.py: a cgroup of its
    own where cgroup2 is writable, else the marker scan with orch as subreaper); every process
    it spawns, in the group or not, carries the ORCH_SERVER marker in its environment, and is
    found and ended by it (a reused pid is never hit: it lacks the marker). The jail is named
    from the marker, which the handle records, so a later run ends it the same way."""

    @staticmethod
    def name(name: str, ctx: Context) -> dict[str, Any]:
        return {
            "supervisor": "process",
            "marker": f"{name}@{ctx.run_id}:{secrets.token_hex(4)}",
            "pid": None,
        }

    @staticmethod
    def start(
        handle: dict[str, Any], p: LaunchParams, argv: list[str], log: Path, cwd: str
    ) -> dict[str, Any]:
        box = _jail(handle)
        scratch = _scratch(handle)
        # /tmp is everyone's: a folder of that name someone else made is refused, not used.
        ensure_private_dir(scratch, tighten=False)
        with open_for_append(log, binary=True) as out:
            try:
                proc = subprocess.Popen(
                    box.wrap(argv),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=cwd,
                    env={
                        **os.environ,
                        "TMPDIR": str(scratch),
                        **p.env,
                        "ORCH_SERVER": handle["marker"],
                    },
                    start_new_session=True,
                    preexec_fn=box.prepare(),
                    umask=user_umask(),
                )
            except OSError as exc:
                raise TaskError(f"cannot start {argv[0]}: {exc.strerror}") from None
        _children[proc.pid] = proc
        return {**handle, "pid": proc.pid}

    @staticmethod
    def alive(handle: dict[str, Any]) -> bool:
        proc = _children.get(handle["pid"])
        return proc.poll() is None if proc is not None else is_alive(handle["pid"])

    @staticmethod
    def main_pid(handle: dict[str, Any]) -> int | None:
        return None if handle.get("pid") is None else int(handle["pid"])

    @staticmethod
    def leftovers(handle: dict[str, Any]) -> list[int]:
        return _jail(handle).members()

    @staticmethod
    def stop(handle: dict[str, Any], grace: float) -> str:
        pid, started = handle.get("pid"), time.monotonic()
        leader = _children.pop(pid, None) if pid is not None else None
        ended = _jail(handle).end(grace, leader)
        shutil.rmtree(_scratch(handle), ignore_errors=True)
        if not ended:
            return f"server {handle['marker']} had already exited"
        count = plural(len(ended), "process", "processes")
        return (
            f"ended pid {pid} and every process it spawned ({count}: "
            f"{', '.join(map(str, ended))}) in {time.monotonic() - started:.1f}s"
        )


def _jail(handle: dict[str, Any]) -> Jail:
    """The server's jail; never a systemd scope: under systemd the server is a unit (_Unit).
    Its session is the one its first process started (start_new_session)."""
    box = jail(("ORCH_SERVER", handle["marker"]), handle.get("pid"))
    return Jail(box.marker, "marker", box.session) if box.mechanism == "scope" else box


def _scratch(handle: dict[str, Any]) -> Path:
    """The server's own temporary folder (its TMPDIR: vLLM's IPC sockets, torch's caches),
    named from the marker so a later run that ends the server removes it too."""
    return Path(tempfile.gettempdir()) / _jail(handle).name


def supervisor(handle: dict[str, Any]) -> type[_Unit] | type[_Group]:
    return _Unit if handle["supervisor"] == "systemd" else _Group


def _supervise(p: LaunchParams, name: str, ctx: Context) -> dict[str, Any]:
    """The handle of a server not started yet: under systemd where it runs (or where asked),
    else a process group."""
    if p.supervisor == "systemd" and (why := systemd_unavailable()):
        raise TaskError(f"supervisor systemd: {why}")
    use_systemd = p.supervisor == "systemd" or (
        p.supervisor == "auto"
        and systemd_unavailable() is None
        and shutil.which("systemd-run") is not None
    )
    return (_Unit if use_systemd else _Group).name(name, ctx)


# --- readiness -----------------------------------------------------------------------------------


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
    name = p.served_model_name or (ids[0] if p.flavour == "command" and ids else p.served_name)
    if name not in ids:
        raise http.Unreachable(f"/v1/models lists {ids}, not {name!r} yet")
    if p.check_completion:
        http.request_json(
            p.url + "/v1/completions",
            {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
            timeout=60,
        )


# What SGLang's /server_info says that a result needs: its server args (the speculative ones
# as it resolved them, the KV budget, the attention backend) and its version. The endpoint and
# its fields: sglang/srt/entrypoints/http_server.py (`/server_info`; `/get_server_info` before
# it, deprecated since). `cuda_graph_max_bs` moved into `cuda_graph_config.decode.max_bs`.
SGLANG_SETTINGS = (
    "version",
    "max_running_requests",
    "max_total_tokens",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "attention_backend",
    "dtype",
    "device",
    "tp_size",
)


def engine_settings(url: str, flavour: str | None = None) -> dict[str, Any]:
    """What a running server says of itself, as {"flavour": ..., settings}; {} when it answers
    neither SGLang's /server_info nor vLLM's /version. flavour None: asked as SGLang first
    (its info names a model_path), then as vLLM."""
    if flavour in ("sglang", None):
        for path in ("/server_info", "/get_server_info"):
            with contextlib.suppress(http.Unreachable):
                info = http.request_json(url + path)
                if isinstance(info, dict) and "model_path" in info:
                    found = {k: info[k] for k in SGLANG_SETTINGS if info.get(k) is not None}
                    if (graphs := _decode_graph_max_bs(info)) is not None:
                        found["cuda_graph_max_bs"] = graphs
                    return {"flavour": "sglang", **found}
    if flavour in ("vllm", None):
        with contextlib.suppress(http.Unreachable, AttributeError):
            version = http.request_json(url + "/version").get("version")
            return {"flavour": "vllm", "version": version} if version else {}
    return {}


def _decode_graph_max_bs(info: dict[str, Any]) -> int | None:
    """The largest decode batch SGLang captured a CUDA graph for; None where it runs none (a
    CPU or other device, or graphs disabled): a batch above it decodes eagerly, a known cause
    of speculative slow-downs at high concurrency."""
    if info.get("device", "cuda") != "cuda" or info.get("disable_cuda_graph"):
        return None
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    for value in (
        info.get("cuda_graph_max_bs_decode"),
        decode.get("max_bs") if isinstance(decode, dict) else None,
        info.get("cuda_graph_max_bs"),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _resolved(p: LaunchParams) -> dict[str, Any]:
    """What the server made of its settings (SGLang's server info)."""
    found: dict[str, Any] = {}
    models = http.request_json(p.url + "/v1/models")
    first = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    found["served_model"] = first.get("id")
    if first.get("max_model_len"):
        found["max_model_len"] = first["max_model_len"]
    if p.flavour in ("sglang", "vllm"):
        settings = engine_settings(p.url, p.flavour)
        settings.pop("flavour", None)
        found.update(settings)
    if p.flavour == "vllm" and p.max_running_requests:
        found["max_running_requests"] = p.max_running_requests
    return {k: v for k, v in found.items() if v is not None}


# --- the tasks -----------------------------------------------------------------------------------


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
        if p.flavour == "sglang" and p.speculative and p.max_running_requests is None:
            ctx.progress(
                "SGLang caps running requests at 48 in speculative mode unless "
                "max_running_requests is set"
            )
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
        handle = _supervise(p, name, ctx)
        ctx.hold(name, {**held, **handle})  # committed before the start: never unaccounted for
        try:
            handle = supervisor(handle).start(
                handle, p, argv, log, str(Path(p.cwd or ".").resolve())
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
            note = None
            if key == "max_running_requests" and value == 48 and spec:
                note = "SGLang's speculative default: peak throughput will be capped"
            ctx.finding(key, value, note=note)

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
