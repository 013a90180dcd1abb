"""Secret values masked as `***` wherever orch writes text, as GitHub Actions masks its secrets.

A run registers its secret vars' values once (`register`); every sink that orch writes (the
store's text columns, the lock, the run log and events.jsonl, a task log's `$ command` line,
the board) passes its text through `mask`. One list per process because one orch process runs
one plan; the sinks need no plumbing to reach it. What a task's own process prints to its log
file is not rewritten on disk (the child writes it straight to the file): it is masked when orch
reads it back (`orch logs`, the board's output tail), and the file is private to the user.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "***"

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register(values: Iterable[Any]) -> None:
    """Mask these values from now on (empty ones are ignored: they would mask everything)."""
    global _pattern
    _secrets.update(text for v in values if (text := str(v)))
    # Longest first, so a secret that contains another is masked whole.
    _pattern = (
        re.compile("|".join(re.escape(s) for s in sorted(_secrets, key=len, reverse=True)))
        if _secrets
        else None
    )


def forget() -> None:
    """Drop every registered value (tests, and a process that runs several plans)."""
    global _pattern
    _secrets.clear()
    _pattern = None


def mask(text: str) -> str:
    return text if _pattern is None else _pattern.sub(MASK, text)


def mask_value(value: Any) -> Any:
    """`value` with every string inside it masked (JSON-shaped data: dicts, lists, scalars)."""
    if _pattern is None:
        return value
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {k: mask_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_value(v) for v in value]
    return value
