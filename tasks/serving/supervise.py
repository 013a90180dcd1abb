"""Supervisors of a server: a transient systemd unit (`systemd-run --collect`, KillMode=mixed:
SIGTERM to the main process, then SIGKILL to the whole control group) where systemd runs,
else a process group of its own whose every process carries the ORCH_SERVER environment
marker (SIGTERM to every marked process on the host, SIGKILL after the grace, scanned again
until none is left, so one that left the group with `setsid` is ended too). Either way every
process the engine forks is ended: killing the API process alone leaves vLLM's EngineCore and
SGLang's schedulers holding the GPUs."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import Context, TaskError
from orchestrator.core.safeopen import ensure_private_dir, open_for_append
from orchestrator.core.terminal import plural
from orchestrator.core.umask import user_umask
from orchestrator.proc.containment import Jail, jail
from orchestrator.proc.procfs import is_alive
from probes.systemd import UnitNotFound, UnitState, read_unit, systemctl, systemd_unavailable

_children: dict[int, subprocess.Popen[bytes]] = {}  # ours to reap once ended


class _Unit:
    """A transient systemd unit: KillMode=mixed, so a stop takes its whole control group."""

    @staticmethod
    def name(name: str, ctx: Context) -> dict[str, Any]:
        unit = f"orch-{name.replace('_', '-')}-{ctx.run_id}-{secrets.token_hex(3)}.service"
        return {"supervisor": "systemd", "unit": unit}

    @staticmethod
    def start(
        handle: dict[str, Any],
        env: Mapping[str, str],
        stop_timeout: float,
        argv: list[str],
        log: Path,
        cwd: str,
    ) -> dict[str, Any]:
        unit = handle["unit"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
        cmd = [
            "systemd-run",
            "--quiet",
            "--collect",
            f"--unit={unit}",
            "--property=KillMode=mixed",
            f"--property=TimeoutStopSec={int(stop_timeout)}s",
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
        handle: dict[str, Any],
        env: Mapping[str, str],
        stop_timeout: float,
        argv: list[str],
        log: Path,
        cwd: str,
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
                        **env,
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


def new_handle(choice: str, name: str, ctx: Context) -> dict[str, Any]:
    """The handle of a server not started yet: under systemd where it runs (or where asked:
    `choice` systemd), else a process group."""
    if choice == "systemd" and (why := systemd_unavailable()):
        raise TaskError(f"supervisor systemd: {why}")
    use_systemd = choice == "systemd" or (
        choice == "auto"
        and systemd_unavailable() is None
        and shutil.which("systemd-run") is not None
    )
    return (_Unit if use_systemd else _Group).name(name, ctx)
