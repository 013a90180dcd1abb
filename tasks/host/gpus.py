"""GPU preconditions (`gpu.free`, `gpu.count`) and the `gpu.wait_free` task, through NVML.

GPUs are chosen by NVML index (as `nvidia-smi` numbers them), UUID (`GPU-...`, a unique prefix
will do) or `all`. Without a driver every kind says "NVML unavailable: ..." and blocks or fails.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from orchestrator import (
    CheckResult,
    Context,
    Duration,
    Pool,
    PoolUnavailable,
    Precondition,
    Task,
    TaskError,
)
from orchestrator.proc.procfs import is_alive, terminate_pids
from probes.nvml import (
    Gpu,
    GpuProcess,
    GpuSnapshot,
    Nvml,
    NvmlUnavailable,
    holds_nvidia_device,
    open_nvml,
)
from tasks.host.checks import format_size

T = TypeVar("T")
GIB = 1024**3
MIB = 1024**2
PROGRESS_EVERY = 5.0  # seconds between progress notes while nothing changes


def _parse_gpus(value: object) -> object:
    """`all`, an index, a UUID, `"0,1"`, or a list of indices and UUIDs."""
    if isinstance(value, str):
        if value.strip().lower() == "all":
            return "all"
        value = [w.strip() for w in value.split(",") if w.strip()]
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError("expected 'all', a GPU index or UUID, or a list of them")
    chosen: list[int | str] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            chosen.append(item)
        elif isinstance(item, str) and item.strip().isdigit():
            chosen.append(int(item))
        elif isinstance(item, str) and item.strip().upper().startswith("GPU-"):
            chosen.append(item.strip())
        else:
            raise ValueError(f"{item!r} is not a GPU index (0, 1, ...) or UUID (GPU-...)")
    return chosen


GpuChoice = Annotated[list[int | str] | Literal["all"], BeforeValidator(_parse_gpus)]


def select(gpus: Sequence[Gpu], wanted: list[int | str] | Literal["all"]) -> list[Gpu]:
    """The GPUs `wanted` names, in the order named; LookupError says what this host has."""
    if not gpus:
        raise LookupError("NVML found no GPUs on this host")
    if wanted == "all":
        return list(gpus)
    have = f"this host has GPU{'s' if len(gpus) > 1 else ''} {_indices(gpus)}"
    chosen: list[Gpu] = []
    for w in wanted:
        if isinstance(w, int):
            match = [g for g in gpus if g.index == w]
        else:
            match = [g for g in gpus if g.uuid.lower().startswith(w.lower())]
        if not match:
            raise LookupError(f"no GPU {w} ({have})")
        if len(match) > 1:
            raise LookupError(f"{w} matches GPUs {_indices(match)}: give more of the UUID")
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def busy(gpu: Gpu, max_used: int, no_processes: bool) -> str | None:
    """None if `gpu` counts as free; else what holds it, e.g.
    `GPU 3 holds 71.2 GiB: pid 4121 python -m vllm.entrypoints... (user svc)`."""
    over = gpu.used_bytes > max_used
    if not over and not (no_processes and gpu.processes):
        return None
    name = f"GPU {gpu.index}" + (" (MIG)" if gpu.mig else "")
    if over:
        head = f"{name} holds {format_size(gpu.used_bytes)}"
    else:
        count = len(gpu.processes)
        head = (
            f"{name} has {count} compute process{'es' if count > 1 else ''} "
            f"({format_size(gpu.used_bytes)} used)"
        )
    if gpu.processes:
        return f"{head}: {holders(gpu.processes)}"
    if gpu.processes_error:
        return f"{head}; its processes cannot be listed ({gpu.processes_error})"
    return f"{head} and lists no compute process (another container's, or not yet released)"


def holders(processes: Sequence[GpuProcess]) -> str:
    """Who holds a GPU; each one's memory when there are several."""
    if len(processes) == 1:
        return processes[0].label()
    return ", ".join(f"{p.label()} {_memory(p)}" for p in processes)


