"""A measurement window: its requests' figures, its judging (errors, load not applied, tokens not
observed, a saturated client), and the windows of a level until they agree."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import TaskError
from tasks.benchmark.params import (
    CLIENT_BUSY,
    CLIENT_SATURATED,
    FAILED,
    LAG_EVERY,
    LATE_LIMIT,
    MAX_UNOBSERVED,
    NOT_APPLIED,
    UNOBSERVED,
    BenchParams,
    Outcome,
    Prompt,
    Target,
)
from tasks.benchmark.request import one_request


def stats_ms(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99 in ms; percentiles interpolated linearly (numpy's default)."""
    if not values:
        return {}
    ms = sorted(v * 1000 for v in values)
    if len(ms) == 1:
        return {"mean": ms[0], "p50": ms[0], "p90": ms[0], "p99": ms[0]}
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"mean": statistics.fmean(ms), "p50": q[49], "p90": q[89], "p99": q[98]}


def summarize_level(concurrency: int, outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    """The figures of a set of requests (a window, or a level's kept windows pooled), keys as
    orch.bench levels. Answers whose tokens were not observed one by one count for throughput
    and end-to-end latency, not for TTFT, TPOT or ITL."""
    done = [o for o in outcomes if o.ok]
    timed = [o for o in done if not o.unobserved]
    output = sum(o.output_tokens for o in done)
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in timed if o.output_tokens > 1]
    errors = [o.error for o in outcomes if not o.ok]
    level: dict[str, Any] = {
        "concurrency": concurrency,
        "completed": len(done),
        "errors": len(errors),
        "duration_s": round(duration, 4),
        "input_tokens": sum(o.prompt_tokens for o in done),
        "output_tokens": output,
        "output_tok_s": output / duration if duration > 0 else 0.0,
        "request_s": len(done) / duration if duration > 0 else 0.0,
        "achieved_concurrency": sum(o.latency for o in done) / duration if duration else 0.0,
        "ttft": stats_ms([o.ttft for o in timed]),
        "tpot": stats_ms(tpots),
        "itl": stats_ms([gap for o in timed for gap in o.itl]),
        "e2e": stats_ms([o.latency for o in done]),
    }
    level["ttft_ms"] = level["ttft"].get("mean")
    level["tpot_ms"] = level["tpot"].get("mean")
    if unobserved := len(done) - len(timed):
        level["unobserved"] = unobserved
    if errors:
        level["first_error"] = errors[0][:300]
    return level


def judge_window(
    concurrency: int,
    outcomes: list[Outcome],
    duration: float,
    clients: Sequence[ClientLoad],
    p: BenchParams,
) -> tuple[dict[str, Any], list[str], str | None]:
    """A window's figures (the client's own among them, where measured), why it must be
    measured again, and why the level cannot be measured at all (window_problems)."""
    figures = summarize_level(concurrency, outcomes, duration)
    if clients:
        figures["client"] = client_figures(clients)
    return figures, *window_problems(figures, outcomes, concurrency, p)


def window_problems(
    figures: dict[str, Any], outcomes: list[Outcome], concurrency: int, p: BenchParams
) -> tuple[list[str], str | None]:
    """(why this window must be measured again, why the level cannot be measured at all)."""
    done = [o for o in outcomes if o.ok]
    if not done:
        return [], f"every request failed: {figures.get('first_error')}"
    if p.ignore_eos and (short := [o for o in done if o.output_tokens < o.asked]):
        got = statistics.median(o.output_tokens for o in short)
        return [], (
            f"{len(short)} of {len(done)} answers were shorter than asked (median "
            f"{got:g} of {short[0].asked} tokens) although ignore_eos is set: the server "
            "stops early (max_model_len reached, ignore_eos not honoured, or no token "
            "counts in its `usage`), so its throughput is not the one asked for"
        )
    problems = []
    if (saturated := client_saturated(figures)) is not None:
        problems.append(saturated)  # then tokens that seem to come together are its doing
    elif (unobserved := figures.get("unobserved", 0)) > max(1.0, MAX_UNOBSERVED * len(done)):
        problems.append(
            f"{unobserved} of {len(done)} answers arrived with most of their tokens "
            f"together: {UNOBSERVED}, the server did not stream them as they were made"
        )
    if figures["errors"]:
        problems.append(
            f"{figures['errors']} of {len(outcomes)} {FAILED} ({figures.get('first_error')})"
        )
    expected = min(concurrency, p.requests)
    if figures["achieved_concurrency"] < 0.5 * expected:
        problems.append(
            f"{figures['achieved_concurrency']:.2f} requests in flight on average, "
            f"{expected} asked: {NOT_APPLIED}"
        )
    return problems, None


