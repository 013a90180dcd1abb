"""orch's own files are private; the processes it starts keep the user's umask.

A leaf module: `main()` calls private_files() first thing, on every command, so this must cost
nothing to import (orchestrator.proc.spawn, which uses user_umask, imports subprocess).
"""

from __future__ import annotations

import os

_user_umask = -1  # the umask orch started with, once private_files() replaced it


def private_files() -> None:
    """From now on what orch creates (store, lock, logs, events, folders) is private: umask
    077. Task processes must not inherit that (a venv a task makes must stay usable by
    others): they get user_umask() back through subprocess.Popen(umask=...)."""
    global _user_umask
    previous = os.umask(0o077)
    if _user_umask == -1:
        _user_umask = previous


def user_umask() -> int:
    """The umask task processes get: the user's, or -1 (Popen: leave it) if never changed."""
    return _user_umask
