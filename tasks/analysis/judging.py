"""Judging a candidate against the baseline: the levels matched, the cap or shortfall, the
workloads compared, the measurement problems, into a Verdict."""

from __future__ import annotations

from tasks.analysis.matching import (
    Acceptance,
    BreakEven,
    Match,
    Outcome,
    Point,
    _match,
    acceptance,
    baseline_points,
    points,
)
from tasks.analysis.models import Result, _interval_problems, _level_tau_problems
from tasks.analysis.numbers import _and, _span, _value, fc
from tasks.analysis.speculation import DRAFT_COSTS, modelled_speedup
from tasks.analysis.verdict import Verdict, level_tau
from tasks.analysis.wording import _verdict_text
from tasks.serving.engines import engine

# Benchmark keys that name things rather than set the workload, and keys that set how long or
# how often it is measured but not what is measured. Any other key (dataset, output_tokens,
# input_*, temperature, ignore_eos, api, seed, ...) shapes the workload: if it differs, the
# two results measure different work and no speed-up is computed.
NAMING_KEYS = frozenset({"tool", "label"})


MEASURING_KEYS = frozenset(
    {"requests", "warmup", "stability", "min_windows", "max_windows", "client_cpus"}
)


def _cap(
    result: Result, pts: list[Point], base: Result, tolerance: float, base_pts: list[Point]
) -> str | None:
    """Why the candidate's achieved concurrency fell short of the requested (the 48 case): the
    server's cap, or a shortfall of unknown cause (no cap recorded). Below a recorded cap it is
    not the cap (see _shortfall)."""
    mrr = result.server.max_running_requests
    over = [p for p in pts if p.cap is not None]
    short = [] if mrr is not None else _short(pts, tolerance)
    if not over and not short:
        return None
    p = max(over or short, key=lambda p: p.level.concurrency)
    ran = f"{fc(p.concurrency)} in flight{' (inferred)' if p.inferred else ''}"
    if over:
        base_mrr = base.server.max_running_requests
        text = (
            f"capped by the server: max_running_requests={mrr}"
            + (f" (baseline: {base_mrr})" if base_mrr is not None else "")
            + f"; concurrency {p.level.concurrency} requested, {ran}"
        )
        advice = engine(result.server.engine).cap_advice(p.level.concurrency)
        if advice and result.spec is not None:
            text += f"; {advice}"
    else:
        text = (
            f"admission fell short: concurrency {p.level.concurrency} requested, {ran}; the "
            "server's max_running_requests was not recorded, so the cause is unknown"
        )
    return text + _per_request_bound(p, base_pts, tolerance)


def _short(pts: list[Point], tolerance: float) -> list[Point]:
    return [p for p in pts if p.concurrency < (1 - tolerance) * p.level.concurrency]


def _shortfall(result: Result, pts: list[Point], tolerance: float) -> list[str]:
    """Fewer in flight than requested although the server's cap allowed more."""
    mrr = result.server.max_running_requests
    if mrr is None or not (
        short := [p for p in _short(pts, tolerance) if p.level.concurrency <= mrr]
    ):
        return []
    return [
        "fewer in flight than requested at concurrency "
        + ", ".join(f"{p.level.concurrency} ({fc(p.concurrency)})" for p in short)
        + f", under max_running_requests={mrr}: not the server's cap (a short level's "
        "ramp-down, or the server's scheduling); levels are compared by what ran"
    ]


def _per_request_bound(p: Point, base_pts: list[Point], tolerance: float) -> str:
    """Per request: a capped level measures the cap, not speculation. The
    baseline's per-request speed falls with load, so its nearest level at or above the
    candidate's in-flight count bounds it from below there. A bound, so no ratio is given."""
    above = [b for b in base_pts if b.concurrency >= p.concurrency * (1 - tolerance)]
    if not above:
        return ""
    b = min(above, key=lambda b: b.concurrency)
    text = (
        f"; per request {p.per_request:.1f} tok/s with {fc(p.concurrency)} in flight vs "
        f"{b.per_request:.1f} for the baseline with {fc(b.concurrency)} in flight"
    )
    if b.concurrency <= p.concurrency * (1 + tolerance):
        return text
    if p.per_request < b.per_request:
        return text + (
            f": with {fc(p.concurrency)} in flight the baseline would be at least "
            "that fast, so no sign of a speed-up at equal concurrency either"
        )
    return text + (
        f": measure the baseline with {fc(p.concurrency)} in flight or lift the cap to decide"
    )


def workload_differences(base: Result, cand: Result) -> list[str]:
    """Settings of the workload itself that differ: then the two measure different work."""
    b, c = base.benchmark, cand.benchmark
    keys = sorted((b.keys() & c.keys()) - NAMING_KEYS - MEASURING_KEYS)
    return [f"{k} {_value(b[k])} vs {_value(c[k])}" for k in keys if b[k] != c[k]]


