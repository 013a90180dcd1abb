"""How Ctrl-C (and SIGTERM, SIGHUP) reaches the code that runs a task, and how it is held back
where it must not land: between forking a child and knowing its pid, or while ending a group.

The main thread gets them as signals. A task run in a thread (`--jobs N`) cannot handle a
signal, so the main thread passes the interrupt on with `raise_in_thread`, and a timeout
reaches it the same way. `hold_interrupts()` holds both kinds back and delivers them after,
so that a second Ctrl-C never leaves a group half-ended, whichever thread ends it.
"""

from __future__ import annotations

import signal
import threading
import time
from types import TracebackType

INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

# Threads inside hold_interrupts(), each with the interrupt that came meanwhile (None: none yet).
_holding: dict[int, type[BaseException] | None] = {}
_holding_lock = threading.Lock()


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
        if self.outermost:
            with _holding_lock:
                came = _holding.pop(self.thread, None)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask_before)  # a held signal: here
        if came is not None:
            raise_in_thread(self.thread, came)  # at this thread's next instruction

    def __enter__(self) -> None:
        """Nothing more: the hold began when it was made."""

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def hold_interrupts() -> Held:
    return Held()


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
