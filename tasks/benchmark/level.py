"""A concurrency level: warm-up, windows until they agree, acceptance around each window, and
the kept windows merged into the level's figures."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from typing import Any

from tasks.benchmark.acceptance import combine, of_window
from tasks.benchmark.params import HEADLINE, TIMING, BenchParams, Prompt, Target
from tasks.benchmark.pool import clients
from tasks.benchmark.windows import Measured, Windows, spread, summarize_level
from tasks.serving.engines import GENERIC, Engine


async def measure_level(
    target: Target,
    prompts: list[Prompt],
    p: BenchParams,
    concurrency: int,
    k: int | None,
    progress: Callable[[str], None] | None = None,
    every: float = 10.0,
) -> Measured:
    """Warm-up, then windows until the last `min_windows` agree or `max_windows` were run."""
    level = Windows(concurrency, p, progress)
    async with clients(target, prompts, p, concurrency, progress, every) as window:
        for number in range(1, p.max_windows + 1):
            # The engine's counters around the window, where it keeps any (else its answers
            # carry their own counts).
            before = await asyncio.to_thread(target.adapter.counters, target.url)
            outcomes, duration, loads = await window(f"c={concurrency} window {number}")
            after = await asyncio.to_thread(target.adapter.counters, target.url) if before else {}
            spec = of_window(target, before, after, outcomes, k)
            if (measured := level.add(number, outcomes, duration, spec, loads)) is not None:
                return measured
    return level.end()


def merge_windows(
    concurrency: int, measured: Measured, adapter: Engine = GENERIC
) -> dict[str, Any]:
    """The level: each headline figure the median of the windows with [min, max] as its
    interval; percentiles and counts over all the windows' requests pooled. TTFT, TPOT and ITL
    from the timed windows only (a window kept for throughput alone has its few observed
    answers, too few to stand for it): none timed, none of them. Acceptance: the windows'
    counts summed, read by the engine's `adapter`."""
    windows = measured.windows
    timed = [w for w in windows if w.timed]
    level = summarize_level(
        concurrency, [o for w in windows for o in w.outcomes], sum(w.duration for w in windows)
    )
    timing = summarize_level(concurrency, [o for w in timed for o in w.outcomes], 1.0)
    level.update({key: timing[key] for key in TIMING})
    interval: dict[str, list[float]] = {}
    for key in HEADLINE:
        among = timed if key in TIMING else windows
        values = [w.figures[key] for w in among if w.figures[key] is not None]
        if values:
            level[key] = statistics.median(values)
            interval[key] = [min(values), max(values)]
    level.update(
        windows=len(windows),
        stable=measured.stable,
        spread=round(spread([w.figures["output_tok_s"] for w in windows]), 4),
        interval=interval,
        rejected=measured.rejected,
        timing_unobserved=measured.timing_unobserved,
        per_window=[
            {
                **{
                    key: None if key in TIMING and not w.timed else w.figures[key]
                    for key in (*HEADLINE, "duration_s")
                },
                **({"client": w.figures["client"]} if "client" in w.figures else {}),
            }
            for w in windows
        ],
    )
    if spec := combine(adapter, [{"spec": w.spec} for w in windows if w.spec]):
        level["spec"] = spec
    if unused := combine(adapter, [{"spec": s} for s in measured.unused_spec]):
        level["spec_unused"] = unused
    return level
