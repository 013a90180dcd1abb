"""What a path given to orch is, before orch opens it.

Opening a FIFO waits for a writer forever, reading /dev/zero never ends, and a folder or a
device read as a file gives nonsense: every file orch reads on the user's word (the plan, a
vars file, the store and its lock) is looked at first, and anything but a regular file is
refused with what it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_PLAN_BYTES = 1024 * 1024  # the repo's largest plan is ~5 KB
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_file(path: Path | str) -> str | None:
    """What is at `path` if it is something other than a regular file ('a FIFO (named pipe)',
    'a folder', ...), links followed; None for a regular file, nothing, or what cannot be
    looked at (whoever opens it says why)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bounded(path: Path, limit: int) -> bytes | None:
    """At most `limit` + 1 bytes of a regular file (more than `limit` tells it is too large);
    None for anything else or what cannot be read."""
    if not_a_file(path) is not None:
        return None
    try:
        with path.open("rb") as f:
            return f.read(limit + 1)
    except OSError:
        return None
