"""The analysis' outputs: findings recorded on the task, and the Markdown report (summary table,
a section per candidate, footnotes, provenance)."""

from __future__ import annotations

from orchestrator import Context
from tasks.analysis.judging import _why_pays
from tasks.analysis.matching import Acceptance, Match, Outcome, Point, points
from tasks.analysis.models import Result
from tasks.analysis.numbers import _value, fc, ft, fx
from tasks.analysis.verdict import Verdict
from tasks.analysis.wording import PROBLEM


def _windows_text(p: Point) -> str:
    if p.again is not None:
        return f"2 launches ({ft(p.level.output_tok_s)} then {ft(p.again.output_tok_s)} tok/s)"
    if p.once:
        return "measured once"
    return f"{p.windows} windows" if p.windows is not None else "windows not counted"


def _match_note(m: Match, v: Verdict) -> str:
    """'1.21-1.62, 5 windows vs 3 windows: win; 89 vs 63.6 tok/s'."""
    spread = m.spread_text
    head = (
        f"{spread}, {_windows_text(m.cand)} vs {_windows_text(m.base)}"
        if spread
        else "measured once: no spread known"
    )
    if m.base.launch_spread:
        head += (
            f", the candidate widened by the baseline's launch spread {m.base.launch_spread:.0%}"
        )
    outcome: str = v.outcome(m)
    if outcome == "inconclusive":
        outcome += " (" + ", ".join(v.inconclusive(m)) + ")"
    text = f"{head}: {outcome}; {ft(m.cand.tok_s)} vs {ft(m.base.tok_s)} tok/s"
    if m.base.level.concurrency != m.cand.level.concurrency:
        text += (
            f", baseline at concurrency {m.base.level.concurrency} "
            f"({fc(m.base.concurrency)} in flight)"
        )
    return text


def record(ctx: Context, v: Verdict) -> None:
    """The candidate's findings, verdict first (the board shows the first ones)."""
    n = v.name
    acc = v.acceptance
    summary = (
        []
        if acc is None
        else [
            f"tau {acc.tau:.2f} of k={acc.k}: {acc.strict:.1%} accepted/proposed"
            + (
                f" (the {acc.reported:.0%} reported is {acc.definition})"
                if acc.reported is not None and acc.definition != "strict"
                else ""
            )
        ]
    )
    missing = [] if v.no_capacity is None else [f"no capacity: {v.no_capacity}"]
    ctx.finding(f"{n}.verdict", v.verdict, note="; ".join(summary + v.notes + missing) or None)
    ctx.finding(f"{n}.pays", v.pays, note=_why_pays(v))
    if v.matches:
        keys: tuple[tuple[Outcome, str], ...] = (
            ("win", "wins_at"),
            ("even", "even_at"),
            ("loss", "loses_at"),
            ("inconclusive", "inconclusive_at"),
        )
        for outcome, key in keys:
            ctx.finding(
                f"{n}.{key}",
                ", ".join(str(m.cand.level.concurrency) for m in v.at(outcome)),
                note="requested concurrencies",
            )
        for m in sorted(v.matches, key=lambda m: m.cand.level.concurrency):
            ctx.finding(
                f"{n}.speedup_c{m.cand.level.concurrency}",
                round(m.speedup, 3),
                "x",
                _match_note(m, v),
            )
    if (pk := v.peak) is not None:
        ctx.finding(
            f"{n}.speedup_peak",
            round(pk.speedup, 3),
            "x",
            f"at concurrency {pk.cand.level.concurrency}, the baseline's peak "
            f"({ft(pk.base.tok_s)} tok/s); {_match_note(pk, v)}",
        )
    if (cap := v.capacity) is not None:
        ctx.finding(f"{n}.capacity", round(cap.speedup, 3), "x", v.capacity_text())
        record_peak(ctx, f"{n}.capacity", v, cap.cand)
    ctx.finding(f"{n}.capped", v.capped, note=v.cap_note)
    if acc is not None:
        _record_acceptance(ctx, n, acc)
    if (be := v.break_even) is not None:
        ctx.finding(
            f"{n}.break_even_step_ms",
            round(be.step_budget_ms, 2),
            "ms",
            "tau * T_dec: a speculative step must be faster to win at concurrency 1",
        )
        ctx.finding(f"{n}.speedup_ceiling", round(be.ceiling, 3), "x", "tau")


