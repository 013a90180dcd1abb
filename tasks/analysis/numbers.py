"""Numbers as the analysis writes them: ratios, concurrencies, token rates, spans."""

from __future__ import annotations

import math


def fx(ratio: float) -> str:
    """1.4x, 0.36x, 1.0x."""
    text = f"{ratio:.2f}"
    return (text[:-1] if text.endswith("0") else text) + "x"


def fc(concurrency: float) -> str:
    """Requests in flight: 48, 7.9, 31.5."""
    return f"{concurrency:.3g}"


def ft(tok_s: float) -> str:
    """Tokens per second: 63.6, 849, 2370, 410.2."""
    return f"{tok_s:.4g}" if abs(tok_s) < 10_000 else f"{tok_s:.0f}"


def fr(value: float) -> str:
    """A ratio's interval end: 1.21; an unbounded one: inf."""
    return "inf" if math.isinf(value) else f"{value:.2f}"


def _and(items: list[str]) -> str:
    """'1', '1 and 4', '1, 4 and 8'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _span(values: list[float]) -> str:
    """Speed-ups of several levels: '1.3-1.8x', '0.58-0.60x', or '1.4x' when they agree."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    if lo == hi:
        return fx(min(values))
    if lo.endswith("0") and hi.endswith("0"):
        lo, hi = lo[:-1], hi[:-1]
    return f"{lo}-{hi}x"


def _value(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)
