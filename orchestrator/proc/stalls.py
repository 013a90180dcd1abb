"""Stalls: a task's processes that make no progress for `stall_after`, diagnosed with evidence.

Progress is anything that moves: the log grew; one process of the task used more than
CPU_SHARE of a core since the last sign of progress (a blocked process uses none; a timer
thread or an idle poll uses well under 1%, so one waking now and then is not "working"); or a
progress probe's reading changed (plugins, entry-point group `orch.progress`: tasks/host/gpus.py
reads GPU memory and utilisation through NVML, so a loader filling GPU memory is loading).
When nothing moved for `stall_after` seconds the watcher reports once, with evidence: a
py-spy stack dump of each Python process, the state and kernel wait channel of every process,
their CPU, the probes' figures and the log's last lines, written to `<task>.stalls.txt` beside
the task's log. It reports again only after progress resumed and stopped again.

Cheap while nothing is wrong: it samples /proc every `every` seconds; py-spy runs only when a
stall is reported, and nothing here imports more than the standard library at load.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from orchestrator.core.errors import TaskError
from orchestrator.core.redact import mask
from orchestrator.core.safeopen import open_for_append
from orchestrator.proc.procfs import stat_fields, tail

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

PROBE_GROUP = "orch.progress"
Action = Literal["wait", "fail", "restart"]
MIN_STALL_AFTER = 1.0  # seconds: progress is sampled every 0.2 s at best
CPU_SHARE = 0.02  # of one core, per process, since the last progress: more is working
CPU_FLOOR = 0.05  # seconds of CPU: the kernel counts in 10 ms ticks
MAX_RESTARTS = 2  # `on_stall: restart` restarts an attempt at most this often, then fails it
DUMP_TIMEOUT = 10.0  # seconds for one py-spy dump (it pauses the process meanwhile)
MAX_DUMPS = 16  # Python processes dumped per stall (a TP-8 server has about 10)
LOG_LINES = 20
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class StallPolicy:
    """A task's `stall_after` (seconds) and `on_stall`."""

    after: float
    action: Action = "wait"


class ProgressProbe(Protocol):
    """A plugin that reads figures of a task's processes that move while they work (GPU
    memory, utilisation). Any change of a reading counts as progress; a probe that cannot read
    (no driver) returns {}. Registered in the `orch.progress` entry-point group; built with no
    arguments once per watched process tree, closed after."""

    def read(self, pids: Sequence[int]) -> dict[str, float]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class StallReport:
    idle: float  # seconds since the last sign of progress
    summary: str  # one line: what did not move, and where the main thread waits
    evidence: Path | None  # the file holding the whole of it
    action: Action


class TaskStalled(TaskError):
    """An attempt ended because its processes stalled (`on_stall: fail` or `restart`)."""

    def __init__(self, message: str, restart: bool) -> None:
        super().__init__(message)
        self.restart = restart


def act(report: StallReport) -> None:
    """What `on_stall` says after a report: nothing for `wait`, else TaskStalled."""
    if report.action != "wait":
        raise TaskStalled(f"stalled: {report.summary}", restart=report.action == "restart")


def evidence_path(log_path: Path) -> Path:
    """Beside the task's log: `<task>.stalls.txt` (each stall appended)."""
    return log_path.with_name(f"{log_path.stem}.stalls.txt")


def load_probes() -> list[ProgressProbe]:
    """Every installed progress probe, made anew; one that fails to load or start is left
    out (reads nothing)."""
    probes: list[ProgressProbe] = []
    for ep in _probe_entry_points():
        with contextlib.suppress(Exception):
            probes.append(ep.load()())
    return probes


@functools.cache
def _probe_entry_points() -> tuple[EntryPoint, ...]:
    """Scanned once a process (the packages' metadata; a watcher starts at every attempt)."""
    from importlib.metadata import entry_points

    return tuple(entry_points(group=PROBE_GROUP))


@dataclass
class _Sample:
    at: float
    log_size: int
    cpu: dict[int, float]  # pid -> seconds of CPU (user+system, with reaped children's)
    readings: dict[str, float] = field(default_factory=dict)


