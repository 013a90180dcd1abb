"""Levels matched across results: each level's throughput interval (Point), the candidate's
levels against the baseline's (Match), and acceptance read from a result's spec, on one
definition, with the engine's own figure beside it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from tasks.analysis.models import Level, Result, Spec, _acceptance_problems
from tasks.analysis.numbers import fr, ft, fx
from tasks.analysis.speculation import (
    DEFINITIONS,
    Definition,
    _tau_of_rate,
    alpha_from_tau,
    strict_rate,
)
from tasks.serving.engines import engine as adapter

Outcome = Literal["win", "even", "loss", "inconclusive"]


def level_bounds(level: Level) -> tuple[float, float]:
    """[min, max] of a level's windows' tok/s; [v, v] for a level measured once. Widened to take
    in the median, should it lie outside (flagged), so the ratio bounds stay bounds."""
    iv, tok_s = level.interval, level.output_tok_s
    if iv is None or iv.output_tok_s is None:
        return tok_s, tok_s
    return min(iv.output_tok_s[0], tok_s), max(iv.output_tok_s[1], tok_s)


@dataclass(frozen=True)
class Point:
    """A level at the concurrency it really ran at; for a baseline measured again after the
    candidates (a second server launch), both launches' measurements of that level."""

    level: Level
    concurrency: float  # in flight: achieved (the windows' median); else min(requested, cap)
    inferred: bool  # in flight not measured but taken from the server's cap
    again: Level | None = None  # the same level on the second launch
    moved: bool = False  # the launches disagree beyond their windows and the noise margin
    # The server's max_running_requests where it is below the requested concurrency: the level
    # ran held by it, so more offered load would not have put more requests in flight.
    cap: int | None = None

    @property
    def tok_s(self) -> float:
        """The median; over two launches, the mean of their medians."""
        if self.again is None:
            return self.level.output_tok_s
        return (self.level.output_tok_s + self.again.output_tok_s) / 2

    @property
    def bounds(self) -> tuple[float, float]:
        """[min, max] over the windows of every launch measured."""
        if self.again is None:
            return level_bounds(self.level)
        (lo, hi), (lo2, hi2) = level_bounds(self.level), level_bounds(self.again)
        return min(lo, lo2), max(hi, hi2)

    @property
    def launch_spread(self) -> float:
        """How far the launches' medians lie apart, relative to their mean: what changes from
        one launch to the next, which one launch's windows cannot show. 0 for one launch."""
        if self.again is None:
            return 0.0
        a, b = self.level.output_tok_s, self.again.output_tok_s
        return abs(a - b) / ((a + b) / 2)

    @property
    def unstable(self) -> list[Level]:
        """The launches' levels whose windows never agreed."""
        return [lv for lv in (self.level, self.again) if lv is not None and lv.stable is False]

    @property
    def windows(self) -> int | None:
        lv = self.level
        if lv.windows is not None:
            return lv.windows
        if lv.per_window:
            return len(lv.per_window)
        return 1 if self.level.interval is None else None

    @property
    def once(self) -> bool:
        """Measured once, no spread known: a v1 level, or a single window (of one launch)."""
        iv = self.level.interval
        return self.again is None and (iv is None or iv.output_tok_s is None or self.windows == 1)

    @property
    def per_request(self) -> float:
        return self.tok_s / self.concurrency


def points(result: Result) -> list[Point]:
    mrr = result.server.max_running_requests
    out = []
    for lv in sorted(result.levels, key=lambda lv: lv.concurrency):
        cap = mrr if mrr is not None and mrr < lv.concurrency else None
        if lv.achieved_concurrency is not None:
            out.append(Point(lv, lv.achieved_concurrency, False, cap=cap))
        else:
            out.append(Point(lv, float(cap or lv.concurrency), cap is not None, cap=cap))
    return out


def baseline_points(base: Result, again: Result | None, noise: float) -> list[Point]:
    """The baseline's levels, each with its second launch's measurement where one was made at
    the same requested concurrency. Two launches moved apart when their windows' intervals,
    each widened by the noise margin, do not overlap: the host drifted between them, and no
    candidate measured in between can be told from the drift."""
    first = points(base)
    if again is None:
        return first
    second = {p.level.concurrency: p for p in points(again)}
    out = []
    for p in first:
        if (q := second.get(p.level.concurrency)) is None:
            out.append(p)
            continue
        (lo, hi), (lo2, hi2) = level_bounds(p.level), level_bounds(q.level)
        moved = lo * (1 - noise) > hi2 * (1 + noise) or lo2 * (1 - noise) > hi * (1 + noise)
        out.append(
            Point(p.level, (p.concurrency + q.concurrency) / 2, p.inferred, q.level, moved, p.cap)
        )
    return out


@dataclass(frozen=True)
class Match:
    """A candidate level and the baseline level at (about) the same achieved concurrency."""

    cand: Point
    base: Point

    @property
    def speedup(self) -> float:
        """The medians' ratio."""
        return self.cand.tok_s / self.base.tok_s

    @property
    def bounds(self) -> tuple[float, float]:
        """[candidate min / baseline max, candidate max / baseline min] over the windows. Where
        the baseline ran on two launches, the candidate's single launch is widened by the
        baseline's launch spread at that level: between launches it varies as much."""
        (c_lo, c_hi), (b_lo, b_hi) = self.cand.bounds, self.base.bounds
        d = self.base.launch_spread
        c_lo, c_hi = c_lo * (1 - d), c_hi * (1 + d)
        return c_lo / b_hi, (c_hi / b_lo if b_lo > 0 else math.inf)

    @property
    def spread_text(self) -> str | None:
        """'1.21-1.62', or None when both sides were measured once (no spread known)."""
        if self.cand.once and self.base.once:
            return None
        lo, hi = self.bounds
        return f"{fr(lo)}-{fr(hi)}"


