"""Containment: every process a task or server starts can be found and ended, wherever it went.

One jail per task attempt (or server), named from its environment marker alone, so the next run
can compute where a dead run's processes are without anything recorded after the spawn: the
marker (`ORCH_TASK=run:task:attempt@store`) is committed with the in_progress transition,
before the process starts. The mechanism is the host's strongest, chosen at run time:

- `scope`: systemd runs as PID 1: argv is wrapped in `systemd-run --scope --unit=orch-...`
  (`--user` when not root); the scope's cgroup holds every descendant, whatever it does.
- `cgroup`: a writable cgroup2 mount (found in /proc/self/mountinfo): a cgroup of our own,
  `<mount>/orch/orch-...`, which the child joins before it execs (preexec), so nothing it runs
  is ever outside it. Ended by `cgroup.kill` (Linux 5.14+), else by repeated scans.
- `marker`: neither: the environment marker scan, plus PR_SET_CHILD_SUBREAPER on orch so an
  orphan whose parent died is re-parented to orch (not init) and is still found as orch's child.

Every level also scans for the marker, so a process started under one mechanism is found by a
run that would choose another. What each level cannot catch: `scope`/`cgroup`: nothing that
runs as the same user can leave a cgroup it cannot write (root can move itself out; the child
between fork and joining is orch's copy and joins before exec, even if orch dies then).
`marker`: a process that clears its environment (`env -i`) and leaves the group, once orch is
gone (the subreaper only works while orch lives); a process that re-parents to another subreaper.
ORCH_CONTAINMENT=scope|cgroup|marker forces a level (tests, hosts where detection is wrong).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UsageError
from orchestrator.proc.procfs import is_alive, marked, session_members, session_of, terminate_pids

MECHANISMS = ("scope", "cgroup", "marker")
MARKERS = (b"ORCH_TASK=", b"ORCH_SERVER=")  # processes that belong to some task or server
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Jail:
    """Where the processes of one marker live, and how to end them."""

    marker: tuple[str, str]  # environment NAME, VALUE carried by every process of the jail
    mechanism: str
    session: int | None = None  # the pid its processes were started as a session of, if known

    @property
    def name(self) -> str:
        """A unit and cgroup name derived from the marker alone (so a later run finds it)."""
        digest = hashlib.sha256("=".join(self.marker).encode()).hexdigest()[:20]
        return f"orch-{digest}"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """argv as it must be started: inside a systemd scope for `scope`."""
        if self.mechanism != "scope":
            return list(argv)
        user = [] if os.geteuid() == 0 else ["--user"]
        return [
            "systemd-run",
            *user,
            "--scope",
            "--quiet",
            "--collect",
            f"--unit={self.name}",
            "--",
            *argv,
        ]

    def prepare(self) -> Callable[[], None] | None:
        """Set up before the spawn; returns the preexec function the child must run, if any."""
        if self.mechanism == "marker":
            _become_subreaper()
        if self.mechanism != "cgroup":
            return None
        path = _own_cgroup(self.name)
        if path is None:  # forced: detect() itself chooses cgroup only where there is a mount
            raise UsageError("ORCH_CONTAINMENT=cgroup, but this host has no cgroup2 mount")
        path.mkdir(exist_ok=True)
        procs = str(path / "cgroup.procs")

        def join() -> None:  # runs in the child between fork and exec: plain syscalls only
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)

        return join

    def cgroup(self) -> Path | None:
        """The jail's cgroup directory, if it exists (whatever mechanism made it)."""
        own = _own_cgroup(self.name)
        if own is not None and own.is_dir():
            return own
        return _scope_cgroup(self.name)

    def members(self) -> list[int]:
        """Live pids of the jail: its cgroup's, every marked process and every process in a
        session one of them leads (or `session`), adopted orphans."""
        pids = set(marked(self.marker))
        # A process that wrote over its environment (setproctitle) is still in the session
        # its jail's process leads. The kernel does not give a pid out again while a session
        # is named by it, so `session` whose leader is gone still names this jail's session;
        # one whose pid lives unmarked is another process's.
        sessions = {pid for pid in pids if session_of(pid) == pid}
        if self.session is not None and (self.session in pids or not is_alive(self.session)):
            sessions.add(self.session)
        if sessions:
            pids.update(session_members(sessions))
        if (cg := self.cgroup()) is not None:
            pids.update(_cgroup_procs(cg))
        if self.mechanism == "marker":
            pids.update(_adopted())
        pids.discard(os.getpid())
        return sorted(pid for pid in pids if is_alive(pid))

    def end(self, grace: float, leader: subprocess.Popen[Any] | None = None) -> list[int]:
        """SIGTERM every member, SIGKILL after `grace`; scan again until none is left (a
        process forked meanwhile is caught by the next scan). Returns every pid signalled."""
        ended: list[int] = []
        for _ in range(5):
            if not (pids := self.members()):
                break
            ended += terminate_pids(pids, grace if not ended else min(grace, 1.0), leader)
            if (cg := self.cgroup()) is not None:
                _kill_cgroup(cg)
        if leader is not None:
            leader.poll()
        _reap(ended)
        self.remove()
        return sorted(set(ended))

    def remove(self, wait: float = 5.0) -> None:
        """Remove our own empty cgroup (a scope is collected by systemd once empty), waiting up
        to `wait` seconds for it to empty: a killed process leaves it once its parent reaps it."""
        own = _own_cgroup(self.name)
        if own is None:
            return
        end = time.monotonic() + wait
        while True:
            try:
                own.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > end:
                    return  # still busy: the next run's end() of this jail removes it
                time.sleep(0.01)