def record_peak(ctx: Context, key: str, v: Verdict, p: Point) -> None:
    """A side's peak, the figures behind a capacity: KEY_tok_s, KEY_concurrency (requested),
    and KEY_cap where the server's cap held that level below it."""
    ctx.finding(
        f"{key}_tok_s", round(p.tok_s, 1), "tok/s", f"peak, at concurrency {_peak_at(v, p)}"
    )
    ctx.finding(
        f"{key}_concurrency",
        p.level.concurrency,
        "requests",
        f"requested; {fc(p.concurrency)} in flight"
        + (" (taken from the cap)" if p.inferred else ""),
    )
    if p.cap is not None:
        ctx.finding(
            f"{key}_cap",
            p.cap,
            "requests",
            "max_running_requests: it held the peak's level below the concurrency requested",
        )


def _record_acceptance(ctx: Context, n: str, acc: Acceptance) -> None:
    ctx.finding(
        f"{n}.accept_length",
        round(acc.tau, 4),
        "tokens/step",
        f"tau incl. bonus token, from {acc.source}",
    )
    ctx.finding(f"{n}.draft_tokens", acc.k, "tokens", "k drafts per verify step")
    ctx.finding(f"{n}.acceptance", round(acc.strict, 4), "ratio", "(tau-1)/k")
    if acc.alpha is not None:
        ctx.finding(f"{n}.alpha", round(acc.alpha, 4), "ratio", "(1-a^(k+1))/(1-a) = tau")
    if acc.reported is not None:
        ctx.finding(
            f"{n}.acceptance_reported", acc.reported, "ratio", acc.notes[0] if acc.notes else None
        )


def _speedup_cell(m: Match | None, v: Verdict) -> str:
    if v.differ:
        return "not comparable"
    if m is None:
        return "not measured"
    return fx(m.speedup) + (f" ({m.spread_text})" if m.spread_text else "")


def _tok_cell(p: Point) -> str:
    """'410 (401-417, 5)', or '89, once' (measured once); 'unstable' where windows disagreed;
    a baseline of two launches: '405 (396-417; 410 then 399)', 'moved' where they disagree."""
    lo, hi = p.bounds
    if p.again is not None:
        text = (
            f"{ft(p.tok_s)} ({ft(lo)}-{ft(hi)}; {ft(p.level.output_tok_s)} then "
            f"{ft(p.again.output_tok_s)})" + (" moved" if p.moved else "")
        )
    elif p.once:
        text = f"{ft(p.tok_s)}, once"
    else:
        text = f"{ft(p.tok_s)} ({ft(lo)}-{ft(hi)}, {p.windows if p.windows is not None else '?'})"
    return text + (" unstable" if p.unstable else "")


def _pts_line(pts: list[Point]) -> str:
    return (
        ", ".join(
            f"{ft(p.tok_s)} tok/s at concurrency {p.level.concurrency}"
            + (
                f" ({fc(p.concurrency)} in flight)"
                if abs(p.concurrency - p.level.concurrency) > 1e-9
                else ""
            )
            for p in pts
        )
        or "no levels"
    )


def render(task_id: str, base: Result, verdicts: list[Verdict], again: Result | None = None) -> str:
    """The run's report: one summary table, each candidate's levels and reasoning, provenance."""
    out = _summary(task_id, base, verdicts)
    for v in verdicts:
        out += _section(v)
    out += _provenance(base, verdicts, again)
    return "\n".join(out) + "\n"


