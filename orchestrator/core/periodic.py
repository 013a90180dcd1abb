"""A call repeated while a block runs: a long silent wait says it is still waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def every(seconds: float, call: Callable[[float], None], name: str) -> Iterator[None]:
    """`call(seconds since the block began)` every `seconds`, from a daemon thread named
    `name`, until the block ends (then the thread is joined: no call after the block)."""
    done, started = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(seconds):
            call(time.monotonic() - started)

    thread = threading.Thread(target=beat, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
