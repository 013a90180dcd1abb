"""Acceptance of speculative decoding from the engine's counts: the engine's adapter reads its
counts (around a window, or in each answer) and turns them into tau and k; the strict rate and
alpha from there are orch's, one definition for every engine. A window's, a level's and a
sweep's acceptance all come from counts summed, never from rates averaged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tasks.analysis.models import COUNT_NAMES
from tasks.analysis.speculation import alpha_from_tau, strict_rate
from tasks.benchmark.params import Outcome, Target
from tasks.serving.engines import ENGINES, Engine
from tasks.serving.engines.base import Counts, summed


def acceptance(tau: float, k: float) -> dict[str, Any]:
    """tau with k, on one definition: strict rate (tau-1)/k and the per-token alpha."""
    k_int = round(k)
    found: dict[str, Any] = {
        "accept_length": tau,
        "draft_tokens": k_int,
        "acceptance": strict_rate(tau, k_int),
        "acceptance_definition": "strict",
    }
    if 1.0 <= tau <= k_int + 1:
        found["alpha"] = alpha_from_tau(tau, k_int)
    return found


def measured(adapter: Engine, counts: Counts, k: int | None) -> dict[str, Any] | None:
    """What `counts` say: tau, k and the rates, the engine's own figures, the counts (those
    orch.bench/v2 names at its top level there too: COUNT_NAMES)."""
    if (m := adapter.measure(counts, k)) is None:
        return None
    named = {key: int(value) for key, value in counts.items() if key in COUNT_NAMES}
    return {**acceptance(m.tau, m.k), **m.figures, **named, "counts": counts}


def of_window(
    target: Target, before: Counts, after: Counts, outcomes: Sequence[Outcome], k: int | None
) -> dict[str, Any] | None:
    """A window's acceptance: the counters around it, or its answers' own counts."""
    streams = [o.stream() for o in outcomes if o.ok]
    counts = target.adapter.window_counts(before, after, streams)
    return None if counts is None else measured(target.adapter, counts, k)


def combine(adapter: Engine, levels: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Acceptance over several measurements (a level's windows, a sweep's levels), from their
    summed counts."""
    specs = [lv["spec"] for lv in levels if lv.get("spec")]
    if not specs:
        return None
    return measured(adapter, summed([s["counts"] for s in specs]), specs[0]["draft_tokens"])


def unmeasured_acceptance(target: Target, algorithm: str | None) -> str | None:
    """Why a benchmark has no acceptance, where one was possible or cannot be ruled out;
    None for a server known not to speculate."""
    if target.engine is None:
        asked = ", ".join(e.title for e in ENGINES.values())
        return (
            f"not measured: the server answered as none of the engines orch knows ({asked}), "
            "so whether it speculates, and where it reports acceptance, is unknown"
        )
    if algorithm is None:
        return None
    return target.adapter.unmeasured(target.api, algorithm)