def client_saturated(figures: dict[str, Any]) -> str | None:
    """Why the window timed the load generator rather than the server, or None: any of its
    processes was (client_figures); the reason names the worst of those."""
    client = figures.get("client")
    if not client:
        return None
    each = client.get("per_process") or [client]
    if not (over := [w for w, c in enumerate(each) if _saturated(c)]):
        return None
    worst = max(over, key=lambda w: _strain(each[w]))
    c = each[worst]
    gap = figures["itl"].get("p50") or figures["tpot"].get("p50")
    against = f" (the token gaps it measured: {gap:.1f} ms median)" if gap is not None else ""
    lower = "lower the concurrency"
    loop = (
        f"its event loop used {c['busy']:.2f} of a core and was behind for {c['late']:.0%} "
        f"of the window (up to {c['lag_max_ms']:.0f} ms late){against}"
    )
    if len(each) == 1:
        return f"{CLIENT_SATURATED}: {loop}; give it a core of its own (`cpus`) or {lower}"
    return (
        f"{CLIENT_SATURATED}: {len(over)} of its {len(each)} processes fell behind; the worst, "
        f"process {worst + 1} of {len(each)} (pid {c['pid']}): {loop}; give it more cores "
        f"(`cpus`, `client_processes`) or {lower}"
    )


def _saturated(client: Mapping[str, Any]) -> bool:
    """One event loop's figures (ClientLoad.as_dict) past a limit: it timed itself."""
    return bool(client["busy"] >= CLIENT_BUSY or client["late"] > LATE_LIMIT)


def _strain(client: Mapping[str, Any]) -> float:
    """How near one event loop came to a limit (1: at it): the worst of several is the most
    strained."""
    return float(max(client["busy"] / CLIENT_BUSY, client["late"] / LATE_LIMIT))


def client_figures(loads: Sequence[ClientLoad]) -> dict[str, Any]:
    """A window's `client` figures: its one process's; over several, the most strained one's
    with `processes`, `worst` (its number, from 1) and each one's in `per_process`."""
    if len(loads) == 1:
        return loads[0].as_dict()
    each = [{**load.as_dict(), "pid": load.pid} for load in loads]
    worst = max(range(len(each)), key=lambda w: _strain(each[w]))
    return {
        **loads[worst].as_dict(),
        "processes": len(loads),
        "worst": worst + 1,
        "per_process": each,
    }


@dataclass(frozen=True)
class ClientLoad:
    """The load generator's own load over a window (one of its processes')."""

    busy: float  # CPU time of the event loop's thread / the window's wall time
    late: float  # the sum of its wake-ups' lateness / the window's wall time
    lag_p50_ms: float  # how late the loop woke from its LAG_EVERY naps: median, p99, max
    lag_p99_ms: float
    lag_max_ms: float
    pid: int | None = None  # a client process's (ClientPool); None: this process

    def as_dict(self) -> dict[str, float]:
        return {
            "busy": round(self.busy, 3),
            "late": round(self.late, 3),
            "lag_p50_ms": round(self.lag_p50_ms, 2),
            "lag_p99_ms": round(self.lag_p99_ms, 2),
            "lag_max_ms": round(self.lag_max_ms, 2),
        }


