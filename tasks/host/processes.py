"""`process.stop`: stop a server that no supervisor runs (started by hand, in tmux, nohup).

Found by the port it listens on (or its pid). Its whole process group and every descendant
get SIGTERM, then SIGKILL after `grace`: the API process alone is not the server (vLLM's
EngineCore and workers survive their parent). Verified: no
process of it left and the port free. Nothing listening is `ok`, as with systemd.stop.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import Context, Duration, Task, TaskError
from orchestrator.proc.procfs import group_members, is_alive, terminate_pids
from probes.procs import listeners, process_info, process_tree


class StopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(None, ge=1, le=65535, description="the port it listens on")
    pid: int | None = Field(None, ge=2, description="or its pid")
    grace: Duration = Field(30.0, description="SIGTERM, then SIGKILL after this long")

    @model_validator(mode="after")
    def _one(self) -> StopParams:
        if (self.port is None) == (self.pid is None):
            raise ValueError("give exactly one of `port` or `pid`")
        return self


class ProcessStop(Task[StopParams]):
    """Stop the process listening on a port (or a pid), with its group and descendants."""

    Params = StopParams
    state_only = True  # the port is free: redone, it changes no later task's result

    def run(self, ctx: Context) -> None:
        p = self.params
        pid = p.pid
        if p.port is not None:
            held = listeners(p.port)
            found = [ln.process for ln in held if ln.process is not None]
            if not found and held:
                raise TaskError(f"port {p.port} is held by a process this user cannot see")
            pid = found[0].pid if found else None
        if pid is None or not is_alive(pid):
            where = f"on port {p.port}" if p.port else f"with pid {p.pid}"
            ctx.finding("stopped", False, note=f"nothing running {where}: already stopped")
            return
        info = process_info(pid)
        victims = self.victims(pid)
        ctx.progress(
            f"stopping pid {pid} ({info.label(80) if info else '?'}) and {len(victims) - 1} more"
        )
        started = time.monotonic()
        terminate_pids(victims, p.grace)
        took = time.monotonic() - started
        left = [v for v in victims if is_alive(v)]
        if left:
            raise TaskError(
                f"processes {left} survived SIGKILL (stuck in the kernel? see /proc/PID/stack)"
            )
        if p.port is not None and listeners(p.port):
            raise TaskError(f"port {p.port} is still in use after stopping pid {pid}")
        ctx.finding("stopped", True, note=info.label(80) if info else None)
        ctx.finding("pid", pid)
        ctx.finding("processes_ended", len(victims))
        ctx.finding("duration", round(took, 2), "s")

    @staticmethod
    def victims(pid: int) -> list[int]:
        """pid, its descendants, and its process group unless that group is orch's own."""
        pids = {info.pid for info in process_tree(pid)} | {pid}
        pgid = os.getpgid(pid)
        if pgid != os.getpgid(0):
            pids |= set(group_members(pgid))
        pids.discard(os.getpid())
        return sorted(pids)
