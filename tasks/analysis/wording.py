"""The verdict in words: its one line (capacity first where both sides have a peak, then the
levels) and the details under it."""

from __future__ import annotations

from tasks.analysis.matching import Match, Outcome, _figure
from tasks.analysis.models import Result
from tasks.analysis.numbers import _and, _span, ft, fx
from tasks.analysis.verdict import Verdict

PROBLEM = "MEASUREMENT PROBLEM"


def _verdict_text(v: Verdict, base: Result) -> str:
    """What is there, level by level; problems first, then a capacity below the baseline's
    (what decides a migration first), then what qualifies it. A capacity above the baseline's
    is one of the qualifiers: a peak at another load is no evidence that speculation pays."""
    m, capacity = v.capacity, _capacity_clause(v)
    lead = capacity if v.capacity_lower else None
    cap_said = capacity is not None and m is not None and m.cand.cap is not None
    text = "; ".join([_head(v), *_details(v, base, None if lead else capacity, cap_said)])
    if lead:
        text = f"{lead} — {text}"
    if v.problems:
        text = f"{PROBLEM}: " + "; ".join(v.problems) + " — " + text
    return text


def _capacity_clause(v: Verdict) -> str | None:
    """'capacity 0.36x: 849 against 2370 tok/s; capped at 48 running requests; the baseline's
    peak at concurrency 128'. None where there is no capacity, where it is a lower bound
    below 1, or where it is not lower and a compared level already pairs the two peaks (that
    level's speed-up says it)."""
    if (m := v.capacity) is None:
        return None
    if v.capacity_floor and v.outcome(m) != "win":  # a lower bound below 1 tells nothing
        return None
    if not v.capacity_lower and any(x.cand is m.cand and x.base is m.base for x in v.matches):
        return None
    parts = [f"capacity {v.capacity_figure()}: {ft(m.cand.tok_s)} against {ft(m.base.tok_s)} tok/s"]
    if m.cand.cap is not None:
        parts.append(f"capped at {m.cand.cap} running requests")
    if m.cand.level.concurrency == m.base.level.concurrency:
        parts.append(f"the baseline's peak at concurrency {v.name_of(m.base)}")
    else:
        parts.append(
            f"the candidate's peak at concurrency {v.name_of(m.cand)}, the baseline's at "
            f"{v.name_of(m.base)}"
        )
    return "; ".join(parts)


def _head(v: Verdict) -> str:
    acc = v.acceptance
    if v.differ:
        return "not comparable: " + ", ".join(v.differ)
    if v.matches:
        return _levels_text(v)
    if v.points:
        return (
            "not compared: no baseline level at equal concurrency (candidate: "
            + ", ".join(f"concurrency {v.name_of(p)}" for p in v.points)
            + ")"
        )
    if acc is not None and acc.tau <= 1 + v.noise:
        return f"no speed-up: tau={acc.tau:.2f}, no draft accepted"
    if acc is not None:  # tau bounds any speed-up: free drafts, v = 1
        return f"not measured: at most {fx(acc.tau)} at concurrency 1 (tau)"
    return "no measurement"


def _levels_text(v: Verdict) -> str:
    ms = sorted(v.matches, key=lambda m: m.cand.concurrency)
    outcomes = {v.outcome(m) for m in ms}
    if len(outcomes) > 1:
        return _mixed(v, ms)
    outcome = outcomes.pop()
    names = [v.name_of(m.cand) for m in ms]
    if len(ms) == 1:
        where = f"at concurrency {names[0]}"
        spread = ms[0].spread_text
        figure = fx(ms[0].speedup) + (f" ({spread})" if spread else "")
    else:
        where = f"at every concurrency measured ({', '.join(names)})"
        figure = _span([m.speedup for m in ms])
    if outcome == "inconclusive":
        why = "; ".join(
            ("" if len(ms) == 1 else f"at {v.name_of(m.cand)} ") + ", ".join(v.inconclusive(m))
            for m in ms
        )
        return f"inconclusive {where}: {why}"
    wins = "faster" if v.engine_change else "speculation pays"
    return {
        "win": f"{wins} {where}: {figure}",
        "even": f"no speed-up: even {where}: {figure}",
        "loss": f"loses {where}: {figure}",
    }[outcome]


def _mixed(v: Verdict, ms: list[Match]) -> str:
    """'wins at concurrency 1 (1.43x, 1.21-1.62), even at 4, loses at 8 (0.71x, 0.66-0.77)'."""
    groups: list[tuple[Outcome, list[Match]]] = []
    for m in ms:
        if groups and groups[-1][0] == v.outcome(m):
            groups[-1][1].append(m)
        else:
            groups.append((v.outcome(m), [m]))
    parts = []
    for i, (outcome, group) in enumerate(groups):
        verb = {"win": "wins", "even": "even", "loss": "loses", "inconclusive": "inconclusive"}[
            outcome
        ]
        items = [
            v.name_of(m.cand)
            + (
                ""
                if outcome == "even"
                else f" ({', '.join(v.inconclusive(m))})"
                if outcome == "inconclusive"
                else f" ({_figure(m)})"
            )
            for m in group
        ]
        parts.append(f"{verb} at {'concurrency ' if i == 0 else ''}{_and(items)}")
    return ", ".join(parts)


def _details(v: Verdict, base: Result, capacity: str | None, cap_said: bool) -> list[str]:
    """What qualifies the head; `capacity`: the capacity clause, where it goes among them;
    `cap_said`: the capacity clause names the cap, so it is not said twice."""
    out = []
    if v.matches:
        matched = {id(m.cand) for m in v.matches}
        if lone := [v.name_of(p) for p in v.points if id(p) not in matched]:
            out.append(
                f"not compared at concurrency {', '.join(lone)}: no baseline level with "
                "that many in flight"
            )
        out += _once(v)
    acc = v.acceptance
    if acc is not None and acc.tau <= 1 + v.noise and v.points and not v.differ:
        out.append(f"tau={acc.tau:.2f}, no draft accepted")
    if capacity is not None:
        out.append(capacity)
    if v.capped and not cap_said:
        mrr = v.result.server.max_running_requests
        out.append(
            f"capped at {mrr} running requests"
            if mrr
            else "fewer in flight than requested, cause unknown"
        )
    if (runs := _runs(base, v.result)) is not None:
        out.append(runs)
    return out


def _once(v: Verdict) -> list[str]:
    once = [m for m in v.matches if m.cand.once or m.base.once]
    if not once:
        return []
    if len(once) == len(v.matches):
        return ["measured once: no spread known"]
    return [
        "measured once, no spread known, at concurrency "
        + ", ".join(v.name_of(m.cand) for m in sorted(once, key=lambda m: m.cand.concurrency))
    ]


def _runs(base: Result, cand: Result) -> str | None:
    b, c = base.source.run, cand.source.run
    if b is None or c is None or b == c:
        return None
    return f"baseline from run #{b}, candidate from run #{c}"
