"""One live `orch run` per store, through an flock on `<store>.lock`.

The kernel drops an flock when its holder dies, however it dies, so a lock left by a dead
process is taken over with no manual step; the file's text only names the holder. It is never
opened through a link (core/safeopen.py): a run writes the holder's pid and argv into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from orchestrator.core.errors import StoreError, StoreLocked
from orchestrator.core.files import not_a_file
from orchestrator.core.safeopen import open_fd, refuse_link


class RunLock:
    def __init__(self, store_path: Path) -> None:
        self.path = store_path.with_name(store_path.name + ".lock")
        self._fd: int | None = None
        self._holder: dict[str, object] = {}

    def _refuse_odd(self) -> None:
        """A FIFO in the lock's place would be waited on forever when opened to read; a link
        would take the holder's text elsewhere."""
        refuse_link(self.path)
        if (what := not_a_file(self.path)) is not None:
            raise StoreError(f"the run lock {self.path} is {what}, not a file: remove it")

    def acquire(self, holder: dict[str, object]) -> None:
        self._refuse_odd()
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = open_fd(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # private: names the holder
        except OSError as exc:
            raise StoreError(f"cannot take the run lock {self.path}: {exc.strerror}") from None
        # `orch status` takes the lock for a moment to see whether a run is alive: retry
        # briefly, so such a glance is not mistaken for a live run.
        deadline = time.monotonic() + 0.5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
            os.close(fd)
            raise StoreLocked(
                f"{self.path.name[:-5]} is in use by {self.describe_holder()}; "
                "wait for that run to end, or stop it"
            ) from None
        self._fd = fd
        self._holder = {**holder, "locked_at": time.time()}
        self._write()

    def note_run(self, run_id: int) -> None:
        """Add the run's number to what a refused second run is told."""
        self._holder["run_id"] = run_id
        self._write()

    def _write(self) -> None:
        assert self._fd is not None
        # The text only names the holder for a refused run; the flock is the lock. A full disk
        # must not fail the run here: the store's own writes report it, with what to do.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps(self._holder).encode(), 0)

    def try_probe(self) -> bool:
        """True if no live process holds the lock (taken and released at once)."""
        self._refuse_odd()
        try:
            fd = open_fd(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def describe_holder(self) -> str:
        try:
            h = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return "another orch run"
        since = time.strftime("%H:%M:%S", time.localtime(h.get("locked_at", 0)))
        return (
            f"orch run #{h.get('run_id', '?')} (pid {h.get('pid', '?')} on "
            f"{h.get('host', '?')}, since {since})"
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays for the next run
            self._fd = None
