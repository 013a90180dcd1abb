"""Sizes as plans write them: `64MiB`, `50G`, `500MB`, or a number of bytes."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(value: object) -> int:
    """Bytes from `50GiB`, `50G` (both binary, as `df -h` shows), `500MB` (decimal), or a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size (write e.g. 50GiB, 500MB)")
    number, prefix, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = "KMGTP".index(prefix) + 1 if prefix else 0
    decimal = bool(prefix) and not binary and str(value).strip().upper().endswith("B")
    return int(number * (1000 if decimal else 1024) ** power)