def compare(
    name: str,
    cand: Result,
    base: Result,
    noise: float = 0.03,
    tolerance: float = 0.1,
    max_draft_cost: float = 0.0,
    again: Result | None = None,
    draft_cost: float = 0.0,
) -> Verdict:
    """Speed-ups level by level at equal achieved concurrency, with intervals; the cap;
    acceptance; physics checks; the verdict. `again`: the baseline measured again after the
    candidates, on a fresh launch (see baseline_points)."""
    cpts, bpts = points(cand), baseline_points(base, again, noise)
    differ = workload_differences(base, cand)
    v = Verdict(
        name,
        cand,
        cpts,
        [] if differ else _match(cpts, bpts, tolerance),
        bpts,
        _cap(cand, cpts, base, tolerance, bpts),
        acceptance(cand.spec, cand.server.engine),
        differ,
        noise,
        tolerance,
        max(max_draft_cost, draft_cost),
        draft_cost,
    )
    v.base_cap = base.server.max_running_requests
    engines = (base.server.engine, cand.server.engine)
    v.engine_change = cand.spec is None and None not in engines and engines[0] != engines[1]
    v.break_even = _break_even(v, bpts)
    v.problems = measurement_problems(v, base)
    v.notes = _notes(v, base)
    # Mixed results do not pay: a loss somewhere means it cannot simply be switched on; where
    # it wins is in NAME.wins_at. Impossible figures do not pay either: they are not evidence;
    # nor does a sweep with an inconclusive level, which may hide the loss; nor a known lower
    # capacity: switched on, the host serves less at its peak, whatever it wins at low load.
    v.pays = (
        bool(v.at("win"))
        and not v.at("loss")
        and not v.at("inconclusive")
        and not v.problems
        and not v.capacity_lower
    )
    v.verdict = _verdict_text(v, base)
    return v


def _why_pays(v: Verdict) -> str:
    """The reason for NAME.pays, not its definition: 'loses at 4, 8' or 'wins at 1, 2, and
    loses at none'."""

    def at(outcome: Outcome) -> str:
        return ", ".join(v.name_of(m.cand) for m in v.at(outcome))

    if v.problems:
        return f"no: {len(v.problems)} measurement problem(s), so the figures are not evidence"
    if not v.matches:
        return "no: nothing comparable with the baseline"
    if losses := at("loss"):
        return f"no: loses at concurrency {losses}" + (f", wins at {w}" if (w := at("win")) else "")
    if v.capacity_lower:
        return f"no: capacity {v.capacity_figure()} of the baseline's" + (
            f", though it wins at concurrency {w}" if (w := at("win")) else ""
        )
    if unsure := at("inconclusive"):
        return f"no: inconclusive at concurrency {unsure}, which may hide a loss"
    if not (wins := at("win")):
        return "no: even at every concurrency measured, within the noise"
    return f"yes: wins at concurrency {wins}, loses at none, no measurement problem"


def _break_even(v: Verdict, bpts: list[Point]) -> BreakEven | None:
    acc = v.acceptance
    base_c1 = next((b for b in bpts if b.level.concurrency == 1), None)
    if acc is None or acc.problems or base_c1 is None or acc.tau <= 1 + v.noise or v.differ:
        return None
    t_dec = 1000.0 / base_c1.tok_s  # a decode step: 63.6 tok/s -> 15.7 ms
    return BreakEven(
        base_c1.tok_s,
        t_dec,
        acc.tau * t_dec,
        acc.strict,
        acc.tau,
        {r: modelled_speedup(acc.tau, acc.k, r) for r in DRAFT_COSTS},
        None if v.c1 is None else v.c1.speedup,
    )


def measurement_problems(v: Verdict, base: Result) -> list[str]:
    """Figures physics or their definition forbids: flagged, never refused (they are what the
    instruments said, and the verdict must say the instruments are wrong)."""
    out = list(v.acceptance.problems) if v.acceptance else []
    out += _interval_problems("baseline", base) + _interval_problems("candidate", v.result)
    if (acc := v.acceptance) is not None:
        out += _level_tau_problems(v.result.levels, acc.k)
        if not acc.problems:
            out += _step_problems(v, acc)
    return out


