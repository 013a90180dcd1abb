"""GPUs through NVML (nvidia-ml-py): memory used, and the compute processes holding it.

No driver, no library, no permission: every entry point returns `NvmlUnavailable` (whose text
is "NVML unavailable: ...") instead of raising, so a laptop or a CPU node gets one clear
sentence, never a traceback. pynvml is imported on first use: `orch status` never pays for it.

Indices are NVML's (as `nvidia-smi` numbers them), not CUDA's: CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER renumber CUDA's view only. UUIDs are the same everywhere.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from probes.procs import ProcessInfo, process_info


@dataclass(frozen=True)
class NvmlUnavailable:
    """Why NVML cannot answer: no driver, no library, no permission, a GPU that is lost."""

    reason: str

    def __str__(self) -> str:
        return f"NVML unavailable: {self.reason}"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, as NVML lists it."""

    pid: int
    used_bytes: int | None  # None: NVML cannot tell (MIG without privileges, Windows WDDM)
    info: ProcessInfo | None  # None: not visible from here (NVML gives host pids)
    # Has a /dev/nvidia* file open: True, False (so `pid` here is someone else), None (unknown).
    holds_device: bool | None = None

    def label(self, width: int = 60) -> str:
        """`pid 4121 python -m vllm.entrypoints... (user svc)`."""
        if self.info is None:
            return f"pid {self.pid} (not visible here: another PID namespace?)"
        return self.info.label(width)


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index
    uuid: str
    name: str
    used_bytes: int  # memory_v2 `used` where the driver has it: excludes driver-reserved memory
    total_bytes: int
    processes: tuple[GpuProcess, ...]
    mig: bool = False  # MIG mode on: processes come from the MIG instances
    processes_error: str | None = None  # NVML could not list processes (memory still counts)


@dataclass(frozen=True)
class GpuSnapshot:
    driver: str
    gpus: tuple[Gpu, ...]
    taken_at: float  # time.monotonic()
    took: float  # seconds the queries took


