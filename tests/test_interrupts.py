"""hold_interrupts(): Ctrl-C held back and delivered after, as a signal to the main thread
and as raise_in_thread to a task's thread, with real threads and real signals."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.proc.interrupts import hold_interrupts, nap, on_signal, raise_in_thread

ROOT = Path(__file__).resolve().parent.parent


class Worker(threading.Thread):
    """A thread that holds interrupts for `held` steps of 10 ms (the first half in a nested
    hold when `nested`), then spins for 3 s, and records where an interrupt reached it."""

    def __init__(self, held: int, nested: bool = False) -> None:
        super().__init__(daemon=True)
        self.held, self.nested = held, nested
        self.inside = threading.Event()
        self.steps_held = 0
        self.reached = "nowhere"

    def step(self, count: int) -> None:
        for _ in range(count):
            time.sleep(0.01)
            self.steps_held += 1

    def run(self) -> None:
        try:
            with hold_interrupts():
                self.inside.set()
                if self.nested:
                    with hold_interrupts():
                        self.step(self.held // 2)
                self.step(self.held - self.steps_held)
            for _ in range(300):
                time.sleep(0.01)
        except KeyboardInterrupt:
            self.reached = "after the hold" if self.steps_held == self.held else "in the hold"


def interrupt(worker: Worker, *then: type[BaseException] | None) -> Worker:
    """Start `worker`, interrupt it once it holds, then send `then`; wait for its end."""
    worker.start()
    worker.inside.wait(5)
    assert worker.ident is not None
    for exc in (KeyboardInterrupt, *then):
        raise_in_thread(worker.ident, exc)
    worker.join(10)
    return worker


@pytest.mark.parametrize("nested", [False, True])
def test_an_interrupt_sent_to_a_holding_thread_lands_after_the_hold(nested: bool) -> None:
    assert interrupt(Worker(held=30, nested=nested)).reached == "after the hold"


def test_none_clears_an_interrupt_held_for_a_thread() -> None:
    assert interrupt(Worker(held=30), None).reached == "nowhere"


def test_an_interrupt_to_a_thread_not_holding_lands_at_once() -> None:
    worker = Worker(held=0)
    worker.start()
    time.sleep(0.1)
    assert worker.ident is not None
    raise_in_thread(worker.ident, KeyboardInterrupt)
    worker.join(2)  # not the 3 s it spins for
    assert not worker.is_alive()
    assert worker.reached == "after the hold"


@pytest.mark.parametrize(
    ("signum", "said"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")]
)
def test_a_signal_to_the_main_thread_is_delivered_after_the_hold(signum: int, said: str) -> None:
    """With another thread alive, the kernel hands the signal to it (the main thread blocks
    it) and Python runs the handler in the main thread all the same: orch's handler holds it
    (seen in a suite: the mask alone let it land inside the hold)."""
    stop = threading.Event()
    bystander = threading.Thread(target=stop.wait, daemon=True)
    bystander.start()
    previous = signal.signal(signum, on_signal)
    done_inside = False
    try:
        with pytest.raises(KeyboardInterrupt) as got, hold_interrupts():
            os.kill(os.getpid(), signum)
            for _ in range(5):
                time.sleep(0.02)  # a signal not held would be raised here
            done_inside = True
    finally:
        signal.signal(signum, previous)
        stop.set()
        bystander.join()
    assert done_inside
    assert getattr(got.value, "signal_name", "Ctrl-C") == said
    assert signum not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_an_interrupt_pending_as_a_hold_begins_leaves_the_thread_interruptible() -> None:
    """An interrupt set on a thread just before its hold registers (here: while it waits for
    the registry's lock) lands in the registering: the thread is then not left holding, deaf
    to every later interrupt."""
    from orchestrator.proc import interrupts

    worker = Worker(held=30)
    with interrupts._holding_lock:  # the worker blocks in Held() on this lock
        worker.start()
        time.sleep(0.2)
        assert worker.ident is not None
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(worker.ident), ctypes.py_object(KeyboardInterrupt)
        )
    worker.join(5)
    assert worker.reached == "in the hold" and not worker.inside.is_set()
    assert worker.ident not in interrupts._holding


def test_none_clears_an_interrupt_set_on_a_thread_not_holding() -> None:
    """How a timer's TaskTimeout is withdrawn once its block ended (builtins._thread_alarm)."""
    ended = threading.Event()

    def sleep_then_end() -> None:
        time.sleep(0.5)  # one C call: nothing is raised before it returns
        ended.set()

    thread = threading.Thread(target=sleep_then_end, daemon=True)
    thread.start()
    time.sleep(0.1)
    assert thread.ident is not None
    raise_in_thread(thread.ident, KeyboardInterrupt)
    raise_in_thread(thread.ident, None)
    thread.join(5)
    assert ended.is_set()


def test_a_nap_lasts_its_time_and_an_interrupt_ends_it_within_a_slice() -> None:
    started, cpu = time.monotonic(), time.thread_time()
    nap(0.3)
    assert time.monotonic() - started >= 0.3
    assert time.thread_time() - cpu < 0.05  # asleep, not spinning
    napped: list[float] = []

    def long_nap() -> None:
        begun = time.monotonic()
        with contextlib.suppress(KeyboardInterrupt):
            nap(30)
        napped.append(time.monotonic() - begun)

    thread = threading.Thread(target=long_nap, daemon=True)
    thread.start()
    time.sleep(0.2)
    assert thread.ident is not None
    raise_in_thread(thread.ident, KeyboardInterrupt)
    thread.join(10)
    assert napped and napped[0] < 10


def test_a_signal_outside_a_hold_is_raised_at_once() -> None:
    previous = signal.signal(signal.SIGINT, on_signal)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_whose_handler_runs_while_the_registry_is_locked_is_raised() -> None:
    """Python runs a handler between two instructions of the main thread, also inside a block
    that holds the registry's lock (raise_in_thread at a second Ctrl-C): the handler takes it
    again rather than wait for itself forever."""
    script = (
        "import os, signal, time\n"
        "from orchestrator.proc import interrupts\n"
        "signal.signal(signal.SIGINT, interrupts.on_signal)\n"
        "try:\n"
        "    with interrupts._holding_lock:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(1)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert r.stdout == "interrupted\n", r.stderr
