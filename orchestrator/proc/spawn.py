"""Subprocesses in their own process group, output to a log file, ended as a group.

Why a group per task: `bash -c "a | b &"` and inference servers fork; killing only the main pid
leaves workers holding GPU memory (a SIGKILL to vLLM's main process alone left 2.2 GB of
workers running). Why the output goes straight to a file, not a pipe: if the orchestrator
dies, the child can still write and never blocks on a full pipe. Except while a secret is
registered (core/redact.py): then it goes through a pipe that a thread of orch
reads and writes to the file masked (`_Pump`), since no later reader can mask what it does not
know; a child that outlives a killed orch then meets a closed pipe, and the next run ends it.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from orchestrator.core.durations import format_seconds
from orchestrator.core.errors import TaskError, TaskTimeout
from orchestrator.core.redact import active, mask
from orchestrator.core.safeopen import open_for_append, open_for_update
from orchestrator.core.umask import user_umask
from orchestrator.proc.containment import jail
from orchestrator.proc.interrupts import hold_interrupts
from orchestrator.proc.procfs import (
    group_members,
    last_line,
    process_start_time,
    terminate_group,
)
from orchestrator.proc.stalls import StallPolicy, StallReport, StallWatcher, act, evidence_path
from orchestrator.proc.tasklog import MaskedLog, log_lines

PROGRESS_EVERY = 10.0  # seconds between "still running" notes for long processes
LOG_LIMIT = 64 * 1024 * 1024  # default cap on one process's output in its task log
LOG_CHECK_EVERY = 0.2  # seconds between checks of the log's size while a process runs


@dataclass(frozen=True)
class ProcessResult:
    returncode: int
    log_path: Path
    log_offset: int  # where this process's output starts in the log

    def lines(self) -> Iterator[str]:
        return log_lines(self.log_path, self.log_offset)

    def describe(self) -> str:
        if self.returncode < 0:
            return f"signal {signal.Signals(-self.returncode).name}"
        return f"exit code {self.returncode}"


def run_process(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    deadline: float | None = None,
    timeout: float | None = None,
    grace: float = 10.0,
    on_start: Callable[[int, float], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
    log_limit: int | None = LOG_LIMIT,
    jail_by: str = "ORCH_TASK",
    stall: StallPolicy | None = None,
    on_stall: Callable[[StallReport], None] | None = None,
) -> ProcessResult:
    """Run argv to completion; when it ends, on deadline or any exception (Ctrl-C) end every
    process it started: its group, and its jail (containment.py) when `env` carries `jail_by`.

    `timeout` (the task's, of which `deadline` is the end) names it in the timeout's message.
    The log keeps at most about `log_limit` bytes of this process's output (see LogCap). With
    `stall`, a process tree that makes no progress for `stall.after` seconds is reported to
    `on_stall` (stalls.py), then waited on, or ended with TaskStalled, as `stall.action` says."""

    if cwd is not None and not Path(cwd).is_dir():  # the plan's mistake, said so: no traceback
        what = "is not a folder" if Path(cwd).exists() else "does not exist"
        raise TaskError(f"cwd {mask(str(cwd))!r} {what}")
    full_env = {**os.environ, **(env or {})}
    box = jail((jail_by, full_env[jail_by])) if jail_by in full_env else None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A Ctrl-C or SIGTERM that lands while the child is being forked, before `proc` is known
    # to the `try` below, would leave it running: they are held until that `try` is entered.
    held = hold_interrupts()
    try:
        with open_for_append(log_path, binary=True) as log:
            log.write(f"$ {mask(shlex.join(argv))}\n".encode())  # what ran, for `orch logs`
            log.flush()  # before the child writes to the same file
            offset = log.tell()
            started = time.monotonic()
            masked = active()  # a secret to keep out of the file: through orch (_Pump)
            proc = subprocess.Popen(
                box.wrap(argv) if box else list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if masked else log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,  # own session => own process group, no terminal SIGINT
                preexec_fn=_child_setup(held.mask_before, box.prepare() if box else None),
                umask=user_umask(),
            )
    except BaseException:
        held.release()
        raise
    pump = _Pump(proc.stdout, log_path) if proc.stdout is not None else None

    def end() -> None:
        with hold_interrupts():  # a second Ctrl-C must not leave the group or the jail half-ended
            terminate_group(proc.pid, grace, proc)
            if box is not None:
                box.end(grace, proc)

    cap = LogCap(log_path, offset, log_limit) if log_limit is not None else None
    watch = None
    if stall is not None:

        def members() -> list[int]:
            return box.members() if box is not None else group_members(proc.pid)

        watch = StallWatcher(stall, members, log_path, offset, evidence_path(log_path))
    try:
        held.release()  # a Ctrl-C held meanwhile is raised here
        if on_start is not None:
            on_start(proc.pid, process_start_time(proc.pid) or 0.0)
        next_note = started + PROGRESS_EVERY
        while True:
            now = time.monotonic()
            wait_for = min(next_note - now, LOG_CHECK_EVERY if cap or watch else PROGRESS_EVERY)
            if deadline is not None:
                wait_for = min(wait_for, deadline - now)
            try:
                proc.wait(timeout=max(wait_for, 0.0))
                break
            except subprocess.TimeoutExpired:
                pass
            if cap is not None:
                cap.check()
            if watch is not None and (report := watch.check()) is not None:
                _stalled(report, on_stall)
                watch.rebase()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                end()
                # The task's timeout, not the process's own time: the deadline was set as the
                # task began, before the spawn (under load `after 199ms` of a 200ms timeout).
                took = timeout if timeout is not None else now - started
                raise TaskTimeout(f"timed out after {format_seconds(took)}; its processes ended")
            if on_wait is not None and now >= next_note:
                on_wait(f"running for {now - started:.0f}s: {last_line(log_path, offset)}")
                next_note = now + PROGRESS_EVERY
        # The leader is done; helpers it left behind must not outlive the task.
        end()
    except BaseException:
        end()
        raise
    finally:
        if pump is not None:
            pump.close()
        if cap is not None:
            cap.check()
        if watch is not None:
            watch.close()
    return ProcessResult(proc.returncode, log_path, offset)


class _Pump:
    """A child's output read by a thread and appended to its log masked (tasklog.MaskedLog)."""

    def __init__(self, source: IO[bytes], log_path: Path) -> None:
        self.source, self.log = source, MaskedLog(log_path)
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self.pump, name="orch-output", daemon=True)
        self.thread.start()

    def pump(self) -> None:
        fd = self.source.fileno()
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    if (
                        self.ended.is_set()
                    ):  # the group is gone; an escaped writer is not waited for
                        break
                    continue
                if not (data := os.read(fd, 65536)):
                    break
                self.log.write(data)
        finally:
            self.log.close()

    def close(self) -> None:
        """After the processes ended: what is left in the pipe is written, then it is closed."""
        self.ended.set()
        self.thread.join()
        self.source.close()