class StallWatcher:
    """Fed by a wait loop (`check()` as often as it likes): a StallReport once nothing moved
    for `policy.after` seconds, else None. `members()` gives the live pids of the task."""

    def __init__(
        self,
        policy: StallPolicy,
        members: Callable[[], Sequence[int]],
        log_path: Path,
        log_offset: int | None = None,  # where the watched output starts; None: the end now
        evidence: Path | None = None,
        probes: Sequence[ProgressProbe] | None = None,
    ) -> None:
        self.policy, self.members = policy, members
        self.log_path = log_path
        self.evidence = evidence
        self.probes = load_probes() if probes is None else list(probes)
        self.every = min(max(policy.after / 10, 0.2), 5.0)
        self.next_look = 0.0
        self.mark = _Sample(time.monotonic(), self._log_size(), {})  # the last progress
        self.log_offset = self.mark.log_size if log_offset is None else log_offset
        self.reported = False  # a stall was reported and nothing has moved since
        self.stalls = 0

    def idle(self) -> float:
        return time.monotonic() - self.mark.at

    def check(self) -> StallReport | None:
        now = time.monotonic()
        if now < self.next_look:
            return None
        self.next_look = now + self.every
        pids = list(self.members())
        stats = _stats(pids)
        sample = _Sample(now, self._log_size(), _cpu(stats), self._read(pids))
        if self._moved(sample):
            self.mark, self.reported = sample, False
            return None
        if self.reported or now - self.mark.at < self.policy.after:
            return None
        self.reported = True
        self.stalls += 1
        return self._report(pids, sample, stats)

    def rebase(self) -> None:
        """Take what was just written to the log (the stall's own note) as seen."""
        self.mark.log_size = self._log_size()

    def close(self) -> None:
        for probe in self.probes:
            with contextlib.suppress(Exception):
                probe.close()

    # --- progress ------------------------------------------------------------------------------

    def _moved(self, now: _Sample) -> bool:
        if now.log_size != self.mark.log_size:
            return True
        budget = max(CPU_FLOOR, CPU_SHARE * (now.at - self.mark.at))
        # A pid first seen after the mark was born after it: all its CPU is new.
        if any(cpu - self.mark.cpu.get(pid, 0.0) > budget for pid, cpu in now.cpu.items()):
            return True
        return any(
            key not in self.mark.readings or self.mark.readings[key] != value
            for key, value in now.readings.items()
        )

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _read(self, pids: Sequence[int]) -> dict[str, float]:
        readings: dict[str, float] = {}
        for probe in self.probes:
            try:
                readings.update(probe.read(pids))
            except Exception:  # a probe that fails reads as nothing: it never fails the task
                continue
        return readings

    # --- evidence ------------------------------------------------------------------------------

    def _report(
        self, pids: Sequence[int], now: _Sample, stats: dict[int, list[str]]
    ) -> StallReport:
        idle = now.at - self.mark.at
        quiet = ["no output", "no CPU"]
        if now.readings:
            quiet.append("no GPU change" if _gpu(now.readings) else "no probe change")
        head = f"{', '.join(quiet)} for {idle:.0f}s"
        before = self.mark.cpu
        procs = [
            _describe(pid, stats.get(pid, []), now.cpu.get(pid, 0.0) - before.get(pid, 0.0))
            for pid in pids
        ]
        dumps = [(p, _dump(p.pid)) for p in [p for p in procs if p.python][:MAX_DUMPS]]
        where = _where(procs, dumps)
        summary = f"{head}; {where}"
        lines = [
            f"== stalled at {datetime.now().astimezone().isoformat(timespec='seconds')}: {summary}",
            f"stall_after {self.policy.after:g}s, on_stall {self.policy.action}; "
            f"stall {self.stalls} of this watch",
            "",
            f"processes ({len(procs)}): pid ppid state threads rss cpu(total) "
            f"cpu(idle window) wait-channel command",
        ]
        lines += [f"  {p.line()}" for p in procs] or ["  (none alive)"]
        if now.readings:
            lines += ["", "probe readings (at the last progress -> now):"]
            lines += [
                f"  {k}: {self.mark.readings.get(k, '-')} -> {v:g}"
                for k, v in sorted(now.readings.items())
            ]
        for proc, (ok, text) in dumps:
            lines += ["", f"py-spy dump of pid {proc.pid}:" if ok else f"no stack of {proc.pid}:"]
            lines += [f"  {ln}" for ln in text.splitlines()]
        if not dumps:
            lines += ["", "no Python process in the task's tree: no stack dump"]
        lines += ["", f"last {LOG_LINES} lines of {self.log_path}:"]
        lines += [f"  {ln}" for ln in tail(self.log_path, LOG_LINES, self.log_offset)] or [
            "  (no output)"
        ]
        written = self._write("\n".join(mask(ln) for ln in lines) + "\n\n")
        return StallReport(idle, mask(summary), written, self.policy.action)

    def _write(self, text: str) -> Path | None:
        if self.evidence is None:
            return None
        try:
            self.evidence.parent.mkdir(parents=True, exist_ok=True)
            with open_for_append(self.evidence) as f:
                f.write(text)
        except OSError:
            return None  # a full disk must not turn a stall into a crash
        return self.evidence


def _gpu(readings: dict[str, float]) -> bool:
    return any(k.startswith("gpu") for k in readings)


def _stats(pids: Sequence[int]) -> dict[int, list[str]]:
    """/proc/PID/stat of each live pid, read once a sample (no psutil: this runs every sample);
    the CPU figures and, on a stall, the evidence both come from it."""
    return {pid: stat for pid in pids if (stat := stat_fields(pid)) is not None}


