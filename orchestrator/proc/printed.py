"""What a `python` task's code prints, in orch's own process, routed into its task's log.

A `python` task runs inside orch, so its print(), sys.stdout.write and sys.stderr.write would
land on orch's own stdout and stderr (which CI keeps) raw, a secret included. While such a
task runs, sys.stdout and sys.stderr are routers: a write from a thread that belongs to a
running task goes to that task's log through tasklog.MaskedLog (masked as a process's output
is); any other thread's write goes to the stream that was there before. Per thread, not a
global swap: under `--jobs N` tasks run in threads side by side, and the main thread redraws
the board and logs meanwhile; a global redirect would take their output too.

A thread belongs to a task if it is the task's own thread or was started (threading.Thread,
so concurrent.futures too) by a thread that belongs to it while the task runs. Not covered,
reaching orch's streams as they always did: writes below sys.stdout (os.write to fd 1 or 2,
a C extension's printf, a child process inheriting the fds: run such code as a `shell` task,
whose output is a process's), and a thread still printing after its task's function returned
(while another task's code runs, each of its writes is masked on its own; after, raw): join
the threads you start.

The routers are installed while at least one task's code runs and removed after the last,
so orch's logger (bound to the real stderr when the run starts) is never routed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from orchestrator.core.redact import mask
from orchestrator.proc.tasklog import MaskedLog

_lock = threading.Lock()
_routes: dict[threading.Thread, MaskedLog] = {}  # the threads of each running task
_users = 0  # tasks running with routers installed
_start: Callable[[threading.Thread], None] | None = None  # Thread.start as it was before


def _sink() -> MaskedLog | None:
    return _routes.get(threading.current_thread())


class _Router:
    """sys.stdout or sys.stderr while tasks' code runs: each write to the writing thread's
    task log, else to `real`. Everything else (encoding, fileno, ...) is the real stream's."""

    def __init__(self, real: TextIO | None) -> None:
        self.real = real

    def write(self, text: str) -> int:
        sink = _sink()
        if sink is not None and sink.write(text.encode("utf-8", "backslashreplace")):
            return len(text)
        if self.real is None:  # no stream (pythonw, closed): print() wrote nothing before
            return len(text)
        # orch's own text, or a thread that outlived its task: never a secret raw.
        return self.real.write(mask(text) if sink is not None else text)

    def writelines(self, lines: Iterator[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _sink() is None and self.real is not None:
            self.real.flush()  # a task's log is unbuffered

    def isatty(self) -> bool:
        # A task's output goes to a file: no colours, no progress bars redrawn in place.
        return _sink() is None and self.real is not None and self.real.isatty()

    @property
    def buffer(self) -> Any:
        return _BinaryRouter(self.real.buffer if self.real is not None else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _BinaryRouter:
    """sys.stdout.buffer as a task's code sees it: bytes to its log, as _Router's text."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        sink = _sink()
        if sink is not None and sink.write(bytes(data)):
            return len(data)
        if self.real is None:
            return len(data)
        written: int = self.real.write(
            mask(bytes(data).decode("utf-8", "replace")).encode() if sink is not None else data
        )
        return written

    def flush(self) -> None:
        if _sink() is None and self.real is not None:
            self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _tracking(start: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
    """threading.Thread.start while routers are installed: a thread started by a task's
    thread belongs to that task."""

    def started_by(thread: threading.Thread) -> None:
        if (sink := _sink()) is not None:
            with _lock:
                _routes[thread] = sink
        start(thread)

    return started_by


@contextmanager
def printed_into(log_path: Path) -> Iterator[None]:
    """While the block runs, what this thread (and threads it starts) writes to sys.stdout or
    sys.stderr is appended to `log_path`, masked."""
    global _users, _start
    sink = MaskedLog(log_path)
    me = threading.current_thread()
    with _lock:
        if _users == 0:
            sys.stdout, sys.stderr = _Router(sys.stdout), _Router(sys.stderr)
            _start = threading.Thread.start
            threading.Thread.start = _tracking(_start)  # type: ignore[method-assign,assignment]
        _users += 1
        _routes[me] = sink
    try:
        yield
    finally:
        with _lock:
            sink.close()
            # A thread that outlived the task stays known (its writes masked) while routers are.
            for thread in [t for t, s in _routes.items() if t is me or not t.is_alive()]:
                del _routes[thread]
            _users -= 1
            if _users == 0:
                _uninstall()


def _uninstall() -> None:
    global _start
    for name in ("stdout", "stderr"):
        router = getattr(sys, name)
        if isinstance(router, _Router):  # else the code replaced it: left as it is
            setattr(sys, name, router.real)
    if _start is not None:
        threading.Thread.start = _start  # type: ignore[method-assign,assignment]
        _start = None
    _routes.clear()