class LoopWatch:
    """Measures the running event loop over a window: its thread's CPU time, and how late it
    wakes from short naps (a loop busy reading answers, or starved of CPU, wakes late)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.cpu = time.thread_time()
        self.wall = time.perf_counter()

    async def watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_EVERY)
            self.lags.append(max(0.0, time.perf_counter() - before - LAG_EVERY))

    def result(self) -> ClientLoad:
        wall = time.perf_counter() - self.wall
        lags = sorted(self.lags) or [0.0]
        p50, p99 = (lags[min(len(lags) - 1, int(q * len(lags)))] for q in (0.5, 0.99))
        busy, late = ((time.thread_time() - self.cpu) / wall, sum(lags) / wall) if wall else (0, 0)
        return ClientLoad(busy, late, p50 * 1000, p99 * 1000, lags[-1] * 1000)


def spread(values: Sequence[float]) -> float:
    """The largest relative deviation from the mean (perf_analyzer's stability measure)."""
    mean = statistics.fmean(values)
    return max(abs(v - mean) for v in values) / mean if mean > 0 else 0.0


@dataclass
class Window:
    outcomes: list[Outcome]
    duration: float
    figures: dict[str, Any]
    spec: dict[str, Any] | None
    timed: bool = True  # False: kept for throughput only, its token timing not observed


@dataclass
class Measured:
    """A level's kept windows, what was thrown away and why, and whether the windows agreed."""

    windows: list[Window]
    rejected: list[str]
    stable: bool
    # The engine's counters over the windows measured but not used (thrown away, or before the
    # last agreeing ones): with the kept windows' they add up to the server's own totals.
    unused_spec: list[dict[str, Any]] = field(default_factory=list)
    # Windows kept only for throughput: too few streamed their tokens one by one (see below).
    timing_unobserved: int = 0


class Windows:
    """A level's windows as they are measured: each judged, kept or thrown away (and why),
    until the last `min_windows` agree or `max_windows` were measured."""

    def __init__(
        self, concurrency: int, p: BenchParams, say: Callable[[str], None] | None = None
    ) -> None:
        self.concurrency, self.p = concurrency, p
        self.say = say or (lambda _: None)
        self.kept: list[Window] = []
        self.untimed: list[Window] = []  # clean but for token timing: the fallback in end()
        self.usable: list[Window] = []  # kept and untimed, in the order they were measured
        self.rejected: list[str] = []
        self.unused_spec: list[dict[str, Any]] = []

    def add(
        self,
        number: int,
        outcomes: list[Outcome],
        duration: float,
        spec: dict[str, Any] | None,
        clients: Sequence[ClientLoad] = (),
    ) -> Measured | None:
        """Judge window `number` (`clients`: each client process's load over it): the level
        once its last windows agree, else None; a fault that every window would show fails
        the level (TaskError)."""
        p, label = self.p, f"c={self.concurrency} window {number}"
        figures, problems, fatal = judge_window(self.concurrency, outcomes, duration, clients, p)
        if fatal:
            raise TaskError(f"c={self.concurrency}: {fatal}")
        if problems:
            self.rejected.append(f"window {number}: {'; '.join(problems)}")
            if len(problems) == 1 and UNOBSERVED in problems[0]:
                self.untimed.append(Window(outcomes, duration, figures, spec, timed=False))
                self.usable.append(self.untimed[-1])
            self.unused_spec += [spec] if spec else []
            self.say(f"{label} thrown away: {'; '.join(problems)}")
            return None
        kept = self.kept
        kept.append(Window(outcomes, duration, figures, spec))
        self.usable.append(kept[-1])
        last = [w.figures["output_tok_s"] for w in kept[-p.min_windows :]]
        settled = len(kept) >= p.min_windows and spread(last) <= p.stability
        self.say(
            f"{label}: {figures['output_tok_s']:.1f} tok/s; "
            + (
                f"the last {len(last)} agree within {spread(last):.1%}"
                if settled
                else f"{len(last)} of {p.min_windows} windows, within {spread(last):.1%}"
            )
        )
        if not settled:
            return None
        self.unused_spec += [w.spec for w in kept[: -p.min_windows] if w.spec]
        return Measured(kept[-p.min_windows :], self.rejected, True, self.unused_spec)

    def end(self) -> Measured:
        """The level after `max_windows` windows that never settled: every clean window, marked
        unstable; or, where too few were clean, the fallback below; or a TaskError."""
        p, kept, untimed = self.p, self.kept, self.untimed
        if len(kept) < p.min_windows and len(kept) + len(untimed) >= p.min_windows:
            # Every window was measured and the server burst its answers too often for token
            # timing (a tiny model on a CPU does: its engine outruns its own API process), but
            # nothing else was wrong: throughput and end-to-end latency stand, TTFT and TPOT
            # come from the timed windows among them (none: none), and the level says so.
            # Their agreement is still judged: an erratic level stays `stable: false`.
            windows = self.usable[-p.min_windows :]
            used = [w.spec for w in windows if not w.timed and w.spec]
            unused = [s for s in self.unused_spec if not any(s is u for u in used)]
            unused += [w.spec for w in self.usable[: -p.min_windows] if w.timed and w.spec]
            stable = spread([w.figures["output_tok_s"] for w in windows]) <= p.stability
            untimed_kept = sum(not w.timed for w in windows)
            self.say(
                f"c={self.concurrency}: {UNOBSERVED} in {untimed_kept} of the "
                f"{len(windows)} windows kept"
            )
            return Measured(windows, self.rejected, stable, unused, untimed_kept)
        if len(kept) < p.min_windows:
            raise TaskError(
                f"c={self.concurrency}: only {len(kept)} clean window(s) of {p.max_windows}, "
                f"{p.min_windows} needed: " + "; ".join(self.rejected)
            )
        return Measured(kept, self.rejected, False, self.unused_spec)


Tally = Callable[[int, int], None]  # a window's answers so far: (requests done, output tokens)


async def run_window(
    session: Any,
    target: Target,
    todo: Sequence[Prompt],
    p: BenchParams,
    concurrency: int,
    tally: Tally | None = None,
    every: float = 10.0,
) -> tuple[list[Outcome], float, ClientLoad]:
    """A request per prompt of `todo` with at most `concurrency` in flight; every `every`
    seconds `tally` hears how far it is (a window at concurrency 128 on a big model takes long).
    Also how loaded the client itself was (LoopWatch)."""
    gate = asyncio.Semaphore(concurrency)
    done: list[Outcome] = []

    async def limited(prompt: Prompt) -> Outcome:
        async with gate:
            outcome = await one_request(session, target, prompt, p)
        done.append(outcome)
        return outcome

    async def report() -> None:
        while tally is not None:
            await asyncio.sleep(every)
            tally(len(done), sum(o.output_tokens for o in done))

    started = time.perf_counter()
    loop = LoopWatch()
    reporter, watcher = asyncio.create_task(report()), asyncio.create_task(loop.watch())
    try:
        outcomes = await asyncio.gather(*(limited(prompt) for prompt in todo))
    finally:
        reporter.cancel()
        watcher.cancel()
    return list(outcomes), time.perf_counter() - started, loop.result()


def progress_line(label: str, done: int, total: int, tokens: int, elapsed: float) -> str:
    return f"{label}: {done}/{total} requests done, {tokens / elapsed:.1f} tok/s so far"
