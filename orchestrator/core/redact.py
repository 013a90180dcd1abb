"""Secret values masked as `***` wherever orch writes text, as GitHub Actions masks its secrets.

A run registers its secret vars' values once (`register`); every sink that orch writes (the
store's text columns, the lock, the run log and events.jsonl, a task log's `$ command` line,
the board) passes its text through `mask`. One list per process because one orch process runs
one plan; the sinks need no plumbing to reach it. While a secret is registered, what a task's
own processes print reaches its log through orch (`Masker`, a pipe read by a thread), masked
before it is written, also a secret split across two reads: `orch logs`, the board's tail and
the report read the file, and a later `orch logs` may not know the secret (it came from the
environment of the run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

MASK = "***"

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
_bytes: re.Pattern[bytes] | None = None  # the same, for output read as bytes
_longest = 0  # bytes of the longest secret


def register(values: Iterable[Any]) -> None:
    """Mask these values from now on (empty ones are ignored: they would mask everything)."""
    global _pattern, _bytes, _longest
    _secrets.update(text for v in values if (text := str(v)))
    # Longest first, so a secret that contains another is masked whole.
    ordered = sorted(_secrets, key=len, reverse=True)
    _pattern = re.compile("|".join(re.escape(s) for s in ordered)) if _secrets else None
    encoded = sorted((s.encode() for s in _secrets), key=len, reverse=True)
    _bytes = re.compile(b"|".join(re.escape(b) for b in encoded)) if encoded else None
    _longest = max(map(len, encoded), default=0)


def masking(values: Iterable[Any]) -> Callable[[str], str]:
    """A mask for these values alone: a plan's secrets in its load errors, before (or without)
    a run that registers them."""
    texts = sorted({text for v in values if (text := str(v))}, key=len, reverse=True)
    if not texts:
        return lambda text: text
    pattern = re.compile("|".join(map(re.escape, texts)))
    return lambda text: pattern.sub(MASK, text)


def forget() -> None:
    """Drop every registered value (tests, and a process that runs several plans)."""
    global _pattern, _bytes, _longest
    _secrets.clear()
    _pattern = _bytes = None
    _longest = 0


def active() -> bool:
    """Whether any secret is registered (output then goes through a Masker)."""
    return _pattern is not None


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


class Masker:
    """Bytes in, the same bytes with every secret replaced by `***` out, however the stream is
    cut into reads: the last bytes that may begin a secret are held back until the next read
    shows whether they do (`feed`), and given out at the end (`close`)."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        if _bytes is None:
            whole, self.held = self.held + data, b""
            return whole
        buf = self.held + data
        cut = max(len(buf) - (_longest - 1), 0)  # a secret starting before `cut` is whole in buf
        out = bytearray()
        done = 0
        for m in _bytes.finditer(buf):
            if m.start() >= cut:
                break
            out += buf[done : m.start()] + MASK.encode()
            done = m.end()
        cut = max(cut, done)
        out += buf[done:cut]
        self.held = buf[cut:]
        return bytes(out)

    def close(self) -> bytes:
        out = self.held if _bytes is None else _bytes.sub(MASK.encode(), self.held)
        self.held = b""
        return out
