"""Durations as plans write them: `30m`, `1h30m`, `10s`, `500ms`, or a number of seconds."""

from __future__ import annotations

import math
import re

MAX_SECONDS = 365 * 86400.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds from a duration; ValueError with a plain sentence when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 5m, 1h30m)")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too big for a float is not a usable duration
            seconds = math.inf
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        parts = _PART.findall(text)
        if re.fullmatch(r"\d+(?:\.\d+)?", text):  # `timeout: "10"` is seconds, as `10` is
            seconds = float(text)
        elif text and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
        else:
            raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 5m, 1h30m)")
    else:
        raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 5m, 1h30m)")
    if not math.isfinite(seconds):  # YAML's .nan and .inf would break every deadline
        raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 5m, 1h30m)")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    if seconds > MAX_SECONDS:  # beyond this, time arithmetic overflows mid-run
        raise ValueError(f"{value!r} is longer than 365 days")
    return seconds


def format_seconds(seconds: float) -> str:
    """A span for a sentence, in the plan's own units: 100ms, 1.5s, 30s, 5400s. Whole
    seconds alone would say `timed out after 0s` of a 0.1s timeout."""
    if round(seconds * 1000) < 1000:
        return f"{max(seconds, 0.0) * 1000:.0f}ms"
    if round(seconds, 1) < 10:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    return f"{seconds:.0f}s"


def format_duration(seconds: float | None) -> str:
    """Short human form for the board: 0.4s, 12s, 3m05s, 1h02m."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
