"""systemd units as `systemctl show` reports them, and the processes in their control groups.

Why `systemctl show` and not D-Bus: it needs no dependency (pystemd must be compiled against
libsystemd; jeepney and dbus-fast would be new dependencies for ten properties), it speaks the
same manager API, and its KEY=VALUE output is systemd's stable interface for scripts
(`systemctl status` is for humans and is never parsed). What D-Bus
would add, the JobRemoved signal, is replaced by polling the unit's `Job` property, which is as
exact and lets a long stop report progress. Every call is an argv list: no value reaches a shell.

The processes of a unit come from its control group's `cgroup.procs` files (cgroup v2, hybrid or
v1 layout), read in the caller's PID namespace, so the pids are the caller's. A unit stopped with
`KillMode=process` keeps its cgroup while children are left in it.

Three outcomes are kept apart, each a frozen dataclass: systemd is not running here
(`SystemdUnavailable`), the unit does not exist (`UnitNotFound`), and a unit systemd knows, in
whatever state (`UnitState`; "inactive" is one such state, not an error).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# systemd.unit(5); systemctl appends .service to a name without one of these suffixes.
UNIT_TYPES = (
    "service",
    "socket",
    "device",
    "mount",
    "automount",
    "swap",
    "target",
    "path",
    "timer",
    "slice",
    "scope",
)
UNIT_NAME_MAX = 255
_UNIT_CHAR = re.compile(r"[A-Za-z0-9:_.\\@-]")

PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "Result",
    "KillMode",
    "ControlGroup",
    "Job",
    "TimeoutStartUSec",
    "TimeoutStopUSec",
    "ExecMainCode",
    "ExecMainStatus",
)
STOPPED = ("inactive", "failed")
CHANGING = ("activating", "deactivating", "reloading", "refreshing")
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
SHOW_TIMEOUT = 10.0


def unit_name(name: str) -> str:
    """The full unit name for `name` (`vllm` -> `vllm.service`), or ValueError saying why not.

    Grammar of systemd.unit(5): letters, digits and `:_.-\\`, at most one `@` (templates),
    a type suffix, at most 255 characters. A template without an instance names no unit that
    can be started or stopped.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a unit name is required, e.g. vllm.service")
    bad = sorted({c for c in name if not _UNIT_CHAR.fullmatch(c)})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(
            f"unit name {name!r} has characters systemd does not allow ({shown}); "
            "allowed are letters, digits and : _ . - \\ @"
        )
    if name.rpartition(".")[2] not in UNIT_TYPES or "." not in name:
        name += ".service"
    prefix, _, suffix = name.rpartition(".")
    if len(name) > UNIT_NAME_MAX:
        raise ValueError(f"unit name {name[:40]!r}... is longer than {UNIT_NAME_MAX} characters")
    if not prefix or prefix.startswith("@"):
        raise ValueError(f"unit name {name!r} has nothing before {'@' if prefix else '.'}")
    if prefix.count("@") > 1:
        raise ValueError(f"unit name {name!r} has more than one '@'")
    if prefix.endswith("@"):
        raise ValueError(f"{name!r} is a template: name an instance, e.g. {prefix}NAME.{suffix}")
    return name


@dataclass(frozen=True)
class UnitProcess:
    """A process in a unit's control group."""

    pid: int
    command: str  # its whole command line, or [its name]

    def __str__(self) -> str:
        cmd = self.command if len(self.command) <= 90 else self.command[:87] + "..."
        return f"pid {self.pid} {cmd}"


@dataclass(frozen=True)
class UnitState:
    """A unit systemd knows, as `systemctl show` and its control group describe it."""

    unit: str
    load_state: str  # loaded, not-found (a running unit whose file is gone), masked, error ...
    active_state: str  # active, inactive, failed, activating, deactivating, reloading
    sub_state: str  # running, dead, exited, stop-sigterm, ...
    main_pid: int  # 0 when none
    result: str  # success, exit-code, signal, timeout, core-dump, ...
    kill_mode: str  # control-group, mixed, process, none ("" for units without one)
    control_group: str  # e.g. /system.slice/vllm.service; "" when it has none
    job: str  # the pending job's id, "" when none
    timeout_start: float | None  # seconds; None for infinity (or not applicable)
    timeout_stop: float | None
    exec_main_code: int  # CLD_* of the main process: 1 exited, 2 killed, 3 dumped
    exec_main_status: int  # its exit status, or the signal number
    processes: tuple[UnitProcess, ...] | None  # None when the control group could not be read

    @property
    def state(self) -> str:
        """`active (running)`: systemctl's words."""
        return f"{self.active_state} ({self.sub_state})"

    @property
    def is_stopped(self) -> bool:
        return self.active_state in STOPPED and not self.job

    @property
    def is_settled(self) -> bool:
        """No job pending and not in the middle of a transition."""
        return not self.job and self.active_state not in CHANGING

    @property
    def children_survive_stop(self) -> bool:
        """KillMode=process or none: a stop leaves the main process's children running
        (systemd.kill(5)), e.g. vLLM's EngineCore and TP workers holding the GPUs."""
        return self.kill_mode in ("process", "none")

    def main_exit(self) -> str:
        """How the main process ended, when it did: `exited with status 1`, `killed by SIGKILL`."""
        if self.exec_main_code == 1:
            return f"exited with status {self.exec_main_status}"
        if self.exec_main_code in (2, 3):
            return f"killed by {_signal_name(self.exec_main_status)}"
        return ""

    def describe(self) -> str:
        """`vllm.service is active (running), main pid 4121`."""
        text = f"{self.unit} is "
        if self.load_state != "loaded":
            text += f"{self.load_state}, "
        text += self.state
        if self.main_pid:
            text += f", main pid {self.main_pid}"
        if self.active_state == "failed" or self.result not in ("success", ""):
            text += f", result {self.result}"
        if self.job:
            text += f", job {self.job} pending"
        return text