def _memory(p: GpuProcess) -> str:
    return "memory unknown" if p.used_bytes is None else format_size(p.used_bytes)


def _indices(gpus: Sequence[Gpu]) -> str:
    return ", ".join(str(g.index) for g in gpus)


def _open() -> Nvml | NvmlUnavailable:
    """NVML, or the recorded state that stands in for it (RECORDED_STATE)."""
    if recorded := os.environ.get(RECORDED_STATE):
        return RecordedNvml(recorded)
    return open_nvml()


def _once(look: Callable[[Nvml], T]) -> T | NvmlUnavailable:
    """One look through a fresh NVML session (a precondition's check), closed after."""
    nvml = _open()
    if isinstance(nvml, NvmlUnavailable):
        return nvml
    with nvml:
        return look(nvml)


def _look(nvml: Nvml, wanted: list[int | str] | Literal["all"]) -> list[Gpu] | str:
    """The selected GPUs with their processes, or what went wrong, in one sentence."""
    listing = nvml.snapshot(processes=False)  # cheap: only to resolve indices and UUIDs
    if isinstance(listing, NvmlUnavailable):
        return str(listing)
    try:
        chosen = select(listing.gpus, wanted)
    except LookupError as exc:
        return str(exc)
    snap = nvml.snapshot([g.index for g in chosen])
    return str(snap) if isinstance(snap, NvmlUnavailable) else list(snap.gpus)


class FreeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: GpuChoice = Field("all", description="indices, UUIDs, or all")
    max_used_mib: float = Field(1024, ge=0, description="the most memory used that is still free")
    no_processes: bool = Field(True, description="free also means no compute process on it")


class GpusFree(Precondition[FreeParams]):
    """The GPUs hold no more than `max_used_mib` and (by default) no compute process."""

    Params = FreeParams

    def check(self) -> CheckResult:
        p = self.params
        gpus = _once(lambda nvml: _look(nvml, p.gpus))
        if isinstance(gpus, NvmlUnavailable | str):
            return CheckResult(False, str(gpus))
        problems = [b for g in gpus if (b := busy(g, int(p.max_used_mib * MIB), p.no_processes))]
        if problems:
            return CheckResult(False, "; ".join(problems))
        most = max(g.used_bytes for g in gpus)
        return CheckResult(
            True,
            f"GPU{'s' if len(gpus) > 1 else ''} {_indices(gpus)} free "
            f"({format_size(most)} used at most)",
        )


class CountParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int | None = Field(None, ge=0, description="exactly this many GPUs (of `model`)")
    at_least: int | None = Field(None, ge=1, description="at least this many GPUs (of `model`)")
    model: str | None = Field(None, min_length=1, description="part of the name, e.g. H200")

    @model_validator(mode="after")
    def _one_bound(self) -> CountParams:
        if self.count is not None and self.at_least is not None:
            raise ValueError("give `count` or `at_least`, not both")
        return self


class GpuCount(Precondition[CountParams]):
    """The host has `count` (or `at_least`) GPUs whose name contains `model` (default: >= 1)."""

    Params = CountParams

    def check(self) -> CheckResult:
        p = self.params
        snap = _once(lambda nvml: nvml.snapshot(processes=False))
        if isinstance(snap, NvmlUnavailable):
            return CheckResult(False, str(snap))
        found = _by_name(snap.gpus)
        matching = [g for g in snap.gpus if p.model is None or p.model.lower() in g.name.lower()]
        what = f"× {p.model}" if p.model else "GPU"
        if p.count is not None:
            ok, need = len(matching) == p.count, f"exactly {p.count} {what}"
        else:
            least = p.at_least or 1
            ok, need = len(matching) >= least, f"at least {least} {what}"
        return CheckResult(ok, found if ok else f"found {found}; needs {need}")


def _by_name(gpus: Sequence[Gpu]) -> str:
    """`8 × NVIDIA H200`; `no GPUs`."""
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name] = names.get(g.name, 0) + 1
    return ", ".join(f"{n} × {name}" for name, n in names.items()) or "no GPUs"


