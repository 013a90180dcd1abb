"""How Ctrl-C (and SIGTERM, SIGHUP) reaches the code that runs a task, and how it is held back
where it must not land: between forking a child and knowing its pid, or while ending a group.

The main thread gets them as signals: Python runs every handler there. A task run in a thread
(`--jobs N`) cannot handle a signal, so the main thread passes the interrupt on with
`raise_in_thread`, and a timeout reaches it the same way. `hold_interrupts()` holds both
kinds back and delivers them after, so that a second Ctrl-C never leaves a group half-ended,
whichever thread ends it. The main thread's signal mask alone cannot hold a signal once other
threads exist: the kernel gives a process's signal to any thread that does not block it, and
Python still runs the handler in the main thread. So orch's handler (`on_signal`) itself
defers while the main thread holds.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType

from orchestrator.core.errors import Interrupted

INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

# Threads inside hold_interrupts(), each with the interrupt that came meanwhile (None: none yet).
_holding: dict[int, BaseException | type[BaseException] | None] = {}
# Reentrant: on_signal takes it in the main thread, maybe between two instructions of a block
# that holds it there already (raise_in_thread from stop_threads at a second Ctrl-C).
_holding_lock = threading.RLock()


class Held:
    """Interrupts held back from `hold_interrupts()` until `release()`, called once (or the
    `with` block's end), which delivers the last one that came, as the kernel delivers a
    blocked signal."""

    def __init__(self) -> None:
        self.mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
        self.thread = threading.get_ident()
        self.outermost = False
        try:
            with _holding_lock:
                self.outermost = self.thread not in _holding  # a nested hold releases nothing
                _holding.setdefault(self.thread, None)
        except BaseException:  # one raised in this thread just before the hold: not kept
            self.release()
            raise

    def release(self) -> None:
        came = None
        try:
            if self.outermost:
                with _holding_lock:
                    came = _holding.pop(self.thread, None)
        finally:  # even if a signal's handler raises in between: the mask is never left blocked
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask_before)  # a held signal: here
        if came is not None:
            raise came

    def __enter__(self) -> None:
        """Nothing more: the hold began when it was made."""

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def hold_interrupts() -> Held:
    return Held()


def on_signal(signum: int, frame: FrameType | None) -> None:
    """The handler for Ctrl-C, SIGTERM and SIGHUP (api.stoppable): KeyboardInterrupt, or
    Interrupted naming the signal, raised now, or when the main thread's hold ends."""
    exc = (
        KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signal.Signals(signum).name)
    )
    with _holding_lock:
        if (me := threading.get_ident()) in _holding:
            _holding[me] = exc
            return
    raise exc


def raise_in_thread(thread_id: int, exc: type[BaseException] | None) -> None:
    """`exc` raised in the thread `thread_id` at its next Python instruction, or when it
    leaves `hold_interrupts()`; None clears one set there and not yet raised."""
    import ctypes  # only for tasks in threads: not on every start

    with _holding_lock:
        if thread_id in _holding:
            _holding[thread_id] = exc
            return
        pending = ctypes.py_object(exc) if exc is not None else ctypes.c_void_p(0)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), pending)


def nap(seconds: float) -> None:
    """Sleep in slices: a task thread takes an interrupt (raise_in_thread) only between two
    bytecodes."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