def _summary(task_id: str, base: Result, verdicts: list[Verdict]) -> list[str]:
    mrr = base.server.max_running_requests
    bpts = verdicts[0].base_points if verdicts else points(base)
    peak = max(bpts, key=lambda p: p.tok_s, default=None)
    noise = verdicts[0].noise if verdicts else 0.03
    tolerance = verdicts[0].tolerance if verdicts else 0.1
    changes = verdicts and all(v.engine_change for v in verdicts)
    what = "the engines" if changes else "speculative decoding"
    out = [
        f"# {task_id}: {what} against the baseline",
        "",
        f"Baseline **{base.label or 'baseline'}**"
        + (
            f" ({base.server.engine}" + (f", max_running_requests {mrr}" if mrr else "") + ")"
            if base.server.engine
            else ""
        )
        + f": {_pts_line(bpts)}.",
        "",
        f"Levels are compared only with the same number of requests in flight (within "
        f"{tolerance:.0%}). Speed-up = ratio of the medians over the measurement windows; "
        "its interval = [candidate min / baseline max, candidate max / baseline min] (with n "
        "windows, [min, max] covers a level's median with probability 1 - 2^(1-n): 75% for "
        f"3, 94% for 5). A level is a win when the whole interval lies above 1 + {noise:.0%}, "
        f"a loss when below 1 - {noise:.0%}, else even.",
        "",
        "Curves of these results (throughput and per-request speed against concurrency "
        "with their intervals, TTFT/TPOT percentiles, acceptance): `orch report PLAN`, "
        f"section `{task_id}`.",
        "",
        "Acceptance on one definition: accepted / proposed drafts = (tau-1)/k; alpha is the "
        "per-token acceptance with (1-alpha^(k+1))/(1-alpha) = tau (Leviathan et al.'s "
        "expected tokens per verify step, the target's own token included).",
        "",
        "| candidate | verdict | concurrency 1 | at the baseline's peak"
        + (f" (concurrency {peak.level.concurrency})" if peak else "")
        + " | capacity (peak / peak) | capped | tau (k) | (tau-1)/k | alpha | engine reported |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        out.append(
            "| "
            + " | ".join(
                [
                    v.name,
                    v.verdict,
                    _speedup_cell(v.c1, v),
                    _speedup_cell(v.peak, v),
                    _capacity_cell(v),
                    _capped_cell(v),
                    *_acceptance_cells(v.acceptance),
                ]
            )
            + " |"
        )
    return out


def _capacity_cell(v: Verdict) -> str:
    """'0.36x: 849 tok/s at 128 with 48 in flight (capped at 48) vs 2370 at 128'."""
    if (m := v.capacity) is None:
        return "not comparable" if v.differ else f"not measured: {v.no_capacity}"
    return (
        f"{v.capacity_figure()}: {ft(m.cand.tok_s)} tok/s at {_peak_at(v, m.cand)} vs "
        f"{ft(m.base.tok_s)} at {_peak_at(v, m.base)}"
    )


def _peak_at(v: Verdict, p: Point) -> str:
    """'128 with 48 in flight (capped at 48)': a peak's concurrency and the cap that held it."""
    return v.name_of(p) + (f" (capped at {p.cap})" if p.cap is not None else "")


def _capped_cell(v: Verdict) -> str:
    mrr = v.result.server.max_running_requests
    return f"yes, {mrr}" if v.capped and mrr else "yes" if v.capped else "no"


def _acceptance_cells(acc: Acceptance | None) -> list[str]:
    if acc is None:
        return ["–"] * 4
    reported = "–" if acc.reported is None else f"{acc.reported:.0%} ({acc.definition})"
    return [
        f"{acc.tau:.2f} ({acc.k})",
        f"{acc.strict:.1%}",
        "–" if acc.alpha is None else f"{acc.alpha:.3f}",
        reported,
    ]


