"""A task's output on its way into its log: masked, however it is cut into writes.

One path for what a task prints, wherever it comes from: a process's output read from its
pipe (spawn.py's pump, while a secret is registered) and what a `python` task's code prints
in orch's own process (printed.py). Both append to `<task>.log`, which `orch logs`, the
board's tail, the report and the findings parser read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.redact import Masker
from orchestrator.core.safeopen import open_for_append


class MaskedLog:
    """Bytes appended to a log with every secret replaced by `***` (redact.Masker: a secret
    split across two writes is masked too). Unbuffered, so `orch logs -f` sees each write;
    locked, as several threads of one task may write at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open_for_append(path, binary=True, buffering=0)  # never through a link
        self.masker = Masker()
        self.lock = threading.Lock()
        self.closed = False

    def write(self, data: bytes) -> bool:
        """Append `data` masked; False once closed (the caller sends it elsewhere)."""
        with self.lock:
            if self.closed:
                return False
            self.file.write(self.masker.feed(data))
            return True

    def close(self) -> None:
        """Write the bytes held back (a possible start of a secret), then close."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            try:
                self.file.write(self.masker.close())
            finally:
                self.file.close()


def log_lines(path: Path, offset: int) -> Iterator[str]:
    """The log's lines from `offset` (where one process's or one call's output starts)."""
    with path.open("rb") as f:
        f.seek(offset)
        for raw in f:
            yield raw.decode("utf-8", "replace").rstrip("\r\n")
