"""One candidate's verdict against the baseline: what was found (wins, losses, inconclusive
levels, capacity, the server's cap, the break-even acceptance) and what makes it unreadable."""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.analysis.matching import (
    Acceptance,
    BreakEven,
    Match,
    Outcome,
    Point,
    _figure,
)
from tasks.analysis.models import Level, Result
from tasks.analysis.numbers import fc, ft


@dataclass
class Verdict:
    """One candidate against the baseline."""

    name: str
    result: Result
    points: list[Point]
    matches: list[Match]  # [] when not comparable
    base_points: list[Point]
    cap_note: str | None
    acceptance: Acceptance | None
    differ: list[str]  # workload settings that differ: 'output_tokens 48 vs 128'
    noise: float
    tolerance: float
    max_draft_cost: float = 0.0  # the draft/target cost ratio the step-cost check allows
    draft_cost: float = 0.0  # the draft/target cost ratio the draft's size gives: the ceiling's
    break_even: BreakEven | None = None
    problems: list[str] = field(default_factory=list)  # MEASUREMENT PROBLEM: ...
    notes: list[str] = field(default_factory=list)
    verdict: str = ""
    pays: bool = False
    base_cap: int | None = None  # the baseline server's max_running_requests
    # Another engine, no speculation: the comparison is of engines (a win is "faster").
    engine_change: bool = False

    @property
    def capped(self) -> bool:
        return self.cap_note is not None

    @property
    def base_peak(self) -> Point | None:
        """The baseline's level of highest throughput."""
        return max(self.base_points, key=lambda p: p.tok_s, default=None)

    def outcome(self, m: Match) -> Outcome:
        """Inconclusive where either side never settled or the baseline moved between its
        launches; else a win only when the interval's low end is above 1 + noise, a loss only
        when its high end is below 1 - noise: a speed-up the spread can explain is even."""
        if self.inconclusive(m):
            return "inconclusive"
        lo, hi = m.bounds
        return "win" if lo > 1 + self.noise else "loss" if hi < 1 - self.noise else "even"

    def inconclusive(self, m: Match) -> list[str]:
        """Why no win or loss can be read from this level: 'baseline unstable (spread 23%)'."""
        why = [
            f"{who} unstable" + (f", spread {lv.spread:.0%}" if lv.spread is not None else "")
            for who, p in (("candidate", m.cand), ("baseline", m.base))
            for lv in p.unstable
        ]
        if m.base.moved and m.base.again is not None:
            why.append(
                f"baseline moved between its launches, {ft(m.base.level.output_tok_s)} then "
                f"{ft(m.base.again.output_tok_s)} tok/s"
            )
        return why

    def at(self, outcome: Outcome) -> list[Match]:
        return [m for m in self.matches if self.outcome(m) == outcome]

    @property
    def capacity(self) -> Match | None:
        """The candidate's peak against the baseline's: the most each configuration served over
        every level it ran, compared or not, capped or not, at whatever concurrency each reached
        it. A capacity, not a speed-up: the two peaks may lie at different concurrencies, and a
        level held by the server's cap is the peak an operator gets. None only where there is
        no such pair (`no_capacity` says why)."""
        if self.no_capacity is not None or (base := self.base_peak) is None:
            return None
        return Match(max(self.points, key=lambda p: p.tok_s), base)

    @property
    def no_capacity(self) -> str | None:
        """Why there is no capacity: 'the candidate ran no level'; None where there is one."""
        if self.differ:  # tok/s of different work are not one quantity
            return "the two measured different work (" + ", ".join(self.differ) + ")"
        if not self.points:
            return "the candidate ran no level"
        if not self.base_points:
            return "the baseline ran no level"
        return None

    @property
    def capacity_floor(self) -> bool:
        """The capacity is only a lower bound: the candidate peaked at its highest level, which
        asked for fewer requests than the baseline's peak and than its server admits, so more
        load may have served more. A level its cap held is a known peak, however few ran."""
        m = self.capacity
        return (
            m is not None
            and may_rise(m.cand, self.points, self.result.server.max_running_requests)
            and m.cand.level.concurrency < m.base.level.concurrency
        )

    @property
    def capacity_lower(self) -> bool:
        """The candidate's known peak below the baseline's beyond the windows and the noise
        margin: what an operator deciding the migration needs first (the verdict opens with
        it)."""
        m = self.capacity
        return m is not None and not self.capacity_floor and self.outcome(m) == "loss"

    def capacity_figure(self) -> str:
        """'0.36x', '1.11x (1.08-1.13)', 'at least 0.04x'; '' where there is no capacity."""
        if (m := self.capacity) is None:
            return ""
        return ("at least " if self.capacity_floor else "") + _figure(m, " (", ")")

    def capacity_text(self) -> str | None:
        """'capacity 0.52x (0.47-0.58): peak 2279 tok/s at concurrency 8 (cap 8) against the
        baseline's 4432 tok/s at concurrency 8 (cap 8)', and what limits the comparison."""
        if (m := self.capacity) is None:
            return None
        cand_cap = self.result.server.max_running_requests

        def where(p: Point, cap: int | None) -> str:
            return f"at concurrency {self.name_of(p)}" + (f" (cap {cap})" if cap else "")

        text = (
            f"capacity {self.capacity_figure()}: peak {ft(m.cand.tok_s)} tok/s "
            f"{where(m.cand, cand_cap)} against the baseline's {ft(m.base.tok_s)} tok/s "
            f"{where(m.base, self.base_cap)}"
        )
        if cand_cap is not None and cand_cap < m.base.concurrency * (1 - self.tolerance):
            text += (
                f"; capped at {cand_cap} running requests, fewer than the "
                f"{fc(m.base.concurrency)} in flight at the baseline's peak"
            )
        tops = [
            who
            for who, p, pts, mrr in (
                ("candidate", m.cand, self.points, cand_cap),
                ("baseline", m.base, self.base_points, self.base_cap),
            )
            if may_rise(p, pts, mrr)
        ]
        if tops:
            text += (
                f"; the {' and the '.join(tops)} peaked at the highest concurrency measured: "
                "more load may serve more"
            )
        return text

    @property
    def c1(self) -> Match | None:
        return next((m for m in self.matches if m.cand.level.concurrency == 1), None)

    @property
    def peak(self) -> Match | None:
        """The candidate's level with as many in flight as the baseline's peak, if it ran one."""
        at_peak = [m for m in self.matches if m.base is self.base_peak]
        return min(
            at_peak, key=lambda m: abs(m.cand.concurrency - m.base.concurrency), default=None
        )

    def step_limit(self, acc: Acceptance) -> float:
        """The most decode steps a speculative step can cost: a compute-bound verify of k+1
        tokens, plus k drafts at max_draft_cost each."""
        return acc.k + 1 + acc.k * self.max_draft_cost

    def step_limit_text(self, acc: Acceptance) -> str:
        if not self.max_draft_cost:
            return f"k+1 = {acc.k + 1}"
        return (
            f"k+1 + k * max_draft_cost = {self.step_limit(acc):.3g} (drafts at "
            f"{self.max_draft_cost:g} target steps each)"
        )

    def name_of(self, p: Point) -> str:
        """'8', or '64 with 33 in flight' where the server ran another number than asked."""
        n = p.level.concurrency
        if abs(p.concurrency - n) > self.tolerance * n:
            return f"{n} with {fc(p.concurrency)} in flight"
        return str(n)

    def step_cost(self, m: Match) -> float | None:
        """Spec step / decode step = tau / speed-up, tau of that level if known."""
        acc = self.acceptance
        if acc is None or acc.problems:
            return None
        return level_tau(m.cand.level, acc) / m.speedup


def may_rise(peak: Point, pts: list[Point], mrr: int | None) -> bool:
    """More load may serve more than a side's peak: it is that side's highest level, and it
    asked for fewer requests than the server admits (at its cap, more offered load would not
    have put more in flight)."""
    top = max(pts, key=lambda p: p.level.concurrency)
    return peak is top and (mrr is None or top.level.concurrency < mrr)


def level_tau(level: Level, acc: Acceptance) -> float:
    """The level's own tau (bench.serve measures it per level), else the sweep's."""
    raw = (level.spec or {}).get("accept_length")
    if isinstance(raw, int | float) and not isinstance(raw, bool) and acc.in_range(raw):
        return float(raw)
    return acc.tau