def _stalled(report: StallReport, on_stall: Callable[[StallReport], None] | None) -> None:
    """Record a stall, then act on it: TaskStalled (ending the processes) unless `wait`."""

    if on_stall is not None:
        on_stall(report)
    act(report)


def _child_setup(
    mask_before: set[int | signal.Signals], then: Callable[[], None] | None
) -> Callable[[], None]:
    """What the child runs between fork and exec: the signal mask it would have had (a fork
    inherits the parent's, held signals included), then the jail's own step."""

    def setup() -> None:  # plain syscalls only
        signal.pthread_sigmask(signal.SIG_SETMASK, mask_before)
        if then is not None:
            then()

    return setup


class LogCap:
    """Keep a process's log at about `limit` bytes: its first half, a note, its latest output.

    The child writes straight to the file (O_APPEND, see the module docstring), so orch cuts
    it while it waits: once the output passes `limit`, the file is truncated back to the head
    and a fixed-width note, and the child's next writes land after the note. A child never
    blocks and is never signalled for its output; if orch dies the cap is no longer enforced.
    Between two checks (LOG_CHECK_EVERY) the file can grow past the cap by what the child
    writes meanwhile; what is cut is gone, findings printed in it included.
    """

    NOTE = "\n[orch: log cut at {limit}; {dropped:>20} bytes dropped here]\n"

    def __init__(self, path: Path, offset: int, limit: int) -> None:
        self.path, self.limit = path, max(limit, 1024)
        self.head_end = offset + self.limit // 2  # where the note goes
        self.dropped = 0

    def note(self) -> bytes:
        mib = f"{self.limit / 1048576:g} MiB"
        return self.NOTE.format(limit=mib, dropped=self.dropped).encode()

    def check(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size <= self.head_end + self.limit // 2 + len(self.note()):
            return
        tail_start = size - self.limit // 4  # keep the latest quarter after the note
        with open_for_update(self.path) as f:
            body_start = self.head_end + (len(self.note()) if self.dropped else 0)
            f.seek(tail_start)
            latest = f.read(size - tail_start)
            self.dropped += tail_start - body_start
            f.seek(self.head_end)
            f.write(self.note())
            f.write(latest)
            f.truncate()