@dataclass(frozen=True)
class UnitNotFound:
    """systemd has no such unit: no unit file, and nothing of it running."""

    unit: str

    def describe(self) -> str:
        return f"{self.unit} does not exist: systemd has no unit file for it (not-found)"


@dataclass(frozen=True)
class SystemdUnavailable:
    """systemd cannot be asked here: not PID 1, systemctl missing, or no answer."""

    unit: str
    reason: str

    def describe(self) -> str:
        return f"cannot read {self.unit}: {self.reason}"


UnitProbe = UnitState | UnitNotFound | SystemdUnavailable


def systemd_unavailable() -> str | None:
    """Why systemd cannot be used here, or None if it can (sd_booted(3): /run/systemd/system)."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed"
    if not Path("/run/systemd/system").is_dir():
        return f"systemd is not running here (PID 1 is {_comm(1) or 'unknown'}, not systemd)"
    return None


def systemctl(args: list[str], timeout: float = SHOW_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """`systemctl ARGS` as an argv list, output captured, never paged or coloured."""
    return subprocess.run(
        ["systemctl", "--no-pager", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "SYSTEMD_COLORS": "0", "LC_ALL": "C"},
    )


def read_unit(name: str, timeout: float = SHOW_TIMEOUT) -> UnitProbe:
    """What systemd says of unit `name` (already a full, valid unit name), and its processes."""
    if (why := systemd_unavailable()) is not None:
        return SystemdUnavailable(name, why)
    try:
        proc = systemctl(["show", f"--property={','.join(PROPERTIES)}", "--", name], timeout)
    except subprocess.TimeoutExpired:
        return SystemdUnavailable(name, f"systemctl show did not answer within {timeout:.0f}s")
    except OSError as exc:
        return SystemdUnavailable(name, f"cannot run systemctl: {exc}")
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return SystemdUnavailable(
            name, f"systemctl show failed: {said[-1] if said else ''} (exit {proc.returncode})"
        )
    props = parse_show(proc.stdout)
    # `show` succeeds for any name; a unit only systemd's memory holds (file deleted while it
    # runs, a transient unit) is not-found but still active: that one exists.
    if (
        props.get("LoadState") == "not-found"
        and props.get("ActiveState") == "inactive"
        and not props.get("Job")
    ):
        return UnitNotFound(name)
    return _unit_state(name, props)


def parse_show(text: str) -> dict[str, str]:
    """`KEY=VALUE` lines of `systemctl show`, by key (the order is systemd's, not ours)."""
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = value
    return props


_SPAN_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "M": 2629800.0,
    "y": 31557600.0,
}
_SPAN_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(us|ms|s|min|h|d|w|M|y)")


def parse_timespan(text: str) -> float | None:
    """Seconds from systemd's `1min 30s` form; None for `infinity`, empty or unreadable."""
    text = text.strip()
    if not text or text == "infinity":
        return None
    if re.fullmatch(r"\d+", text):
        return int(text) * 1e-6  # a bare number on the bus is microseconds
    parts = _SPAN_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        return None
    return sum(float(n) * _SPAN_UNITS[u] for n, u in parts)


def _unit_state(name: str, props: dict[str, str]) -> UnitState:
    def number(key: str) -> int:
        try:
            return int(props.get(key, "") or 0)
        except ValueError:
            return 0

    cgroup = props.get("ControlGroup", "")
    return UnitState(
        unit=props.get("Id") or name,
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        main_pid=number("MainPID"),
        result=props.get("Result", ""),
        kill_mode=props.get("KillMode", ""),
        control_group=cgroup,
        job=props.get("Job", "").strip(),
        timeout_start=parse_timespan(props.get("TimeoutStartUSec", "")),
        timeout_stop=parse_timespan(props.get("TimeoutStopUSec", "")),
        exec_main_code=number("ExecMainCode"),
        exec_main_status=number("ExecMainStatus"),
        processes=cgroup_processes(cgroup),
    )


def cgroup_processes(cgroup: str) -> tuple[UnitProcess, ...] | None:
    """Processes in control group `cgroup` and below it; None if no cgroup file system is seen.

    cgroup v2 (`/sys/fs/cgroup`), hybrid (`unified/`, which systemd also keeps) or v1 with
    systemd's named hierarchy (`systemd/`). A group that is gone has no processes.
    """
    if not cgroup:
        return ()
    roots = [Path("/sys/fs/cgroup"), *CGROUP_ROOTS]
    root = next(
        (
            r
            for r in roots
            if (r / "cgroup.procs").is_file()
            and (r is not roots[0] or (r / "cgroup.controllers").is_file())
        ),
        None,
    )
    if root is None:
        return None
    top = root / cgroup.lstrip("/")
    pids: set[int] = set()
    for folder, _, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                text = Path(folder, "cgroup.procs").read_text()
            except OSError:
                continue  # removed while we walked
            # A pid outside our PID namespace reads as 0.
            pids.update(int(p) for p in text.split() if p.isdigit() and int(p) > 0)
    return tuple(UnitProcess(pid, _command(pid)) for pid in sorted(pids))


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        raw = b""
    cmd = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return cmd or f"[{_comm(pid) or '?'}]"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