def _step_problems(v: Verdict, acc: Acceptance) -> list[str]:
    """S = tau / (spec step / decode step). A step costs at least its verify pass
    (one decode step) and k drafts at draft_cost each, so S <= tau / (k * draft_cost + 1), tau
    with free drafts; verifying k+1 tokens costs at most k+1 decode steps even compute-bound,
    and k drafts k * max_draft_cost more. Both checked beyond the interval and the noise
    margin, so only what the spread cannot explain is flagged."""
    ms = sorted(v.matches, key=lambda m: m.cand.concurrency)
    taus = {id(m): level_tau(m.cand.level, acc) for m in ms}
    floor = acc.k * v.draft_cost + 1  # the cheapest a speculative step can be, in decode steps
    fast = [m for m in ms if m.bounds[0] > taus[id(m)] / floor * (1 + v.noise)]
    slow = [m for m in ms if taus[id(m)] / m.bounds[1] > v.step_limit(acc) * (1 + v.noise)]
    out = []
    if fast:
        tau_text = _nums([taus[id(m)] for m in fast], ".2f")
        ceiling = (
            f"tau = {tau_text}, the ceiling even with free drafts"
            if not v.draft_cost
            else f"its ceiling tau / (k * draft_cost + 1) = "
            f"{_nums([taus[id(m)] / floor for m in fast], '.2f')} (tau = {tau_text}, k = "
            f"{acc.k}, each draft {v.draft_cost:g} target steps)"
        )
        out.append(
            f"speed-up {_span([m.speedup for m in fast])} at concurrency {_names(v, fast)}"
            f" exceeds {ceiling}"
        )
    if slow:
        costs = [taus[id(m)] / m.speedup for m in slow]
        out.append(
            f"a speculative step at concurrency {_names(v, slow)} costs "
            f"{_nums(costs, '.1f')} decode steps (tau / speed-up), more than "
            f"{v.step_limit_text(acc)}"
        )
    return out


def _names(v: Verdict, ms: list[Match]) -> str:
    return ", ".join(v.name_of(m.cand) for m in ms)


def _nums(values: list[float], fmt: str) -> str:
    """'4.7', or '4.7-4.9' for several."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _notes(v: Verdict, base: Result) -> list[str]:
    notes = [n for n in v.acceptance.notes if n.startswith("INCONSISTENT")] if v.acceptance else []
    if v.acceptance is not None and any(v.step_limit_text(v.acceptance) in p for p in v.problems):
        notes.append(
            "a speculative step costing more than a compute-bound verify pass (k+1 "
            "decode steps) plus k drafts at max_draft_cost each means a draft step "
            "costs more than assumed, or a large per-step overhead, or runs that did "
            "not run the same load; a draft model about as large as the target costs "
            "~1 target step per draft: then set max_draft_cost: 1"
        )
    if eager := [lv for lv in v.result.levels if lv.above_cuda_graph_max_bs]:
        at = _and([fc(lv.concurrency) for lv in eager])
        notes.append(
            f"decoded without CUDA graphs at concurrency {at} (above the server's "
            f"CUDA-graph max batch, {eager[0].above_cuda_graph_max_bs}): a "
            "known cause of speculative slow-downs at high concurrency; raise "
            "--cuda-graph-max-bs to measure those levels with graphs"
        )
    return notes + _shortfall(v.result, v.points, v.tolerance) + _comparability(v.result, base)


def _comparability(cand: Result, base: Result) -> list[str]:
    """What differs besides the workload, the benchmark clients' defaults included."""
    b, c = base.benchmark, cand.benchmark
    notes = []
    measuring = [
        f"{k} {_value(b[k])} vs {_value(c[k])}"
        for k in sorted(b.keys() & c.keys() & MEASURING_KEYS)
        if b[k] != c[k]
    ]
    if measuring:
        notes.append(
            "measured differently (baseline vs candidate: "
            + "; ".join(measuring)
            + "): same workload, other measurement lengths or stopping rules"
        )
    if "tool" in b and "tool" in c and b["tool"] != c["tool"]:
        notes.append(
            f"different benchmark tools ({b['tool']} vs {c['tool']}): their defaults "
            "differ (temperature, max tokens, prompts), only the settings both recorded agree"
        )
    if one_sided := sorted((b.keys() ^ c.keys()) - NAMING_KEYS - MEASURING_KEYS):
        notes.append("recorded for one result only, so not checked: " + ", ".join(one_sided))
    if differs := [
        f"{key} {base.host[key]!r} vs {cand.host[key]!r}"
        for key in ("gpus", "driver", "cpu")
        if key in base.host and key in cand.host and base.host[key] != cand.host[key]
    ]:
        notes.append("measured on different hosts (" + "; ".join(differs) + ")")
    if base.server.engine and cand.server.engine and base.server.engine != cand.server.engine:
        notes.append(
            f"engines differ ({base.server.engine} vs {cand.server.engine}): compare "
            "only with identical prompts, temperature and max tokens (bench_serving "
            "sends temperature 0, vllm bench serve the model's default)"
        )
    return notes