def _match(cand: list[Point], base: list[Point], tolerance: float) -> list[Match]:
    out = []
    for c in cand:
        near = [
            b
            for b in base
            if abs(b.concurrency - c.concurrency) <= tolerance * max(b.concurrency, c.concurrency)
        ]
        if near:
            out.append(Match(c, min(near, key=lambda b: abs(b.concurrency - c.concurrency))))
    return out


@dataclass
class Acceptance:
    tau: float
    k: int
    strict: float
    alpha: float | None  # None where tau is outside [1, k+1]: no alpha gives it
    source: str  # where tau came from
    reported: float | None = None
    definition: Definition | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # figures their definition forbids

    def in_range(self, tau: float) -> bool:
        return 1.0 - 1e-9 <= tau <= self.k + 1.0 + 1e-9


def acceptance(spec: Spec | None, engine: str | None) -> Acceptance | None:
    """tau and k, and from them the strict rate and alpha; the engine's figure on that scale.
    Figures out of their range are kept and listed in `problems` (they are measurements)."""
    if spec is None or spec.k is None or (spec.accept_length is None and spec.acceptance is None):
        return None
    k, rate, definition = spec.k, spec.acceptance, spec.acceptance_definition
    reported_tau = None
    if rate is not None and definition is not None:
        reported_tau = _tau_of_rate(rate, k, definition)
    tau = spec.accept_length if spec.accept_length is not None else reported_tau
    assert tau is not None  # Result._check gave every rate a definition
    source = "accept length" if spec.accept_length is not None else "the reported acceptance"
    acc = Acceptance(tau, k, strict_rate(tau, k), None, source, rate, definition)
    if acc.in_range(tau):
        acc.alpha = alpha_from_tau(min(max(tau, 1.0), k + 1.0), k)
    acc.problems = _acceptance_problems(spec, k)
    if rate is not None and definition is not None and reported_tau is not None:
        acc.notes = _reported_notes(
            rate, definition, reported_tau, acc, engine, spec.accept_length is not None
        )
    return acc


def _reported_notes(
    rate: float,
    definition: Definition,
    reported_tau: float,
    acc: Acceptance,
    engine: str | None,
    has_tau: bool,
) -> list[str]:
    who = adapter(engine).title
    notes = [
        f"{who} reported {rate:.0%} on the {definition} definition "
        f"({DEFINITIONS[definition]}), i.e. tau = {reported_tau:.2f} and "
        f"{strict_rate(reported_tau, acc.k):.1%} accepted/proposed"
    ]
    if acc.in_range(reported_tau) and reported_tau <= 1.05:  # legacy at 1/(k+1) is tau = 1
        notes.append("at or near that definition's floor: (almost) no draft accepted")
    if has_tau and abs(reported_tau - acc.tau) > max(0.1, 0.05 * acc.tau):
        notes.append(
            f"INCONSISTENT with accept length {acc.tau:.2f}: check k "
            "(drafts per step, not num_draft_tokens) and the definition"
        )
    return notes


@dataclass
class BreakEven:
    """The single-stream break-even for tau and k against the baseline's decode step."""

    base_tok_s: float  # the baseline's single-stream output
    t_dec_ms: float
    step_budget_ms: float  # a speculative step (k drafts + verify + overhead) must be faster
    max_draft_cost: float  # the draft/target cost ratio at break-even with v = 1
    ceiling: float  # S with free drafts and verify = one decode step: tau
    modelled: dict[float, float]  # draft/target cost ratio -> S
    measured: float | None  # speed-up measured at concurrency 1

    def text(self, acc: Acceptance) -> str:
        lines = [
            f"baseline decode step T_dec = 1000 / {ft(self.base_tok_s)} tok/s = "
            f"{self.t_dec_ms:.1f} ms at concurrency 1; a speculative step emits tau = "
            f"{acc.tau:.2f} tokens, so it must take < tau * T_dec = {self.step_budget_ms:.1f} ms "
            f"(k={acc.k} drafts + verify + overhead) to win at concurrency 1",
            f"with verify = one decode step (v=1) the draft/target cost ratio must stay below "
            f"(tau-1)/k = {self.max_draft_cost:.2f}; ceiling with free drafts: {fx(self.ceiling)}",
            "modelled speed-up tau/(k * ratio + 1): "
            + ", ".join(
                f"{fx(s)} at {'a draft/target cost ratio of ' if i == 0 else ''}{r:g}"
                for i, (r, s) in enumerate(self.modelled.items())
            ),
        ]
        if self.measured is not None:
            cost = acc.tau / self.measured
            lines.append(
                f"measured {fx(self.measured)} at concurrency 1: a speculative step "
                f"costs tau/S = {cost:.2f} decode steps, i.e. a draft/target cost ratio "
                f"of ~{(cost - 1) / acc.k:.2f} (v=1)"
            )
        lines.append(
            f"at higher load verifying B*(k+1) tokens turns compute-bound, "
            f"v_B -> k+1 = {acc.k + 1}, so the break-even tau rises with batch size "
            "and speculation loses where it exceeds the measured tau"
        )
        return "; ".join(lines)


def _figure(m: Match, before: str = ", ", after: str = "") -> str:
    """'0.71x, 0.66-0.77'; '0.71x (0.66-0.77)' with before ' (' and after ')'."""
    return fx(m.speedup) + (f"{before}{m.spread_text}{after}" if m.spread_text else "")