class WaitFreeParams(FreeParams):
    timeout: Duration = Field(300.0, description="fail if not free by then")
    every: Duration = Field(0.1, ge=0.01, description="seconds between looks")
    terminate: bool = Field(False, description="end the processes still holding the GPUs")
    terminate_after: Duration = Field(
        0.0, description="with terminate: how long holders may take to leave on their own"
    )
    grace: Duration = Field(10.0, description="seconds between SIGTERM and SIGKILL")


class GpuWaitFree(Task[WaitFreeParams]):
    """Wait until the GPUs are free (see gpu.free), ending the holders if `terminate`.

    Findings: seconds_until_free, gpuN_freed_gib for each GPU, and with terminate the
    processes it ended (`terminated`) or could not end (`not_terminated`).
    """

    Params = WaitFreeParams
    state_only = True  # the GPUs are free: redone, it changes no later task's result

    def run(self, ctx: Context) -> None:
        p = self.params
        started = time.monotonic()
        remaining = ctx.remaining()
        deadline = started + (p.timeout if remaining is None else min(p.timeout, remaining))
        max_used = int(p.max_used_mib * MIB)
        nvml = _open()
        if isinstance(nvml, NvmlUnavailable):
            raise TaskError(str(nvml))
        with nvml:
            first = _look(nvml, p.gpus)
            if isinstance(first, str):
                raise TaskError(first)
            indices = [g.index for g in first]
            end_at = started + p.terminate_after if p.terminate else None
            ended: tuple[str, list[str]] = ("", [])  # who was ended, who could not be
            shown: tuple[object, float] = ((), 0.0)  # what the last progress note said, when
            current, seen_at = first, time.monotonic()
            try:
                while problems := [b for g in current if (b := busy(g, max_used, p.no_processes))]:
                    now = time.monotonic()
                    if end_at is not None and now >= end_at:
                        end_at = None  # once: a holder that comes back (Restart=always) is named
                        ended = self._terminate(ctx, current, max_used)
                    elif now >= deadline:
                        raise TaskError(
                            f"not free after {now - started:.1f}s: {'; '.join(problems)}"
                        )
                    else:
                        key = tuple((g.index, tuple(x.pid for x in g.processes)) for g in current)
                        if key != shown[0] or now - shown[1] >= PROGRESS_EVERY:
                            ctx.progress(f"waiting {now - started:.0f}s: {'; '.join(problems)}")
                            shown = (key, now)
                        time.sleep(max(0.0, min(p.every, deadline - now)))
                    snap = nvml.snapshot(indices)
                    if isinstance(snap, NvmlUnavailable):
                        raise TaskError(str(snap))
                    current, seen_at = list(snap.gpus), snap.taken_at
                ctx.finding("seconds_until_free", round(seen_at - started, 3), "s")
            finally:  # also on a timeout or Ctrl-C: what was freed and ended so far
                self._record(ctx, first, current, *ended)

    def _record(
        self, ctx: Context, first: list[Gpu], last: list[Gpu], ended: str, spared: list[str]
    ) -> None:
        for before, after in zip(first, last, strict=True):
            freed = max(0, before.used_bytes - after.used_bytes)
            ctx.finding(
                f"gpu{before.index}_freed_gib",
                round(freed / GIB, 2),
                "GiB",
                f"{format_size(before.used_bytes)} -> {format_size(after.used_bytes)} used",
            )
        if ended:
            ctx.finding(
                "terminated",
                ended,
                None,
                f"SIGTERM, then SIGKILL after {self.params.grace:g}s for any left",
            )
        if spared:
            ctx.finding("not_terminated", "; ".join(spared))
        ctx.finding("gpus", ",".join(str(g.index) for g in first))

    def _terminate(self, ctx: Context, gpus: list[Gpu], max_used: int) -> tuple[str, list[str]]:
        """End the holders of the GPUs that are not free: SIGTERM, SIGKILL after `grace`.

        Returns the labels of those ended, and why others were not.
        """
        held = {
            x.pid: x
            for g in gpus
            if busy(g, max_used, self.params.no_processes)
            for x in g.processes
        }
        mine = _ancestors()
        ending: list[GpuProcess] = []
        spared: list[str] = []
        for proc in held.values():
            if proc.pid in mine:
                spared.append(f"{proc.label()}: orch itself or its parent")
            elif proc.holds_device is not True:
                # NVML lists host pids: here the number may be an unrelated process.
                spared.append(f"{proc.label()}: not seen holding a GPU from here")
            elif not _may_signal(proc.pid):
                spared.append(f"{proc.label()}: not permitted to signal it")
            else:
                ending.append(proc)
        if not ending:
            return "", spared
        labels = "; ".join(x.label() for x in ending)
        ctx.progress(f"ending {len(ending)} GPU holder{'s' if len(ending) > 1 else ''}: {labels}")
        terminate_pids([x.pid for x in ending], self.params.grace)
        spared += [f"{x.label()}: survived SIGKILL" for x in ending if is_alive(x.pid)]
        return labels, spared