def jail(marker: tuple[str, str], session: int | None = None) -> Jail:
    return Jail(marker, detect(), session)


@cache
def detect() -> str:
    """The strongest mechanism this host offers (see the module docstring)."""
    forced = os.environ.get("ORCH_CONTAINMENT", "")
    if forced in MECHANISMS:
        return forced
    if (
        Path("/run/systemd/system").is_dir()
        and shutil.which("systemd-run")
        and (os.geteuid() == 0 or _user_bus())
    ):
        return "scope"
    base = _base()
    if base is not None:
        with contextlib.suppress(OSError):
            base.mkdir(exist_ok=True)
            if os.access(base / "cgroup.procs", os.W_OK):
                return "cgroup"
    return "marker"


def cgroup2_mount() -> Path | None:
    """Where the cgroup2 file system is mounted (pure v2: /sys/fs/cgroup; hybrid: .../unified)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        if rest.split(" ", 1)[0] == "cgroup2":
            point = fields.split(" ")[4]
            # mountinfo escapes space, tab, newline and backslash as octal
            return Path(point.encode().decode("unicode_escape"))
    return None


def _base() -> Path | None:
    mount = cgroup2_mount()
    return None if mount is None else mount / "orch"


def _own_cgroup(name: str) -> Path | None:
    base = _base()
    return None if base is None else base / name


def _scope_cgroup(name: str) -> Path | None:
    """The cgroup of the systemd scope `name`, while it exists."""
    if not shutil.which("systemctl") or not Path("/run/systemd/system").is_dir():
        return None
    user = [] if os.geteuid() == 0 else ["--user"]
    try:
        out = subprocess.run(
            ["systemctl", *user, "show", "-p", "ControlGroup", "--value", f"{name}.scope"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    mount = cgroup2_mount()
    if not out or mount is None:
        return None
    path = mount / out.lstrip("/")
    return path if path.is_dir() else None


def _user_bus() -> bool:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return runtime is not None and Path(runtime, "bus").exists()


def _cgroup_procs(cgroup: Path) -> list[int]:
    """The pids in `cgroup` and below. A scope's cgroup goes when its last process does
    (`--collect`), at any moment, also while it is being read: gone, it holds nobody."""
    pids: list[int] = []
    try:
        files = [cgroup / "cgroup.procs", *cgroup.glob("**/cgroup.procs")]
    except OSError:  # removed while the glob walked it
        return pids
    for procs in files:
        with contextlib.suppress(OSError, ValueError):
            pids += [int(x) for x in procs.read_text().split()]
    return pids


def _kill_cgroup(cgroup: Path) -> None:
    """SIGKILL everything in the cgroup at once, atomically against forks (Linux 5.14+)."""
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.kill").write_text("1")


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)  # the kernel reads no other arg


def _adopted() -> list[int]:
    """Orch's children that carry no task or server marker: orphans re-parented to orch (as
    subreaper) after clearing their environment. Only one task runs at a time, so they are its."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if not any(e.startswith(MARKERS) for e in env):
            found.append(pid)
    return found


def _reap(pids: Sequence[int]) -> None:
    """Collect the exit status of ended orphans that became orch's children (subreaper)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
