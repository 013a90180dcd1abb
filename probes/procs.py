"""Processes and ports, through psutil: who listens on a port, a process tree, a short label."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    name: str
    cmdline: str
    user: str

    def label(self, width: int = 90) -> str:
        """`pid 4121 python -m vllm.entrypoints... (user svc)`: what a blocked task shows."""
        cmd = self.cmdline or self.name
        cmd = cmd if len(cmd) <= width else cmd[: width - 3] + "..."
        return f"pid {self.pid} {cmd} (user {self.user})"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    process: ProcessInfo | None  # None when the socket's owner cannot be seen (not root)


def process_info(pid: int) -> ProcessInfo | None:
    """What is known of `pid`, or None if it is gone."""
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name = p.name()
            try:
                cmdline = " ".join(p.cmdline())
            except psutil.AccessDenied:
                cmdline = ""
            try:
                user = p.username()
            except (psutil.AccessDenied, KeyError):
                user = "?"
        return ProcessInfo(pid, name, cmdline, user)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return ProcessInfo(pid, "?", "", "?")


def listeners(port: int, host: str | None = None) -> list[Listener]:
    """Sockets listening on TCP `port` (on `host`, or any address), with their processes."""
    import psutil

    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        address = conn.laddr.ip
        if host is not None and address not in (host, "0.0.0.0", "::"):
            continue
        found.append(Listener(address, port, process_info(conn.pid) if conn.pid else None))
    return found


def process_tree(pid: int) -> list[ProcessInfo]:
    """`pid` and all its descendants that are still alive."""
    import psutil

    try:
        root = psutil.Process(pid)
        pids = [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
    return [info for p in pids if (info := process_info(p)) is not None]
