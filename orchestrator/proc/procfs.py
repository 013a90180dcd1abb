"""The /proc toolkit: find processes (by group, session or orch's marker in their
environment), tell whether one lives, read what /proc says of it, and end them (TERM, a grace,
then KILL). Linux only. Knows nothing of tasks or of how processes were started (spawn.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from orchestrator.proc.interrupts import hold_interrupts


def terminate_group(
    pgid: int,
    grace: float,
    leader: subprocess.Popen[Any] | None = None,
    marker: tuple[str, str] | None = None,
) -> list[int]:
    """SIGTERM every live process of group `pgid`, SIGKILL what remains after `grace` seconds.

    With `marker` (an environment NAME, VALUE) only processes carrying it are signalled: a
    process group id recorded by a dead run may since have been reused by someone else.
    Returns the pids that were signalled.
    """
    return terminate_pids(group_members(pgid, marker), grace, leader)


def terminate_pids(
    pids: list[int], grace: float, leader: subprocess.Popen[Any] | None = None
) -> list[int]:
    """SIGTERM `pids`, wait up to `grace` seconds for them to go, then SIGKILL the rest.

    Ctrl-C and SIGTERM to orch are held back meanwhile (and delivered after): a second Ctrl-C
    during the grace period must not leave the group half-ended.
    """
    with hold_interrupts():
        return _terminate(pids, grace, leader)


def _terminate(pids: list[int], grace: float, leader: subprocess.Popen[Any] | None) -> list[int]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < end:
            if leader is not None:
                leader.poll()  # reap the leader so it does not linger as a zombie
            if not any(is_alive(pid) for pid in pids):
                return pids
            time.sleep(0.02)
    return pids


def group_members(pgid: int, marker: tuple[str, str] | None = None) -> list[int]:
    """Live (non-zombie) pids whose process group is `pgid`."""
    members = _live_in(_PGRP, {pgid})
    return members if marker is None else [pid for pid in members if _has_marker(pid, marker)]


def session_members(sessions: Collection[int]) -> list[int]:
    """Live pids whose session is one of `sessions` (a session is named by its leader's pid).

    A process that writes over its own environment loses the marker (setproctitle does, to
    make room for a longer title: SGLang's scheduler and detokenizer), but stays in the
    session it was started in unless it calls setsid itself."""
    return _live_in(_SESSION, sessions)


# Fields of stat_fields(): [pid, comm, state, ppid, pgrp, session, ...] (proc(5)).
_PGRP, _SESSION = 4, 5


def _live_in(field: int, ids: Collection[int]) -> list[int]:
    """Live (non-zombie) pids whose stat `field` (process group, session) is one of `ids`."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit()
        and (stat := stat_fields(int(entry))) is not None
        and stat[2] not in ("Z", "X")
        and int(stat[field]) in ids
    ]


def session_of(pid: int) -> int | None:
    stat = stat_fields(pid)
    return None if stat is None else int(stat[_SESSION])


def marked(marker: tuple[str, str]) -> list[int]:
    """Live pids anywhere on the host whose environment carries `marker` (NAME, VALUE).

    Children inherit the environment, so this finds every process a server spawned however it
    was spawned: in its group or out of it (`setsid`, a daemonizing double fork, vLLM's
    EngineCore and workers). Only a process that clears its own environment escapes it.
    """
    return [
        pid
        for entry in os.listdir("/proc")
        if entry.isdigit()  # environ first: rarer
        if _has_marker(pid := int(entry), marker) and is_alive(pid)
    ]


def terminate_marked(
    marker: tuple[str, str], grace: float, leader: subprocess.Popen[Any] | None = None
) -> list[int]:
    """End every process carrying `marker`, scanning again until none is left: a process
    forked while the first ones were ending (a worker respawned) is caught by the next scan.
    Returns every pid signalled; a process that will not die is the caller's to report."""
    ended: list[int] = []
    for _ in range(5):
        if not (pids := [pid for pid in marked(marker) if pid != os.getpid()]):
            break
        ended += terminate_pids(pids, grace if not ended else min(grace, 2.0), leader)
    return sorted(set(ended))


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    stat = stat_fields(pid)
    return stat is not None and stat[2] not in ("Z", "X")


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat, with the command name (which may hold spaces) as one field."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    head, _, tail = raw.rpartition(")")
    pid_part, _, comm = head.partition(" (")
    return [pid_part, comm, *tail.split()]


def _has_marker(pid: int, marker: tuple[str, str]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{marker[0]}={marker[1]}".encode() in env


def process_start_time(pid: int) -> float | None:
    """When `pid` started, in seconds since boot (exact, from /proc), or None if it is gone.

    With the pid and the boot id this identifies a process: a reused pid starts later.
    """
    stat = stat_fields(pid)
    if stat is None:
        return None
    return int(stat[21]) / os.sysconf("SC_CLK_TCK")


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def last_line(path: Path, offset: int = 0, limit: int = 200) -> str:
    """The last non-empty line of a log, cut to `limit` characters."""
    lines = tail(path, 1, offset)
    return lines[-1][:limit] if lines else "(no output yet)"


def tail(path: Path, count: int, offset: int = 0) -> list[str]:
    """The last `count` non-empty lines of a log after `offset`, reading only its end."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(offset, size - 64 * 1024)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-count:]
