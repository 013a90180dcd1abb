"""Findings: the measured facts tasks leave in the store, and the line form processes print.

Leaf module (no pydantic): the store and the board read findings on the fast `status` path.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

FindingValue = int | float | str | bool

FINDING_PREFIX = "::finding "


@dataclass(frozen=True)
class Finding:
    """A measured fact a task leaves in the store: `throughput = 2370 tok/s`."""

    key: str
    value: FindingValue
    unit: str | None = None
    note: str | None = None


def parse_finding_line(line: str) -> Finding | None:
    """A finding printed by a subprocess, or None if the line is not one.

    Form: `::finding KEY=VALUE [unit=UNIT] [note=TEXT]`, words quoted as in a shell, e.g.
    `echo "::finding throughput=2370 unit=tok/s note='peak at c=128'"`.
    """
    if not line.startswith(FINDING_PREFIX):
        return None
    try:
        words = shlex.split(line[len(FINDING_PREFIX):])
    except ValueError:
        return None
    if not words or "=" not in words[0]:
        return None
    key, raw = words[0].split("=", 1)
    extras: dict[str, str] = {}
    last = ""
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if sep and name in ("unit", "note"):
            extras[last := name] = value
        elif last == "note":  # `echo ::finding x=1 note=no speedup`: the shell ate the quotes
            extras["note"] += " " + word
    return Finding(key, coerce_value(raw), extras.get("unit"), extras.get("note"))


def coerce_value(raw: str) -> FindingValue:
    """'42' -> 42, '0.42' -> 0.42; anything that would not print back the same stays text
    ('12.10', '1e5', '007', '1_000', 'nan', a 30-digit integer), so nothing is corrupted."""
    if _NUMBER.fullmatch(raw):
        if "." not in raw and _INT64_MIN <= (n := int(raw)) <= _INT64_MAX:
            return n
        if "." in raw and repr(f := float(raw)) == raw and math.isfinite(f):
            return f
    return raw


def checked(finding: Finding) -> Finding:
    """A finding the store can keep exactly: SQLite integers are 64-bit, and only plain
    scalars have a meaning on the board; a value outside that is kept as its text."""
    value = finding.value
    if isinstance(value, bool | str):
        return finding
    if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        return finding
    if isinstance(value, float) and math.isfinite(value):
        return finding
    return Finding(finding.key, str(value), finding.unit, finding.note)


_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