def _section(v: Verdict) -> list[str]:
    out = [
        "",
        f"## {v.name}" + (f": {v.result.label}" if v.result.label else ""),
        "",
        f"**{v.verdict}**",
        "",
        f"Measured: {_pts_line(v.points)}.",
    ]
    if v.points:
        out += [
            "",
            "| concurrency | in flight | tok/s (median, interval, windows) "
            "| baseline tok/s | speed-up (interval) | outcome | spec step / decode step |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        out += _level_rows(v)
        out += _footnotes(v)
    return out + _bullets(v)


def _level_rows(v: Verdict) -> list[str]:
    """Each candidate level; and each baseline level no candidate level matched, 'not
    measured' (the baseline's peak among them, if so), so nothing is compared across levels."""
    by_cand = {id(m.cand): m for m in v.matches}
    matched_base = {id(m.base) for m in v.matches}
    rows: list[tuple[float, list[str]]] = []
    for p in v.points:
        m = by_cand.get(id(p))
        base_cell = (
            "not comparable"
            if v.differ
            else _tok_cell(m.base)
            if m
            else f"no level with {fc(p.concurrency)} in flight"
        )
        rows.append(
            (
                p.concurrency,
                [
                    str(p.level.concurrency),
                    fc(p.concurrency) + ("*" if p.inferred else ""),
                    _tok_cell(p),
                    base_cell,
                    _speedup_cell(m, v) if m or v.differ else "–",
                    v.outcome(m) if m else "not compared",
                    _cost_cell(v, m),
                ],
            )
        )
    if not v.differ:
        for b in v.base_points:
            if id(b) not in matched_base:
                peak = " (peak)" if b is v.base_peak else ""
                rows.append(
                    (
                        b.concurrency,
                        [
                            str(b.level.concurrency),
                            fc(b.concurrency),
                            "not measured",
                            _tok_cell(b) + peak,
                            "–",
                            "not measured",
                            "–",
                        ],
                    )
                )
    return ["| " + " | ".join(cells) + " |" for _, cells in sorted(rows, key=lambda r: r[0])]


def _cost_cell(v: Verdict, m: Match | None) -> str:
    cost = None if m is None else v.step_cost(m)
    if cost is None or v.acceptance is None:
        return "–"
    limit = v.step_limit(v.acceptance)
    return f"{cost:.2f}" + (f" > {limit:.3g}" if cost > limit * (1 + v.noise) else "")


def _footnotes(v: Verdict) -> list[str]:
    pts = v.points + [m.base for m in v.matches]
    notes = []
    if any(p.inferred for p in v.points):
        notes.append("\\* in flight not measured: taken as the server's max_running_requests")
    if any(p.once for p in pts):
        notes.append(
            f"once: measured once: no spread known (an orch.bench/v1 result or a "
            f"single window); the outcome rests on the ±{v.noise:.0%} noise margin "
            "alone"
        )
    if any(p.unstable for p in pts):
        notes.append(
            "unstable: the last windows did not agree within bench.serve's stability threshold:"
            " no win or loss is read from that level (inconclusive)"
        )
    if any(p.again is not None for p in pts):
        notes.append(
            "A then B: the baseline on its first launch, then again after the candidates on a "
            "second; its figure is their mean, its interval covers both, and each candidate's "
            "interval is widened by their distance (a launch varies that much). moved: the two "
            "launches disagree beyond their windows and the noise margin: inconclusive"
        )
    return ["", *notes] if notes else []


def _bullets(v: Verdict) -> list[str]:
    bullets = [f"- **{PROBLEM}.** {p}." for p in v.problems]
    bullets += [f"- **Capped.** {v.cap_note}."] if v.cap_note else []
    if (capacity := v.capacity_text()) is not None:
        bullets.append(f"- **Capacity.** {capacity[0].upper()}{capacity[1:]}.")
    else:
        bullets.append(f"- **Capacity.** None: {v.no_capacity}.")
    if (acc := v.acceptance) is not None:
        bullets.append(
            f"- **Acceptance.** tau = {acc.tau:.2f} with k = {acc.k} (from {acc.source}): "
            f"(tau-1)/k = {acc.strict:.1%} accepted/proposed"
            + ("" if acc.alpha is None else f", alpha = {acc.alpha:.3f}")
            + "".join(f"; {n}" for n in acc.notes)
            + "."
        )
        if v.break_even is not None:
            bullets.append(f"- **Break-even (section 4).** {v.break_even.text(acc)}.")
    shown = set(acc.notes) if acc is not None else set()
    bullets += [f"- {n}." for n in v.notes if n not in shown]
    return ["", *bullets] if bullets else []


def _provenance(base: Result, verdicts: list[Verdict], again: Result | None) -> list[str]:
    out = ["", "## Provenance", ""]
    again_row = [] if again is None else [("baseline again", again)]
    for role, result in [("baseline", base), *again_row, *((v.name, v.result) for v in verdicts)]:
        out.append(
            f"- **{role}**" + (f" ({result.label})" if result.label else "") + f": {_where(result)}"
        )
        for lv in result.levels:
            out += [
                f"  - rejected at concurrency {lv.concurrency}: {why}" for why in lv.rejected or []
            ]
    return out


def _where(result: Result) -> str:
    """Run, task and time; file; engine, version and resolved settings; benchmark settings."""
    src, srv = result.source, result.server
    parts = [
        ", ".join(
            x
            for x in (
                f"run #{src.run}" if src.run is not None else "run not recorded",
                f"task {src.task}" if src.task else "",
                f"at {src.at}" if src.at else "",
            )
            if x
        ),
        result.origin,
    ]
    engine = " ".join(x for x in (srv.engine or "engine not recorded", srv.version or "") if x)
    if srv.max_running_requests is not None:
        engine += f", max_running_requests {srv.max_running_requests}"
    parts.append(engine)
    if srv.settings:
        parts.append(
            "settings: " + ", ".join(f"{k}={_value(v)}" for k, v in sorted(srv.settings.items()))
        )
    parts.append(
        "benchmark: "
        + (
            ", ".join(f"{k}={_value(v)}" for k, v in sorted(result.benchmark.items()))
            or "not recorded"
        )
    )
    return "; ".join(parts)