def _ancestors() -> set[int]:
    """This process and its parents: never ended, even if one of them holds a GPU."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def _may_signal(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False
    except ProcessLookupError:
        return True  # gone already; terminate_pids copes
    return True


LEASE_MAX_USED_MIB = 1024  # a GPU holding more than this (or any compute process) is not free


class GpuPool(Pool):
    """`resources: {gpus: 4}` (any four free GPUs) or `{gpus: [0, 1]}` (those): a GPU is free
    when NVML shows no compute process on it and at most 1 GiB used; the task's processes get
    CUDA_VISIBLE_DEVICES with the leased NVML indices (and CUDA_DEVICE_ORDER=PCI_BUS_ID, so
    CUDA numbers the GPUs as NVML does)."""

    every = 2.0

    def look(self) -> dict[str, str | None]:
        snap = _once(lambda nvml: nvml.snapshot())
        if isinstance(snap, NvmlUnavailable):
            raise PoolUnavailable(str(snap))
        return free_gpus(snap.gpus)

    def env(self, ids: Sequence[str]) -> dict[str, str]:
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(ids)}


# A recorded NVML state (JSON) every GPU kind reads instead of NVML: how the lease logic of an
# 8-GPU host, and the flagship's steps around its GPUs, are tested on machines without one. Nvml's
# own code runs over it; pynvml and the /proc look-ups of NVML's pids run in tests/test_gpu.py,
# on the GPU machine.
RECORDED_STATE = "ORCH_GPU_STATE"


class RecordedNvml(Nvml):
    """Nvml itself over a RecordedLibrary: every snapshot reads the file again, then runs
    Nvml's own code (indices, the `processes` and `details` switches, utilisation, errors).
    The recorded pids are not this host's: they are not looked up in /proc (info and
    holds_device stay None), and `looked_up` counts the processes that would have been."""

    def __init__(self, path: str) -> None:
        self.library = RecordedLibrary(path)
        super().__init__(self.library)
        self.looked_up = 0

    def snapshot(
        self, indices: Iterable[int] | None = None, processes: bool = True, details: bool = True
    ) -> GpuSnapshot | NvmlUnavailable:
        self.library.load()  # a test changes the file while a run waits
        return super().snapshot(indices, processes, details)

    def _look_up(self, pid: int, used: int | None) -> GpuProcess:
        self.looked_up += 1
        return GpuProcess(pid, used, None)


class RecordedLibrary:
    """The part of pynvml's API that Nvml calls, answering from a JSON file of rows
    `{"index": 0, "used_mib": 512, "pids": [4121, {"pid": 4122, "used_mib": 2048}],
    "util_pct": 37, "name": "NVIDIA H200", "total_mib": 143771}` (all but `index` optional;
    indices 0..n-1, as NVML numbers GPUs; a pid without `used_mib` has memory unknown; no
    `util_pct`: utilisation not supported). `calls` counts each function's calls."""

    class NVMLError(Exception):
        pass

    NVML_DEVICE_MIG_ENABLE = 1
    nvmlMemory_v2 = 2

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: dict[int, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()

    def load(self) -> None:
        with open(self.path) as f:
            rows = json.load(f)
        self.rows = {int(r["index"]): r for r in rows}
        if sorted(self.rows) != list(range(len(rows))):
            raise ValueError(f"{self.path}: GPU indices must be 0..{len(rows) - 1}, once each")

    def _row(self, name: str, handle: int) -> dict[str, Any]:
        self.calls[name] += 1
        if handle not in self.rows:
            raise self.NVMLError("GPU is lost")
        return self.rows[handle]

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        return "recorded"

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        return len(self.rows)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if index not in self.rows:
            raise self.NVMLError("Invalid Argument")
        return index  # the handle: the recorded index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._row("nvmlDeviceGetUUID", handle)
        return f"GPU-recorded-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._row("nvmlDeviceGetName", handle).get("name", "recorded"))

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        self._row("nvmlDeviceGetMigMode", handle)
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        row = self._row("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            used=int(row.get("used_mib", 0) * MIB), total=int(row.get("total_mib", 143771) * MIB)
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        row = self._row("nvmlDeviceGetComputeRunningProcesses", handle)
        listed = []
        for p in row.get("pids", []):
            pid, mib = (p, None) if isinstance(p, int) else (p["pid"], p.get("used_mib"))
            used = None if mib is None else int(mib * MIB)
            listed.append(SimpleNamespace(pid=pid, usedGpuMemory=used))
        return listed

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        self._row("nvmlDeviceGetMPSComputeRunningProcesses", handle)
        return []

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        row = self._row("nvmlDeviceGetUtilizationRates", handle)
        if row.get("util_pct") is None:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=row["util_pct"], memory=0)


def free_gpus(gpus: Sequence[Gpu]) -> dict[str, str | None]:
    """Each GPU by index: None if it can be leased, else what holds it."""
    return {
        str(g.index): busy(g, LEASE_MAX_USED_MIB * MIB, no_processes=True)
        for g in sorted(gpus, key=lambda g: g.index)
    }


class GpuProgress:
    """The engine's GPU progress probe (entry-point group `orch.progress`, stalls.py): GPU
    memory and utilisation that a stalled-looking task moves, so a loader filling GPU memory
    without a word or a CPU cycle is loading, not hung.

    Which GPUs: those NVML lists the task's pids on, reading the memory those pids hold there;
    where NVML's pids are the host's (a container) and none matches, but a task process has a
    /dev/nvidia* file open, every GPU's memory in use; a task with no GPU process reads nothing,
    so another workload's GPUs never mask its stall. Without a driver it reads nothing."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml: Nvml | NvmlUnavailable | None = nvml  # None: opened on the first read

    def read(self, pids: Sequence[int]) -> dict[str, float]:
        if self.nvml is None:
            self.nvml = open_nvml()
        if isinstance(self.nvml, NvmlUnavailable):
            return {}
        # Every sample: pids and memory as NVML lists them, no /proc look-up of each process.
        snap = self.nvml.snapshot(details=False)
        if isinstance(snap, NvmlUnavailable):
            return {}
        mine = set(pids)
        readings: dict[str, float] = {}
        for gpu in snap.gpus:
            held = [p.used_bytes or 0 for p in gpu.processes if p.pid in mine]
            if held:
                readings[f"gpu{gpu.index}.task_mib"] = sum(held) // MIB
        if readings:
            indices = {int(k[3:].split(".")[0]) for k in readings}
        elif any(holds_nvidia_device(pid) for pid in pids):
            indices = {gpu.index for gpu in snap.gpus}
            readings = {f"gpu{g.index}.used_mib": g.used_bytes // MIB for g in snap.gpus}
        else:
            return {}
        for index in sorted(indices):
            if (util := self.nvml.utilisation(index)) is not None:
                readings[f"gpu{index}.util_pct"] = util
        return readings

    def close(self) -> None:
        if isinstance(self.nvml, Nvml):
            self.nvml.close()