def _cpu(stats: dict[int, list[str]]) -> dict[int, float]:
    """Seconds of CPU per pid, from its /proc stat fields."""
    return {
        pid: sum(int(x) for x in stat[13:17]) / _TICK  # utime stime cutime cstime
        for pid, stat in stats.items()
        if len(stat) >= 17
    }


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: str
    state: str
    threads: str
    rss: int
    cpu_total: float
    cpu_idle: float  # CPU used since the last progress
    wchan: str
    command: str
    python: bool

    def line(self) -> str:
        return (
            f"{self.pid} {self.ppid} {self.state} {self.threads} {self.rss / 2**20:.0f}MiB "
            f"{self.cpu_total:.2f}s {self.cpu_idle:.2f}s {self.wchan} {self.command[:200]}"
        )


def _describe(pid: int, stat: list[str], cpu_idle: float) -> _Proc:
    """One process for the evidence; `stat` its /proc stat fields as the sample read them
    ([]: gone by then)."""
    field_ = stat.__getitem__ if len(stat) > 23 else (lambda _: "?")
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        command = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    except OSError:
        command = ""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError:
        wchan = "?"
    cpu = sum(int(x) for x in stat[13:17]) / _TICK if len(stat) > 17 else 0.0
    rss = int(field_(23)) * _PAGE if len(stat) > 23 else 0
    return _Proc(
        pid,
        field_(3),
        field_(2),
        field_(19),
        rss,
        cpu,
        cpu_idle,
        wchan,
        command or f"[{stat[1] if len(stat) > 1 else '?'}]",
        _is_python(pid),
    )


def _is_python(pid: int) -> bool:
    """A Python interpreter, or a program that embeds one (libpython mapped)."""
    try:
        if "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
            return True
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(b"libpython" in line for line in f)
    except OSError:
        return False


def py_spy() -> str | None:
    """py-spy beside orch's interpreter (a venv's bin is often not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _dump(pid: int) -> tuple[bool, str]:
    """(True, the stack) or (False, why there is none): never raises."""
    exe = py_spy()
    if exe is None:
        return False, "py-spy is not installed (pip install py-spy)"
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--full-filenames"],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"py-spy dump took over {DUMP_TIMEOUT:g}s"
    except OSError as exc:
        return False, f"py-spy could not run: {exc}"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        if "ermission" in why or "ptrace" in why.lower():
            why += " (py-spy needs ptrace: root, CAP_SYS_PTRACE, or kernel.yama.ptrace_scope=0)"
        return False, f"py-spy dump failed: {why}"
    return True, done.stdout.rstrip()


# `Thread 7 (idle): "MainThread"`; without `threading` imported py-spy knows no name.
_THREAD = re.compile(r'^Thread (?:0x)?\w+ \((\w+)\)(?:: "([^"]*)")?')
_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)$")


def top_frame(dump: str) -> tuple[str, str, str, int] | None:
    """(thread state, function, file, line) of the main thread's innermost frame (else the
    first thread's) in a py-spy dump."""
    threads: list[tuple[str, str, tuple[str, str, int] | None]] = []
    for line in dump.splitlines():
        if m := _THREAD.match(line):
            threads.append((m.group(2) or "", m.group(1), None))
        elif threads and threads[-1][2] is None and (f := _FRAME.match(line)):
            name, state, _ = threads[-1]
            threads[-1] = (name, state, (f.group(1), f.group(2), int(f.group(3))))
    framed = [t for t in threads if t[2] is not None]
    if not framed:
        return None
    name, state, frame = next((t for t in framed if t[0] == "MainThread"), framed[0])
    assert frame is not None
    return state, *frame


def _source(file: str, line: int) -> str:
    import linecache

    return linecache.getline(file, line).strip()[:120]


def _where(procs: Sequence[_Proc], dumps: Sequence[tuple[_Proc, tuple[bool, str]]]) -> str:
    """Where the first Python process's main thread waits, else the leader's wait channel."""
    for proc, (ok, text) in dumps:
        top = top_frame(text) if ok else None
        if top is None:
            continue
        state, func, file, line = top
        code = _source(file, line)
        return (
            f"pid {proc.pid} main thread {state} in {func} at {os.path.basename(file)}:{line}"
            + (f": {code}" if code else "")
        )
    for proc, (ok, text) in dumps:
        if not ok:
            return f"pid {proc.pid}: no stack ({text.splitlines()[0][:160]})"
    if procs:
        first = procs[0]
        name = first.command.split(" ", 1)[0].rsplit("/", 1)[-1]
        return f"pid {first.pid} ({name}) state {first.state}, waiting in {first.wchan}"
    return "no process alive"