class Nvml:
    """An initialized NVML: `with nvml:` shuts it down. Cheap to poll (handles are kept).

    `library` is pynvml after nvmlInit (open_nvml), or a stand-in with its API: the recorded
    NVML of the tests (tasks/host/gpus.py, RecordedNvml) runs this class's code over recorded
    answers.
    """

    def __init__(self, library: Any) -> None:
        self._n: Any = library
        self._open = True
        self._static: dict[int, tuple[Any, str, str, bool]] = {}  # index -> handle, uuid, name, mig

    def __enter__(self) -> Nvml:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(self._n.NVMLError):  # nothing left to release then
                self._n.nvmlShutdown()

    def snapshot(
        self, indices: Iterable[int] | None = None, processes: bool = True, details: bool = True
    ) -> GpuSnapshot | NvmlUnavailable:
        """The GPUs (all, or those `indices`), with their compute processes if `processes`.

        `details=False`: each process only as NVML lists it, its pid and memory (`info` and
        `holds_device` None), without looking it up in /proc: for a poll that only matches
        pids (the stall watcher's GPU probe), not for a message naming holders or for
        choosing whom to signal."""
        n = self._n
        started = time.monotonic()
        index = -1
        try:
            driver = self._driver()
            wanted = range(n.nvmlDeviceGetCount()) if indices is None else indices
            gpus = []
            for index in wanted:
                gpus.append(self._gpu(index, processes, details))
        except n.NVMLError as exc:
            where = f"GPU {index}: " if index >= 0 else ""
            return NvmlUnavailable(f"{where}{_error_text(exc)}")
        now = time.monotonic()
        return GpuSnapshot(driver, tuple(gpus), now, now - started)

    def _driver(self) -> str:
        if not hasattr(self, "_driver_version"):
            self._driver_version = _text(self._n.nvmlSystemGetDriverVersion())
        return self._driver_version

    def _gpu(self, index: int, with_processes: bool, details: bool) -> Gpu:
        n = self._n
        if index not in self._static:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            self._static[index] = (
                handle,
                _text(n.nvmlDeviceGetUUID(handle)),
                _text(n.nvmlDeviceGetName(handle)),
                self._mig_enabled(handle),
            )
        handle, uuid, name, mig = self._static[index]
        used, total = self._memory(handle)
        procs: tuple[GpuProcess, ...] = ()
        error = None
        if with_processes:
            procs, error = self._processes(handle, mig, details)
        return Gpu(index, uuid, name, used, total, procs, mig, error)

    def utilisation(self, index: int) -> int | None:
        """Percent of the last sample period a kernel ran on GPU `index` (snapshot() first);
        None where NVML cannot tell (MIG, some virtual GPUs)."""
        n = self._n
        try:
            return int(n.nvmlDeviceGetUtilizationRates(self._static[index][0]).gpu)
        except (n.NVMLError, KeyError):
            return None

    def _mig_enabled(self, handle: Any) -> bool:
        n = self._n
        try:
            current, _pending = n.nvmlDeviceGetMigMode(handle)
        except n.NVMLError:  # NotSupported: a GPU without MIG
            return False
        return bool(current == n.NVML_DEVICE_MIG_ENABLE)

    def _memory(self, handle: Any) -> tuple[int, int]:
        n = self._n
        try:
            # v2 leaves out driver-reserved memory: an idle GPU reads ~0 as nvidia-smi shows,
            # not the ~0.5-1 GiB v1 reports.
            mem = n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2)
        except (n.NVMLError, TypeError, AttributeError):  # old driver or old nvidia-ml-py
            mem = n.nvmlDeviceGetMemoryInfo(handle)
        return int(mem.used), int(mem.total)

    def _processes(
        self, handle: Any, mig: bool, details: bool
    ) -> tuple[tuple[GpuProcess, ...], str | None]:
        """Compute (and MPS client) processes; with MIG, gathered from each instance."""
        n = self._n
        # With MIG the parent handle lists processes only for privileged callers; the
        # instances list theirs to anyone (NVML docs, nvmlDeviceGetComputeRunningProcesses).
        handles = self._mig_instances(handle) if mig else [handle]
        used: dict[int, int | None] = {}
        error = None
        for h in handles:
            try:
                listed = list(n.nvmlDeviceGetComputeRunningProcesses(h))
            except n.NVMLError as exc:
                error = _error_text(exc)
                continue
            # MPS clients are listed apart; no MPS (the usual case) or an old driver: none.
            with contextlib.suppress(n.NVMLError, AttributeError):
                listed += n.nvmlDeviceGetMPSComputeRunningProcesses(h)
            here: dict[int, int | None] = {}  # in both lists: the same memory, counted once
            for p in listed:
                mem = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                pid = int(p.pid)
                here[pid] = mem if pid not in here else _combine(here[pid], mem, max)
            for pid, mem in here.items():  # on several MIG instances: the sum
                used[pid] = mem if pid not in used else _combine(used[pid], mem, _add)
        if mig and not handles:
            error = "MIG is on but no MIG instance is visible"
        found = sorted(used.items())
        if not details:
            return tuple(GpuProcess(pid, mem, None) for pid, mem in found), error
        return tuple(self._look_up(pid, mem) for pid, mem in found), error

    def _look_up(self, pid: int, used: int | None) -> GpuProcess:
        """NVML's `pid` as this host sees it (/proc, psutil): a few syscalls per process, and
        the file descriptors of each; RecordedNvml's pids are not this host's."""
        return _process(pid, used)

    def _mig_instances(self, handle: Any) -> list[Any]:
        n = self._n
        found = []
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                found.append(n.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except n.NVMLError:  # NotFound: an empty slot
                continue
        return found


def open_nvml() -> Nvml | NvmlUnavailable:
    """NVML, initialized; close it (or use `with`). NvmlUnavailable says why not."""
    try:
        with warnings.catch_warnings():  # the `pynvml` shim package warns it is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return NvmlUnavailable(
            "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlUnavailable(_init_failure(pynvml, exc))
    return Nvml(pynvml)


def snapshot(
    indices: Iterable[int] | None = None, processes: bool = True
) -> GpuSnapshot | NvmlUnavailable:
    """One look at the GPUs: init, query, shutdown."""
    nvml = open_nvml()
    if isinstance(nvml, NvmlUnavailable):
        return nvml
    with nvml:
        return nvml.snapshot(indices, processes)


def holds_nvidia_device(pid: int) -> bool | None:
    """Whether `pid` has a /dev/nvidia* file open; None if its files cannot be read.

    NVML reports host pids: in a container the same number may be another process here, which
    must never be signalled. A CUDA process always has /dev/nvidiactl (or /dev/nvidiaN) open.
    """
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = sorted(os.listdir(fd_dir), key=lambda s: int(s) if s.isdigit() else 0)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"{fd_dir}/{fd}").startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def _process(pid: int, used: int | None) -> GpuProcess:
    holds = holds_nvidia_device(pid)
    info = None if holds is False else process_info(pid)
    return GpuProcess(pid, used, info, holds)


def _combine(a: int | None, b: int | None, how: Callable[[int, int], int]) -> int | None:
    return None if a is None or b is None else how(a, b)


def _add(a: int, b: int) -> int:
    return a + b


def _init_failure(n: Any, exc: Exception) -> str:
    known = {
        "NVMLError_LibraryNotFound": "no NVIDIA driver here (libnvidia-ml.so.1 not found)",
        "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
        "NVMLError_NoPermission": "no permission to open the NVIDIA driver",
        "NVMLError_LibRmVersionMismatch": "the NVIDIA driver and its library differ in version "
        "(reboot or reload the driver)",
    }
    return known.get(type(exc).__name__, f"nvmlInit failed: {_error_text(exc)}")


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: object) -> str:
    """NVML strings are str in recent nvidia-ml-py, bytes in old releases."""
    return value.decode() if isinstance(value, bytes) else str(value)
