"""`analyze.compare`: the speculative-decoding math, the verdicts, and plans fed the field
reports' figures.

The field reports' figures: SGLang base 63.6 tok/s at concurrency 1, 2370 tok/s peak at
concurrency 128; AQ-MedAI EAGLE-3 drafter 849 tok/s peak, ~42% acceptance, accept length
~1.65 with 4 draft tokens (steps 3, topk 1: k = 3 drafts), max_running_requests 48 in spec mode
vs 2048 without; custom drafter ~25%; vLLM base 82.5 / 1536 tok/s, vLLM + drafter ~15% and a
0.66x multiplier. The other results are constructed: medians and [min, max] over windows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator import Context, TaskError
from orchestrator.core.findings import Finding
from orchestrator.views.report import markdown_html
from tasks.analysis.compare import AnalyzeCompare
from tasks.analysis.judging import _why_pays, compare
from tasks.analysis.models import CompareParams, Result, load_result
from tasks.analysis.render import record, render
from tasks.analysis.speculation import (
    alpha_from_tau,
    modelled_speedup,
    strict_rate,
    tau_from_alpha,
    tau_from_rate,
)
from tasks.analysis.verdict import Verdict

from conftest import PlanDir, free_port, run_orch
from helpers_tasks import FindingsSink
from test_servers import findings, no_server_left, stub_plan

__all__ = ["no_server_left"]  # the autouse fixture: no server process outlives a test

SGLANG_BASE: dict[str, Any] = {
    "label": "SGLang base, no speculation",
    "levels": [
        {"concurrency": 1, "output_tok_s": 63.6},
        {"concurrency": 128, "output_tok_s": 2370},
    ],
    "server": {"engine": "sglang", "max_running_requests": 2048},
}
AQ_MEDAI: dict[str, Any] = {
    "levels": [{"concurrency": 128, "output_tok_s": 849}],  # achieved not reported
    "server": {"engine": "sglang", "max_running_requests": 48},
    "spec": {
        "algorithm": "EAGLE3",
        "num_draft_tokens": 4,
        "accept_length": 1.65,
        "acceptance": "42%",
        "acceptance_definition": "sglang_legacy",
    },
}
CUSTOM: dict[str, Any] = {  # the report gives only its acceptance, from the same SGLang log
    "server": {"engine": "sglang", "max_running_requests": 48},
    "spec": {"num_draft_tokens": 4, "acceptance": 0.25, "acceptance_definition": "sglang_legacy"},
}
VLLM_BASE: dict[str, Any] = {
    "levels": [
        {"concurrency": 1, "output_tok_s": 82.5},
        {"concurrency": 128, "output_tok_s": 1536},
    ],
    "server": {"engine": "vllm"},
}
VLLM_SPEC: dict[str, Any] = {  # the report gives 0.66x; put at the peak level, k = 3 assumed
    "levels": [{"concurrency": 128, "output_tok_s": round(0.66 * 1536, 1)}],
    "server": {"engine": "vllm"},
    "spec": {"draft_tokens": 3, "acceptance": 0.15},  # vLLM: strict by default
}


def _result(data: dict[str, Any]) -> Result:
    return Result.model_validate(data)


def _levels(*pairs: tuple[int, float]) -> list[dict[str, float]]:
    """v1 levels: one figure each, measured once."""
    return [{"concurrency": c, "output_tok_s": t} for c, t in pairs]


def _lv(
    concurrency: int, tok_s: float, lo: float, hi: float, windows: int = 3, **extra: Any
) -> dict[str, Any]:
    """A v2 level: the median of `windows` windows and their [min, max]."""
    return {
        "concurrency": concurrency,
        "achieved_concurrency": float(concurrency),
        "output_tok_s": tok_s,
        "windows": windows,
        "stable": True,
        "interval": {"output_tok_s": [lo, hi]},
        **extra,
    }


def _recorded(v: Verdict, tmp_path: Path) -> dict[str, Finding]:
    sink = FindingsSink()
    record(Context("an", 1, 1, tmp_path / "an.log", None, sink), v)
    return sink.found


# --- the math ----------------------------------------------------------------------------------


def test_alpha_inverts_the_expected_accept_length() -> None:
    """tau=1.65, k=3 gives alpha 0.411; the inversion round-trips at the ends."""
    assert alpha_from_tau(1.65, 3) == pytest.approx(0.411, abs=5e-4)
    a = alpha_from_tau(1.65, 3)
    assert a + a**2 + a**3 == pytest.approx(0.65, abs=1e-9)
    assert alpha_from_tau(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert alpha_from_tau(4.0, 3) == pytest.approx(1.0, abs=1e-9)
    for alpha in (0.1, 0.5, 0.9):
        assert alpha_from_tau(tau_from_alpha(alpha, 4), 4) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ValueError, match="outside"):
        alpha_from_tau(4.5, 3)


def test_tau_table() -> None:
    """tau(alpha, k) = 1 + alpha + ... + alpha^k for alpha 0.6/0.7/0.8 and k = 1..4."""
    table = {
        0.6: (1.60, 1.96, 2.18, 2.31),
        0.7: (1.70, 2.19, 2.53, 2.77),
        0.8: (1.80, 2.44, 2.95, 3.36),
    }
    for alpha, row in table.items():
        assert [round(tau_from_alpha(alpha, k), 2) for k in (1, 2, 3, 4)] == list(row)


def test_sglang_42_percent_and_vllm_15_percent_on_one_definition() -> None:
    """SGLang's old 42% is tau/(k+1); strict it is ~22%, vs vLLM's 15% strict."""
    # the old SGLang log's 41% for tau=1.65 is tau/(k+1) = 1.65/4
    assert tau_from_rate(0.4125, 3, "sglang_legacy") == pytest.approx(1.65)
    assert strict_rate(1.65, 3) == pytest.approx(0.2167, abs=1e-4)
    tau = tau_from_rate(0.42, 3, "sglang_legacy")
    assert tau == pytest.approx(1.68)
    assert strict_rate(tau, 3) == pytest.approx(0.2267, abs=1e-4)
    # vLLM's 15% is already strict: tau = 1 + 0.15k
    assert tau_from_rate(0.15, 3, "strict") == pytest.approx(1.45)
    assert alpha_from_tau(1.45, 3) == pytest.approx(0.32, abs=0.005)
    assert tau_from_rate(0.15, 4, "strict") == pytest.approx(1.60)
    assert alpha_from_tau(1.60, 4) == pytest.approx(0.38, abs=0.005)


def test_legacy_figure_below_its_floor_is_refused_by_the_math() -> None:
    """A legacy rate starts at 1/(k+1): 25% with k=3 is tau=1, 20% is impossible (the function
    refuses it; a measured result holding it is flagged, see below)."""
    assert tau_from_rate(0.25, 3, "sglang_legacy") == 1.0
    with pytest.raises(ValueError, match="below the floor"):
        tau_from_rate(0.20, 3, "sglang_legacy")


def test_modelled_speedup_and_break_even_of_section_4() -> None:
    """S = tau/(k*r+1): 1.43x / 1.27x / 1.03x at draft/target cost ratios r = 0.05 / 0.1 / 0.2;
    the 25.9 ms budget."""
    assert [round(modelled_speedup(1.65, 3, c), 2) for c in (0.05, 0.1, 0.2)] == [1.43, 1.27, 1.03]
    v = compare("aq", _result(AQ_MEDAI), _result(SGLANG_BASE))
    assert v.break_even is not None
    assert v.break_even.t_dec_ms == pytest.approx(15.72, abs=0.01)
    assert v.break_even.step_budget_ms == pytest.approx(25.94, abs=0.01)
    assert v.break_even.max_draft_cost == pytest.approx(0.2167, abs=1e-4)
    assert v.break_even.ceiling == 1.65


# --- params: refused or flagged ------------------------------------------------------------------


def test_params_refuse_figures_that_cannot_be_read_one_way() -> None:
    """Refused, as plan errors: an SGLang rate without its definition, tree drafting, a figure
    without k, a bad candidate name, an interval upside down, an unknown key in a window."""

    def problem(data: dict[str, Any]) -> str:
        with pytest.raises(ValidationError) as exc:
            Result.model_validate(data)
        return str(exc.value)

    sglang = {"server": {"engine": "sglang"}}
    assert "acceptance_definition is needed" in problem(
        {**sglang, "spec": {"draft_tokens": 3, "acceptance": 0.42}}
    )
    assert "tree" in problem({**sglang, "spec": {"draft_tokens": 3, "num_draft_tokens": 8}})
    assert "needs draft_tokens" in problem({**sglang, "spec": {"accept_length": 1.65}})
    assert "the low end is above the high end" in problem({"levels": [_lv(1, 100, 110, 90)]})
    assert "extra_forbidden" in problem(
        {"levels": [{**_lv(1, 100, 90, 110), "per_window": [{"output_toks": 100}]}]}
    )
    vllm = Result.model_validate(
        {"server": {"engine": "vllm"}, "spec": {"draft_tokens": 3, "acceptance": "15%"}}
    )
    assert vllm.spec is not None and vllm.spec.acceptance == pytest.approx(0.15)
    assert vllm.spec.acceptance_definition == "strict"
    with pytest.raises(ValidationError, match="pattern"):
        CompareParams.model_validate({"baseline": "b.json", "candidates": {"a b": "c.json"}})


def test_v2_level_takes_every_key_bench_serve_writes() -> None:
    """Medians, windows, stability, spread, intervals, per-window figures, rejected windows,
    provenance and the server's resolved settings all validate."""
    level = {
        **_lv(8, 410.0, 401.0, 417.0, windows=2),
        "spread": 0.021,
        "tpot_ms": 19.1,
        "ttft_ms": 210.0,
        "interval": {
            "output_tok_s": [401.0, 417.0],
            "tpot_ms": [18.8, 19.5],
            "ttft_ms": [190.0, 240.0],
            "achieved_concurrency": [7.8, 8.0],
        },
        "per_window": [
            {
                "output_tok_s": 401.0,
                "tpot_ms": 19.5,
                "ttft_ms": 240.0,
                "achieved_concurrency": 7.8,
                "duration_s": 12.0,
            },
            {
                "output_tok_s": 417.0,
                "tpot_ms": 18.8,
                "ttft_ms": 190.0,
                "achieved_concurrency": 8.0,
                "duration_s": 11.5,
            },
        ],
        "rejected": ["window 1: warm-up transient, 31% below the rest"],
        "request_s": 2.1,
        "completed": 32,
        "errors": 0,
        "duration_s": 23.5,
        "ttft": {"mean": 210.0, "p50": 205.0},
        "spec": {"accept_length": 2.1},
    }
    r = Result.model_validate(
        {
            "source": {"run": 5, "task": "bench_base", "at": "2026-11-30T18:32:00+00:00"},
            "levels": [level],
            "server": {
                "engine": "vllm",
                "version": "0.11.0",
                "settings": {
                    "max_model_len": 512,
                    "speculative_num_steps": 3,
                    "algorithm": "draft_model",
                    "draft_model": "/m/noisy",
                },
            },
            "benchmark": {
                "tool": "orch bench.serve",
                "warmup": 2,
                "stability": 0.05,
                "min_windows": 3,
                "max_windows": 6,
                "requests": 16,
            },
        }
    )
    assert r.source.run == 5 and r.levels[0].interval is not None
    assert r.levels[0].windows == 2 and r.server.settings["max_model_len"] == 512


def test_out_of_range_acceptance_is_flagged_not_refused() -> None:
    """tau above k+1, a strict rate above 1 (42 for 42%) or a legacy rate below its floor are
    what a counter said: the result reads, and the verdict opens with MEASUREMENT PROBLEM."""
    base = _result(SGLANG_BASE)
    for spec, problem in [
        (
            {"draft_tokens": 3, "accept_length": 4.2},
            "accept length tau = 4.20 is outside [1, k+1] = [1, 4]",
        ),
        (
            {"draft_tokens": 3, "acceptance": 42},
            "acceptance 4200.0% is outside [0.0%, 100%], the range of the strict definition with "
            "k=3 (a percentage is written 0.42 or '42%')",
        ),
        (
            {"draft_tokens": 3, "acceptance": 0.2, "acceptance_definition": "sglang_legacy"},
            "acceptance 20.0% is outside [25.0%, 100%], the range of the sglang_legacy definition "
            "with k=3: check k and the definition",
        ),
    ]:
        cand = _result({"server": {"engine": "vllm"}, "levels": _levels((1, 90)), "spec": spec})
        v = compare("x", cand, base)
        assert v.verdict.startswith(f"MEASUREMENT PROBLEM: {problem} — "), v.verdict
        assert not v.pays and v.break_even is None
        assert f"- **MEASUREMENT PROBLEM.** {problem}." in render("an", base, [v])


# --- the verdicts ------------------------------------------------------------------------------


def test_noisy_speed_up_within_the_spread_is_even() -> None:
    """1.06x whose windows overlap (0.92-1.23) is even, not 'pays'; the same medians with tight
    windows (1.04-1.08) are a win."""
    base = _result({"levels": [_lv(1, 100, 92, 108)]})
    noisy = compare("c", _result({"levels": [_lv(1, 106, 99, 113)]}), base)
    assert noisy.verdict == "no speed-up: even at concurrency 1: 1.06x (0.92-1.23)"
    assert not noisy.pays and [noisy.outcome(m) for m in noisy.matches] == ["even"]
    assert _why_pays(noisy) == "no: even at every concurrency measured, within the noise"
    tight_base = _result({"levels": [_lv(1, 100, 99.5, 100.5)]})
    tight = compare("c", _result({"levels": [_lv(1, 106, 105, 107)]}), tight_base)
    assert tight.verdict == "speculation pays at concurrency 1: 1.06x (1.04-1.08)"
    assert tight.pays
    assert _why_pays(tight) == "yes: wins at concurrency 1, loses at none, no measurement problem"


def test_non_monotone_sweep_is_described_level_by_level(tmp_path: Path) -> None:
    """Wins at 1, even at 4, loses at 8: said as it is, no 'loses above' threshold; mixed
    results do not pay; the findings list the concurrencies of each outcome."""
    base = _result(
        {"levels": [_lv(1, 100, 95, 105), _lv(4, 400, 390, 410), _lv(8, 1000, 980, 1020)]}
    )
    cand = _result(
        {"levels": [_lv(1, 143, 127.05, 153.9), _lv(4, 404, 380, 430), _lv(8, 710, 673.2, 754.6)]}
    )
    v = compare("eagle", cand, base)
    assert v.verdict == (
        "capacity 0.71x (0.66-0.77): 710 against 1000 tok/s; the baseline's peak at concurrency "
        "8 — wins at concurrency 1 (1.43x, 1.21-1.62), even at 4, loses at 8 (0.71x, 0.66-0.77)"
    )
    assert not v.pays
    f = _recorded(v, tmp_path)
    assert (f["eagle.wins_at"].value, f["eagle.even_at"].value, f["eagle.loses_at"].value) == (
        "1",
        "4",
        "8",
    )
    assert f["eagle.speedup_c1"].value == 1.43
    assert f["eagle.speedup_c1"].note == "1.21-1.62, 3 windows vs 3 windows: win; 143 vs 100 tok/s"
    assert f["eagle.speedup_c8"].note is not None and "0.66-0.77" in f["eagle.speedup_c8"].note
    assert f["eagle.speedup_peak"].value == 0.71  # the baseline's peak is its concurrency 8
    assert "eagle.loses_above" not in f and f["eagle.pays"].value is False
    assert f["eagle.pays"].note == "no: loses at concurrency 8, wins at 1"  # why, for this run


def test_uniform_sweeps_are_said_in_one_phrase() -> None:
    """Wins everywhere: 'pays at every concurrency measured (1, 4, 8): 1.3-1.8x'; even and
    losses everywhere likewise; wins and evens without a loss pay."""
    base = _result({"levels": [_lv(1, 100, 99, 101), _lv(4, 400, 396, 404), _lv(8, 800, 792, 808)]})

    def verdict(*tok_s: float) -> Verdict:
        return compare(
            "c",
            _result(
                {
                    "levels": [
                        _lv(c, t, t * 0.99, t * 1.01) for c, t in zip((1, 4, 8), tok_s, strict=True)
                    ]
                }
            ),
            base,
        )

    assert verdict(180, 600, 1040).verdict == (
        "speculation pays at every concurrency measured (1, 4, 8): 1.3-1.8x"
    )
    assert verdict(100, 404, 796).verdict == (
        "no speed-up: even at every concurrency measured (1, 4, 8): 0.99-1.01x"
    )
    assert verdict(60, 240, 640).verdict == (
        "capacity 0.8x (0.78-0.82): 640 against 800 tok/s; the baseline's peak at concurrency 8"
        " — loses at every concurrency measured (1, 4, 8): 0.6-0.8x"
    )
    some = verdict(150, 404, 800)
    assert some.verdict == "wins at concurrency 1 (1.5x, 1.47-1.53), even at 4 and 8"
    assert some.pays


def test_v1_sweep_is_level_by_level_and_measured_once(tmp_path: Path) -> None:
    """1.4x at concurrency 1 shrinking to 0.8x at 128, v1 figures: each level's outcome, the
    step cost per level, and 'measured once: no spread known'."""
    base = _result({"levels": _levels((1, 60), (8, 400), (32, 1200), (128, 2400))})
    cand = _result(
        {
            "levels": _levels((1, 84), (8, 480), (32, 1260), (128, 1920)),
            "spec": {"draft_tokens": 3, "accept_length": 2.2},
        }
    )
    v = compare("eagle", cand, base)
    assert v.verdict == (
        "capacity 0.8x: 1920 against 2400 tok/s; the baseline's peak at concurrency 128 — "
        "wins at concurrency 1 (1.4x), 8 (1.2x) and 32 (1.05x), loses at 128 "
        "(0.8x); measured once: no spread known"
    )
    assert not v.pays and not v.capped
    assert v.c1 is not None and v.c1.speedup == pytest.approx(1.4)
    assert v.break_even is not None and v.break_even.measured == pytest.approx(1.4)
    md = render("an", base, [v])
    assert "tau/S = 1.57 decode steps" in md
    assert "| 128 | 128 | 1920, once | 2400, once | 0.8x | loss | 2.75 |" in md
    assert "once: measured once: no spread known" in md
    assert _recorded(v, tmp_path)["eagle.speedup_c128"].note == (
        "measured once: no spread known: loss; 1920 vs 2400 tok/s"
    )


def test_levels_compare_at_equal_achieved_concurrency() -> None:
    """A candidate asked for 64 that ran 33 in flight is compared with the baseline's 32."""
    base = _result(
        {
            "levels": [
                {"concurrency": 32, "achieved_concurrency": 31.5, "output_tok_s": 1000},
                {"concurrency": 64, "achieved_concurrency": 63.0, "output_tok_s": 1800},
            ]
        }
    )
    cand = _result(
        {"levels": [{"concurrency": 64, "achieved_concurrency": 33.0, "output_tok_s": 1100}]}
    )
    v = compare("c", cand, base)
    assert [(m.cand.level.concurrency, m.base.level.concurrency) for m in v.matches] == [(64, 32)]
    assert v.verdict == (
        "capacity 0.61x: 1100 against 1800 tok/s; the baseline's peak at concurrency 64 — "
        "speculation pays at concurrency 64 with 33 in flight: 1.1x; measured "
        "once: no spread known; fewer in flight than requested, cause unknown"
    )
    assert v.capped and "cause is unknown" in (v.cap_note or "")
    assert v.peak is None  # the baseline's peak has 63 in flight: no candidate level there
    # With the server's cap recorded and not reached, the shortfall is not the cap.
    below_cap = compare(
        "c", _result({**cand.model_dump(), "server": {"max_running_requests": 64}}), base
    )
    assert not below_cap.capped and "fewer in flight" not in below_cap.verdict
    assert any(
        n.startswith(
            "fewer in flight than requested at concurrency 64 (33), under "
            "max_running_requests=64: not the server's cap"
        )
        for n in below_cap.notes
    )


def test_candidate_measured_only_at_concurrency_1_gets_no_peak_ratio(tmp_path: Path) -> None:
    """No speed-up across concurrencies: against a baseline peaking at 128, a candidate
    measured at 1 only gets a verdict about 1, no peak finding, 'not measured' at 128, and a
    capacity that is only a lower bound ('at least'), left out of the verdict."""
    base = _result(SGLANG_BASE)
    v = compare("c", _result({"levels": _levels((1, 90))}), base)
    assert v.verdict == "speculation pays at concurrency 1: 1.42x; measured once: no spread known"
    assert v.peak is None and v.pays
    f = _recorded(v, tmp_path)
    assert "c.speedup_peak" not in f and "c.speedup_c128" not in f
    assert f["c.speedup_c1"].value == 1.415
    md = render("an", base, [v])
    assert (
        "| c | speculation pays at concurrency 1: 1.42x; measured once: no spread known "
        "| 1.42x | not measured | at least 0.04x: 90 tok/s at 1 vs 2370 at 128 | no |" in md
    )
    assert "| 128 | 128 | not measured | 2370, once (peak) | – | not measured | – |" in md


def test_speculative_step_above_k_plus_1_is_a_measurement_problem() -> None:
    """tau 4.0 of k=3 at 0.86x: a step of 4.7 decode steps, more than k+1 = 4 (the most a
    verify of k+1 tokens costs);
    at 1.0x (4.0 steps) nothing is flagged; nor with max_draft_cost 1 (a draft model as large
    as the target: up to k+1 + k = 7 steps)."""
    base = _result({"levels": [_lv(8, 1000, 990, 1010), _lv(16, 1800, 1790, 1810)]})

    def run(tok_s: float, max_draft_cost: float = 0.0) -> Verdict:
        return compare(
            "self",
            _result(
                {
                    "levels": [_lv(8, tok_s, tok_s - 5, tok_s + 5)],
                    "spec": {"draft_tokens": 3, "accept_length": 4.0},
                }
            ),
            base,
            max_draft_cost=max_draft_cost,
        )

    v = run(860)
    assert v.verdict.startswith(
        "MEASUREMENT PROBLEM: a speculative step at concurrency 8 costs 4.7 decode steps "
        "(tau / speed-up), more than k+1 = 4 — loses at concurrency 8: 0.86x (0.85-0.87)"
    )
    assert any("set max_draft_cost: 1" in n for n in v.notes)
    assert (
        "| 8 | 8 | 860 (855-865, 3) | 1000 (990-1010, 3) | 0.86x (0.85-0.87) | loss "
        "| 4.65 > 4 |" in render("an", base, [v])
    )
    assert not run(1000).problems
    assert not run(860, max_draft_cost=1).problems
    two = compare(
        "self",
        _result(
            {
                "levels": [_lv(8, 860, 855, 865), _lv(16, 1500, 1495, 1505)],
                "spec": {"draft_tokens": 3, "accept_length": 4.0},
            }
        ),
        base,
    )
    assert two.problems == [
        "a speculative step at concurrency 8, 16 costs 4.7-4.8 decode steps "
        "(tau / speed-up), more than k+1 = 4"
    ]


def test_speed_up_above_tau_is_a_measurement_problem() -> None:
    """2.1x at concurrency 1 with tau = 1.65: faster than free drafts allow; it does not pay."""
    base = _result({"levels": [_lv(1, 100, 99, 101)]})
    cand = _result(
        {"levels": [_lv(1, 210, 208, 212)], "spec": {"draft_tokens": 3, "accept_length": 1.65}}
    )
    v = compare("x", cand, base)
    assert v.verdict.startswith(
        "MEASUREMENT PROBLEM: speed-up 2.1x at concurrency 1 exceeds "
        "tau = 1.65, the ceiling even with free drafts — speculation "
        "pays at concurrency 1"
    )
    assert not v.pays


def test_median_outside_its_interval_is_flagged() -> None:
    """A median outside its own [min, max] is flagged, and the ratio bounds take it in."""
    base = _result({"levels": [_lv(1, 100, 99, 101)]})
    v = compare("x", _result({"levels": [_lv(1, 150, 100, 110)]}), base)
    assert v.problems == [
        "candidate at concurrency 1: median 150 tok/s outside its own interval 100-110"
    ]
    assert v.matches[0].bounds == pytest.approx((100 / 101, 150 / 99))


def test_results_of_two_runs_are_said_to_be(tmp_path: Path) -> None:
    """Baseline from run #5, candidate from run #2: the verdict says so; the report names run,
    task, time, engine, version, resolved settings and benchmark settings."""
    base = _result(
        {
            "levels": [_lv(1, 100, 99, 101)],
            "label": "base",
            "source": {"run": 5, "task": "bench_base", "at": "2026-11-30T18:32:00Z"},
            "server": {"engine": "vllm", "version": "0.11.0", "settings": {"max_model_len": 512}},
            "benchmark": {"output_tokens": 48, "requests": 16},
        }
    )
    cand = _result(
        {
            "levels": [_lv(1, 130, 128, 132)],
            "source": {"run": 2, "task": "bench_noisy"},
            "server": {"engine": "vllm", "settings": {"draft_model": "/m/noisy"}},
            "benchmark": {"output_tokens": 48, "requests": 16},
        }
    )
    v = compare("noisy", cand, base)
    assert v.verdict == (
        "speculation pays at concurrency 1: 1.3x (1.27-1.33); baseline from "
        "run #5, candidate from run #2"
    )
    md = render("an", base, [v])
    assert (
        "- **baseline** (base): run #5, task bench_base, at 2026-11-30T18:32:00Z; inline in "
        "the plan; vllm 0.11.0; settings: max_model_len=512; benchmark: output_tokens=48, "
        "requests=16"
    ) in md
    assert (
        "- **noisy**: run #2, task bench_noisy; inline in the plan; vllm; settings: "
        "draft_model='/m/noisy'" in md
    )
    same = compare("noisy", _result({**cand.model_dump(), "source": {"run": 5}}), base)
    assert "run #" not in same.verdict


def test_different_workloads_are_not_comparable(tmp_path: Path) -> None:
    """output_tokens 48 vs 128: no speed-up, no win or loss; a different request count or tool
    is only a note, a label nothing."""
    bench = {
        "tool": "orch bench.serve",
        "label": "base",
        "output_tokens": 48,
        "requests": 16,
        "temperature": 0.0,
    }
    base = _result({"levels": [_lv(1, 100, 99, 101)], "benchmark": bench})
    cand = _result(
        {
            "levels": [_lv(1, 140, 139, 141)],
            "spec": {"draft_tokens": 3, "accept_length": 2.0},
            "benchmark": {**bench, "output_tokens": 128, "label": "eagle"},
        }
    )
    v = compare("e", cand, base)
    assert v.verdict == "not comparable: output_tokens 48 vs 128"
    assert not v.pays and not v.matches
    f = _recorded(v, tmp_path)
    assert not any(k.startswith(("e.speedup", "e.wins", "e.loses", "e.even")) for k in f)
    assert (
        "| 1 | 1 | 140 (139-141, 3) | not comparable | not comparable | not compared | – |"
        in render("an", base, [v])
    )
    other = _result(
        {
            **cand.model_dump(),
            "benchmark": {**bench, "requests": 32, "tool": "sglang.bench_serving"},
        }
    )
    v = compare("e", other, base)
    assert v.verdict == "speculation pays at concurrency 1: 1.4x (1.38-1.42)"
    assert any(
        n.startswith("measured differently (baseline vs candidate: requests 16 vs 32)")
        for n in v.notes
    )
    assert any(n.startswith("different benchmark tools") for n in v.notes)


def test_unstable_levels_are_inconclusive_never_a_win(tmp_path: Path) -> None:
    """A candidate level whose last windows disagreed is no win, however clear its interval:
    inconclusive, said why in the verdict's head, marked in the table, no `pays`."""
    base = _result({"levels": [_lv(8, 1000, 990, 1010)]})
    cand = _result(
        {"levels": [{**_lv(8, 1300, 1150, 1450, windows=6), "stable": False, "spread": 0.12}]}
    )
    v = compare("x", cand, base)
    assert v.verdict == "inconclusive at concurrency 8: candidate unstable, spread 12%"
    assert not v.pays
    assert "| 1300 (1150-1450, 6) unstable |" in render("an", base, [v])
    f = _recorded(v, tmp_path)
    assert (f["x.wins_at"].value, f["x.inconclusive_at"].value) == ("", "8")
    assert f["x.speedup_c8"].note is not None
    assert "inconclusive (candidate unstable, spread 12%)" in f["x.speedup_c8"].note


def test_an_unstable_baseline_level_is_inconclusive_for_every_candidate() -> None:
    """Run 2 of the issue: the baseline at 4 a third of run 1's and unstable, both candidates
    'winning' against it. Every candidate is inconclusive there, decided elsewhere."""
    base = _result(
        {
            "levels": [
                _lv(1, 869, 850, 880),
                {**_lv(4, 1172, 900, 1700, windows=8), "stable": False, "spread": 0.45},
                _lv(8, 4621, 4500, 4700),
            ]
        }
    )
    noisy = _result(
        {"levels": [_lv(1, 400, 390, 410), _lv(4, 1630, 1600, 1650), _lv(8, 1500, 1450, 1550)]}
    )
    custom = _result(
        {"levels": [_lv(1, 860, 840, 890), _lv(4, 3460, 3400, 3500), _lv(8, 4250, 4100, 4400)]}
    )
    lower = "capacity 0.35x (0.34-0.37): 1630 against 4621 tok/s; "
    lower += "the candidate's peak at concurrency 4, the baseline's at 8 — "
    for name, cand, rest in (
        ("noisy", noisy, lower + "loses at concurrency 1 (0.46x, 0.44-0.48), "),
        ("custom", custom, "even at concurrency 1, "),
    ):
        v = compare(name, cand, base)
        assert [v.outcome(m) for m in v.matches][1] == "inconclusive"
        assert v.verdict.startswith(rest + "inconclusive at 4 (baseline unstable, spread 45%)"), (
            v.verdict
        )
        assert not v.pays


def test_a_baseline_that_moved_between_launches_makes_its_comparisons_inconclusive(
    tmp_path: Path,
) -> None:
    """A/B/A: the baseline at 4 measured 3321 then 1172 tok/s on its two launches: nothing
    measured between them can be told from that drift, and both figures are shown. Where the
    launches agree, the baseline's interval covers both and the candidate's is widened by their
    distance: a 'win' the windows of one launch claimed becomes even."""
    first = _result({"levels": [_lv(1, 861, 850, 870), _lv(4, 3321, 3250, 3400)]})
    again = _result({"levels": [_lv(1, 800, 790, 810), _lv(4, 1172, 1150, 1200)]})
    cand = _result({"levels": [_lv(1, 910, 905, 915), _lv(4, 2950, 2900, 3000)]})
    alone = compare("c", cand, first)
    assert [alone.outcome(m) for m in alone.matches] == ["win", "loss"]
    v = compare("c", cand, first, again=again)
    assert [v.outcome(m) for m in v.matches] == ["even", "inconclusive"]
    assert v.verdict == (
        "even at concurrency 1, inconclusive at 4 (baseline moved between its launches, "
        "3321 then 1172 tok/s)"
    )
    assert not v.pays
    c1 = v.matches[0]
    assert c1.base.tok_s == pytest.approx(830.5) and c1.base.bounds == (790, 870)
    spread = 61 / 830.5  # the launches' distance, relative to their mean
    assert c1.bounds == pytest.approx((905 * (1 - spread) / 870, 915 * (1 + spread) / 790))
    md = render("an", first, [v], again)
    assert "| 830.5 (790-870; 861 then 800) |" in md
    assert "| 2246 (1150-3400; 3321 then 1172) moved |" in md
    assert "- **baseline again**: run not recorded" in md
    f = _recorded(v, tmp_path)
    assert f["c.inconclusive_at"].value == "4"
    assert "2 launches (861 then 800 tok/s)" in str(f["c.speedup_c1"].note)
    assert "launch spread 7%" in str(f["c.speedup_c1"].note)


EAGLE3_CAPPED: dict[str, Any] = {  # the field report's run, its 48 in flight measured
    **AQ_MEDAI,
    "levels": [{"concurrency": 128, "achieved_concurrency": 48.0, "output_tok_s": 849}],
}
FIELD_CAPACITY = (
    "capacity 0.36x: 849 against 2370 tok/s; capped at 48 running requests; the baseline's "
    "peak at concurrency 128"
)


def test_capacity_of_the_field_reports_capped_eagle3_leads_the_verdict(tmp_path: Path) -> None:
    """The field reports' central finding: EAGLE-3, held by SGLang's cap at 48 in flight of
    the 128 offered, served 849 tok/s against the base's 2370 at 128. No baseline level had
    48 in flight, so no level is compared, yet its peak is known: capacity 0.36x opens the
    verdict, with both concurrencies and the cap, in the findings and the report's column."""
    base = _result(SGLANG_BASE)
    v = compare("aq_medai", _result(EAGLE3_CAPPED), base)
    assert not v.matches  # the capped level is not compared ...
    cap = v.capacity  # ... and its capacity is there all the same
    assert cap is not None and cap.speedup == pytest.approx(849 / 2370, abs=1e-9)
    assert (cap.cand.level.concurrency, cap.cand.concurrency, cap.cand.cap) == (128, 48, 48)
    assert (cap.base.level.concurrency, cap.base.cap) == (128, None)
    assert not v.capacity_floor and v.capacity_lower
    head, rest = v.verdict.split(" — ")
    assert head == FIELD_CAPACITY
    assert rest == (
        "not compared: no baseline level at equal concurrency (candidate: concurrency 128 "
        "with 48 in flight)"  # the cap is said once, in the capacity
    )
    # In flight taken from the cap (the report gave none): the same verdict.
    assert compare("aq_medai", _result(AQ_MEDAI), base).verdict == v.verdict
    assert v.capacity_text() == (
        "capacity 0.36x: peak 849 tok/s at concurrency 128 with 48 in flight (cap 48) against "
        "the baseline's 2370 tok/s at concurrency 128 (cap 2048); capped at 48 running "
        "requests, fewer than the 128 in flight at the baseline's peak; the baseline peaked at "
        "the highest concurrency measured: more load may serve more"
    )
    f = _recorded(v, tmp_path)
    assert f["aq_medai.capacity"].value == 0.358 and f["aq_medai.capacity"].unit == "x"
    assert f["aq_medai.capacity"].note == v.capacity_text()
    assert (f["aq_medai.capacity_tok_s"].value, f["aq_medai.capacity_tok_s"].unit) == (849, "tok/s")
    assert f["aq_medai.capacity_concurrency"].value == 128
    assert f["aq_medai.capacity_concurrency"].note == "requested; 48 in flight"
    assert f["aq_medai.capacity_cap"].value == 48
    cell = "0.36x: 849 tok/s at 128 with 48 in flight (capped at 48) vs 2370 at 128"
    md = render("an", base, [v])
    assert f"| aq_medai | {v.verdict} | not measured | not measured | {cell} | yes, 48 |" in md
    assert "- **Capacity.** Capacity 0.36x: peak 849 tok/s" in md
    # The HTML report's section is that Markdown: the same cell.
    (tmp_path / "an.md").write_text(md)
    (section,) = AnalyzeCompare.report({"report": Finding("report", str(tmp_path / "an.md")), **f})
    assert f"<td>{cell}</td>" in markdown_html(section.text)
    # The page opens with it: the verdict, capacity first, is the section's answer.
    assert section.headline == (f"aq_medai: {v.verdict}",)
    assert section.headline[0].startswith("aq_medai: capacity 0.36x: 849 against 2370 tok/s")


def test_a_capped_level_without_a_baseline_level_has_its_capacity() -> None:
    """A baseline peaking at 2000 tok/s at 128; a candidate offered 64, held at 48 in flight by
    its cap, serving 1000. No baseline level has 48 in flight and the candidate was never
    offered 128, but more load would not have put more in flight: capacity 0.5x."""
    base = _result(
        {
            "levels": _levels((1, 60), (16, 700), (128, 2000)),
            "server": {"engine": "sglang", "max_running_requests": 2048},
        }
    )
    cand = _result(
        {
            "levels": [
                {"concurrency": 1, "output_tok_s": 70},
                {"concurrency": 64, "achieved_concurrency": 48.0, "output_tok_s": 1000},
            ],
            "server": {"engine": "sglang", "max_running_requests": 48},
        }
    )
    v = compare("e", cand, base)
    assert [m.cand.level.concurrency for m in v.matches] == [1]  # 48 in flight: not compared
    assert v.capacity is not None and v.capacity.speedup == pytest.approx(0.5)
    assert not v.capacity_floor  # held by its cap: a known peak, though offered less
    assert v.verdict.startswith(
        "capacity 0.5x: 1000 against 2000 tok/s; capped at 48 running requests; the "
        "candidate's peak at concurrency 64 with 48 in flight, the baseline's at 128 — "
        "speculation pays at concurrency 1: 1.17x; "
    ), v.verdict
    assert "capped at 48 running requests;" not in v.verdict.split(" — ")[1]
    # It wins at concurrency 1, but switched on the host serves half at its peak: no migration.
    assert v.capacity_lower and not v.pays
    assert _why_pays(v) == "no: capacity 0.5x of the baseline's, though it wins at concurrency 1"


def test_a_higher_capacity_qualifies_the_verdict_and_never_leads_it(tmp_path: Path) -> None:
    """The candidate's peak above the baseline's, at another concurrency: said among the
    details, since a peak at another load is no evidence that speculation pays; the level
    comparison stays the head. Where a compared level pairs the two peaks, it says it."""
    b = _result({"levels": [_lv(1, 100, 99, 101), _lv(4, 380, 375, 385), _lv(8, 360, 355, 365)]})
    c = _result({"levels": [_lv(1, 90, 89, 91), _lv(4, 300, 295, 305), _lv(8, 420, 415, 425)]})
    v = compare("c", c, b)
    assert v.capacity is not None and v.capacity.speedup == pytest.approx(420 / 380)
    assert not v.capacity_lower
    assert v.verdict == (
        "loses at concurrency 1 (0.9x, 0.88-0.92) and 4 (0.79x, 0.77-0.81), wins at 8 (1.17x, "
        "1.14-1.20); capacity 1.11x (1.08-1.13): 420 against 380 tok/s; the candidate's peak "
        "at concurrency 8, the baseline's at 4"
    )
    assert str(v.capacity_text()).startswith(
        "capacity 1.11x (1.08-1.13): peak 420 tok/s at concurrency 8 against the baseline's "
        "380 tok/s at concurrency 4; the candidate peaked at the highest concurrency measured"
    )
    f = _recorded(v, tmp_path)
    assert f["c.capacity"].value == 1.105 and f["c.capacity_concurrency"].value == 8
    assert "c.capacity_cap" not in f  # nothing held it
    same = compare(
        "c",
        _result({"levels": [_lv(1, 150, 148, 152)]}),
        _result({"levels": [_lv(1, 100, 99, 101)]}),
    )
    assert same.verdict == "speculation pays at concurrency 1: 1.5x (1.47-1.54)"


def test_capacity_short_of_the_baseline_s_load_is_a_lower_bound_or_absent_with_why(
    tmp_path: Path,
) -> None:
    """A candidate offered less than the baseline's peak, not held by a cap: its own peak may
    lie beyond, so its capacity is 'at least', and below 1 no part of the verdict. A side with
    no level has none, and the report and the verdict's note say why."""
    b = _result({"levels": [_lv(1, 100, 99, 101), _lv(4, 380, 375, 385), _lv(8, 360, 355, 365)]})
    v = compare("c", _result({"levels": [_lv(1, 90, 89, 91)]}), b)
    assert v.capacity is not None and v.capacity_floor and not v.capacity_lower
    assert v.verdict == "loses at concurrency 1: 0.9x (0.88-0.92)"
    assert str(v.capacity_text()).startswith("capacity at least 0.24x (0.23-0.24): peak 90")
    above = compare("c", _result({"levels": [_lv(1, 450, 445, 455)]}), b)
    assert above.verdict == (  # a lower bound above 1 is a higher capacity: said, not as head
        "speculation pays at concurrency 1: 4.5x (4.41-4.60); capacity at least 1.18x "
        "(1.16-1.21): 450 against 380 tok/s; the candidate's peak at concurrency 1, the "
        "baseline's at 4"
    )
    base = _result(SGLANG_BASE)
    custom = compare("custom", _result(CUSTOM), base)
    assert custom.capacity is None and custom.no_capacity == "the candidate ran no level"
    md = render("an", base, [custom])
    assert "| not measured: the candidate ran no level |" in md
    assert "- **Capacity.** None: the candidate ran no level." in md
    f = _recorded(custom, tmp_path)
    assert "custom.capacity" not in f
    assert str(f["custom.verdict"].note).endswith("no capacity: the candidate ran no level")
    other = _result({**SGLANG_BASE, "benchmark": {"output_tokens": 48}})
    differ = compare("d", _result({**EAGLE3_CAPPED, "benchmark": {"output_tokens": 128}}), other)
    assert differ.capacity is None
    assert differ.no_capacity == "the two measured different work (output_tokens 48 vs 128)"


def test_a_draft_as_costly_as_the_target_winning_at_concurrency_1_is_flagged() -> None:
    """The noisy draft is the target plus noise: k=3 drafts at one target step each and a
    verify cost at least 4 decode steps, so with tau 1.89 it is at most 1.89/4 = 0.47x. A
    measured 1.41x is a measurement problem, never a win, and does not pay."""
    base = _result({"levels": [_lv(1, 861, 850, 870)], "server": {"engine": "vllm"}})
    spec = {"draft_tokens": 3, "accept_length": 1.89}
    cand = _result({"levels": [_lv(1, 1214, 1200, 1230)], "spec": spec})
    v = compare("noisy", cand, base, draft_cost=1)
    assert v.verdict.startswith(
        "MEASUREMENT PROBLEM: speed-up 1.41x at concurrency 1 exceeds its ceiling tau / (k * "
        "draft_cost + 1) = 0.47 (tau = 1.89, k = 3, each draft 1 target steps) — "
    ), v.verdict
    assert not v.pays
    # At its ceiling it is no problem: a loss, as physics says.
    at_ceiling = _result({"levels": [_lv(1, 400, 395, 405)], "spec": spec})
    v = compare("noisy", at_ceiling, base, draft_cost=1)
    assert not v.problems and v.verdict.startswith(
        "capacity 0.46x (0.45-0.48): 400 against 861 tok/s; the baseline's peak at concurrency "
        "1 — loses at concurrency 1: 0.46x"
    )
    # Free drafts (draft_cost 0, the default): the ceiling is tau, 1.41x stands.
    assert not compare("noisy", cand, base).problems


def test_field_report_sglang_verdicts() -> None:
    """AQ-MedAI: capped at 48, no baseline level with 48 in flight, so no speed-up computed,
    its capacity (peak against peak) leads; 21.7% strict; custom: its 25% is tau = 1."""
    base = _result(SGLANG_BASE)
    aq = compare("aq_medai", _result(AQ_MEDAI), base)
    assert aq.verdict == (
        f"{FIELD_CAPACITY} — not compared: no baseline level at equal concurrency (candidate: "
        "concurrency 128 with 48 in flight)"
    )
    assert not aq.pays and aq.peak is None
    assert aq.capped and aq.points[0].concurrency == 48 and aq.points[0].inferred
    note = aq.cap_note or ""
    assert "max_running_requests=48 (baseline: 2048)" in note
    assert "--max-running-requests 128" in note
    assert "per request 17.7 tok/s with 48 in flight vs 18.5" in note
    assert "the baseline would be at least that fast" in note
    assert aq.acceptance is not None and aq.acceptance.k == 3
    assert aq.acceptance.strict == pytest.approx(0.2167, abs=1e-4)
    assert not any("INCONSISTENT" in n for n in aq.notes)
    custom = compare("custom", _result(CUSTOM), base)
    assert custom.verdict == "no speed-up: tau=1.00, no draft accepted"
    assert custom.acceptance is not None and custom.acceptance.alpha == pytest.approx(0, abs=1e-9)


def test_misread_k_shows_as_inconsistent() -> None:
    """Taking '4 proposed' as k=4 drafts makes SGLang's 42% disagree with tau=1.65."""
    spec = {
        "draft_tokens": 4,
        "accept_length": 1.65,
        "acceptance": 0.42,
        "acceptance_definition": "sglang_legacy",
    }
    v = compare("x", _result({**AQ_MEDAI, "spec": spec}), _result(SGLANG_BASE))
    assert any("INCONSISTENT with accept length 1.65" in n for n in v.notes)


def test_different_engines_are_flagged() -> None:
    """Engines differ: a note (their clients' defaults differ), the comparison itself stands."""
    base = _result({**VLLM_BASE, "benchmark": {"dataset": "random", "temperature": 0.0}})
    cand = _result({**AQ_MEDAI, "benchmark": {"dataset": "random", "temperature": 0.0}})
    notes = " ".join(compare("x", cand, base).notes)
    assert "engines differ (vllm vs sglang)" in notes


# --- files ---------------------------------------------------------------------------------------


def test_v1_file_reads_and_unknown_schema_is_refused(tmp_path: Path) -> None:
    """An orch.bench/v1 file still reads, its levels measured once; v3 is refused, named."""
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({"schema": "orch.bench/v1", **SGLANG_BASE}))
    base = load_result(str(v1), "baseline")
    assert base.origin == f"{v1} (orch.bench/v1)"
    v = compare("c", _result({"levels": [_lv(1, 90, 88, 92)]}), base)
    assert v.matches[0].base.once and not v.matches[0].cand.once
    assert v.verdict == (  # measured at 1 only: its capacity a lower bound, below 1, not said
        "speculation pays at concurrency 1: 1.42x (1.38-1.45); measured once: no spread known"
    )
    assert (
        f"- **baseline** (SGLang base, no speculation): run not recorded; {v1} "
        "(orch.bench/v1)" in render("an", base, [v])
    )
    v3 = tmp_path / "v3.json"
    v3.write_text(json.dumps({"schema": "orch.bench/v3", **SGLANG_BASE}))
    with pytest.raises(
        TaskError,
        match=r"v3.json is 'orch.bench/v3'; this orch reads "
        r"orch.bench/v1 and orch.bench/v2",
    ):
        load_result(str(v3), "baseline")


# --- through the real CLI ----------------------------------------------------------------------


def _findings(doc: dict[str, Any], task: str) -> dict[str, Any]:
    t = next(t for t in doc["tasks"] if t["id"] == task)
    return {f["key"]: f for f in t["findings"]}


AQ_VERDICT = (
    f"{FIELD_CAPACITY} — not compared: no baseline level at equal concurrency (candidate: "
    "concurrency 128 with 48 in flight)"
)


def test_field_reports_through_orch(pdir: PlanDir) -> None:
    """A plan fed the field reports: findings on one definition, the cap, verdicts, Markdown;
    no speed-up across concurrencies (the AQ-MedAI run's 48 in flight has no baseline level),
    its capacity peak against peak, and the baseline's peak once."""
    params_sglang = {
        "baseline": SGLANG_BASE,
        "candidates": {"aq_medai": AQ_MEDAI, "custom": CUSTOM},
    }
    params_vllm = {"baseline": VLLM_BASE, "candidates": {"vllm_eagle3": VLLM_SPEC}}
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: analyze
            kind: analyze.compare
            params: {json.dumps(params_sglang)}
          - id: analyze_vllm
            kind: analyze.compare
            params: {json.dumps(params_vllm)}
          - id: custom_drafter
            kind: shell
            needs: [analyze]
            when: "${{tasks.analyze.findings.aq_medai.pays}}"
            params: {{command: "true"}}
    """)
    r = run_orch("run", plan, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    f = _findings(doc, "analyze")
    assert f["aq_medai.verdict"]["value"] == AQ_VERDICT
    assert f["aq_medai.pays"]["value"] is False
    assert f["aq_medai.capped"]["value"] is True
    assert "max_running_requests=48 (baseline: 2048)" in f["aq_medai.capped"]["note"]
    assert not [k for k in f if re.fullmatch(r"aq_medai\.(speedup_c\d+|speedup_peak|wins_at)", k)]
    assert f["aq_medai.accept_length"]["value"] == 1.65
    assert f["aq_medai.draft_tokens"]["value"] == 3
    assert f["aq_medai.acceptance"]["value"] == pytest.approx(0.2167, abs=1e-4)
    assert f["aq_medai.alpha"]["value"] == pytest.approx(0.411, abs=5e-4)
    assert f["aq_medai.acceptance_reported"]["value"] == pytest.approx(0.42)
    assert "22.7% accepted/proposed" in f["aq_medai.acceptance_reported"]["note"]
    assert f["aq_medai.break_even_step_ms"]["value"] == pytest.approx(25.94, abs=0.01)
    assert f["aq_medai.capacity"]["value"] == 0.358
    assert (f["aq_medai.capacity_concurrency"]["value"], f["aq_medai.capacity_cap"]["value"]) == (
        128,
        48,
    )
    # The baseline's peak, once per task: the other side of every candidate's capacity.
    assert f["baseline_capacity_tok_s"]["value"] == 2370
    assert f["baseline_capacity_concurrency"]["value"] == 128
    assert "baseline_capacity_cap" not in f  # 128 asked, 2048 admitted: nothing held it
    assert f["custom.verdict"]["value"] == "no speed-up: tau=1.00, no draft accepted"
    assert f["custom.acceptance"]["value"] == 0
    g = _findings(doc, "analyze_vllm")
    assert g["vllm_eagle3.acceptance"]["value"] == pytest.approx(0.15)  # same definition
    assert g["vllm_eagle3.alpha"]["value"] == pytest.approx(0.32, abs=0.005)
    assert g["vllm_eagle3.verdict"]["value"] == (
        "capacity 0.66x: 1014 against 1536 tok/s; the baseline's peak at concurrency 128 — "
        "loses at concurrency 128: 0.66x; measured once: no spread known"
    )
    assert g["vllm_eagle3.loses_at"]["value"] == "128"
    assert g["vllm_eagle3.wins_at"]["value"] == ""
    assert g["vllm_eagle3.speedup_c128"]["value"] == pytest.approx(0.66)
    assert g["vllm_eagle3.speedup_peak"]["value"] == pytest.approx(0.66)  # both at 128
    assert {t["id"]: t["status"] for t in doc["tasks"]}["custom_drafter"] == "skipped"

    report = Path(f["report"]["value"])
    assert report.name == "analyze.md" and report.parent == pdir.root / ".orch" / "t.runs" / "1"
    md = report.read_text()
    assert (
        f"| aq_medai | {AQ_VERDICT} | not measured | not measured | 0.36x: 849 tok/s at 128 "
        "with 48 in flight (capped at 48) vs 2370 at 128 | yes, 48 | 1.65 (3) "
        "| 21.7% | 0.411 | 42% (sglang_legacy) |"
    ) in md
    assert "| custom | no speed-up: tau=1.00, no draft accepted |" in md
    assert "| 128 | 48* | 849, once | no level with 48 in flight | – | not compared | – |" in md
    assert "| 128 | 128 | not measured | 2370, once (peak) | – | not measured | – |" in md
    assert "must take < tau * T_dec = 25.9 ms" in md
    assert "1.43x at a draft/target cost ratio of 0.05, 1.27x at 0.1, 1.03x at 0.2" in md
    assert "the baseline would be at least that fast" in md
    assert "c=" not in md  # one name per quantity: concurrency, in flight, cost ratio
    assert "| vllm_eagle3 |" in Path(g["report"]["value"]).read_text()
    board = run_orch("status", plan)
    assert "aq_medai.verdict=capacity 0.36x: 849 against" in board.stdout  # its start shows
    assert "| aq_medai |" in run_orch("logs", plan, "analyze").stdout


def test_results_read_from_json_files(pdir: PlanDir) -> None:
    """Results given as orch.bench/v1 and v2 files; a file of another schema fails the task,
    named."""
    base = {
        "schema": "orch.bench/v1",
        "raw": {"tool output": "ignored"},
        "levels": [
            {"concurrency": 1, "achieved_concurrency": 1.0, "output_tok_s": 63.6, "tpot_ms": 15.5},
            {"concurrency": 32, "achieved_concurrency": 31.2, "output_tok_s": 1200.0},
        ],
    }
    cand = {
        "schema": "orch.bench/v1",
        "levels": [
            {"concurrency": 1, "achieved_concurrency": 1.0, "output_tok_s": 89.0},
            {"concurrency": 32, "achieved_concurrency": 30.8, "output_tok_s": 1000.0},
        ],
        "server": {"engine": "sglang", "max_running_requests": 48},
        "spec": {"draft_tokens": 3, "accept_length": 2.4},
    }
    v2 = {
        **cand,
        "schema": "orch.bench/v2",
        "source": {"run": 2, "task": "bench_aq"},
        "levels": [_lv(1, 89.0, 87.0, 91.0), _lv(32, 1000.0, 990.0, 1010.0)],
    }
    (pdir.root / "base.json").write_text(json.dumps(base))
    (pdir.root / "cand.json").write_text(json.dumps(cand))
    (pdir.root / "v2.json").write_text(json.dumps(v2))
    (pdir.root / "v3.json").write_text(json.dumps({**cand, "schema": "orch.bench/v3"}))
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: "tasks.analysis.compare:AnalyzeCompare"
            params: {{baseline: {pdir.root}/base.json, candidates: {{eagle: cand.json}}}}
          - id: b
            kind: "tasks.analysis.compare:AnalyzeCompare"
            params: {{baseline: base.json, candidates: {{eagle: v2.json}}}}
          - id: c
            kind: "tasks.analysis.compare:AnalyzeCompare"
            params: {{baseline: base.json, candidates: {{eagle: v3.json}}}}
    """)
    r = run_orch("run", plan, "--json", "--keep-going", cwd=pdir.root)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    f = _findings(doc, "a")
    assert f["eagle.verdict"]["value"] == (
        "capacity 0.83x: 1000 against 1200 tok/s; the baseline's peak at concurrency 32 — "
        "wins at concurrency 1 (1.4x), loses at 32 (0.83x); measured once: no spread known"
    )
    assert f["eagle.speedup_c1"]["value"] == pytest.approx(1.399, abs=1e-3)
    assert f["eagle.loses_at"]["value"] == "32" and f["eagle.pays"]["value"] is False
    assert f["eagle.capped"]["value"] is False
    g = _findings(doc, "b")
    assert g["eagle.speedup_c1"]["note"] == (
        "1.37-1.43, 3 windows vs measured once: win; 89 vs 63.6 tok/s"
    )
    c = next(t for t in doc["tasks"] if t["id"] == "c")
    assert c["status"] == "failed"
    assert (
        "candidate eagle: v3.json is 'orch.bench/v3'; this orch reads orch.bench/v1 and "
        "orch.bench/v2"
    ) in c["last_error"]


def test_plan_errors_name_the_line(pdir: PlanDir) -> None:
    """An SGLang rate without its definition is a plan error at its line; nothing runs."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: analyze.compare
            params:
              baseline: {levels: [{concurrency: 1, output_tok_s: 63.6}]}
              candidates:
                aq:
                  server: {engine: sglang}
                  spec: {num_draft_tokens: 4, acceptance: 0.42}
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2
    assert "plan.yaml:9:" in r.stderr and "acceptance_definition is needed" in r.stderr


def test_a_figure_no_definition_allows_is_a_plan_error_when_written_in_the_plan(
    pdir: PlanDir,
) -> None:
    """Acceptance 42 with k = 3, written in the plan: a plan error at its line (exit 2, no
    traceback), by validate and by run, before anything runs. The same figure measured (a
    result file) stays a MEASUREMENT PROBLEM, and that verdict does not say it pays."""
    figures = {
        "server": {"engine": "vllm"},
        "levels": [{"concurrency": 1, "output_tok_s": 90}],
        "spec": {"draft_tokens": 3, "acceptance": 42},
    }
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: analyze.compare
            params:
              baseline: {{levels: [{{concurrency: 1, output_tok_s: 63.6}}]}}
              candidates:
                aq: {json.dumps(figures)}
    """)
    for command in ("validate", "run"):
        r = run_orch(command, plan)
        assert r.returncode == 2, r.stderr
        assert "plan.yaml:9:" in r.stderr and "acceptance 4200.0% is outside" in r.stderr
        assert "no definition allows this figure" in r.stderr and "Traceback" not in r.stderr
    (pdir.root / "measured.json").write_text(json.dumps(figures))
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: analyze.compare
            params:
              baseline: {levels: [{concurrency: 1, output_tok_s: 63.6}]}
              candidates: {aq: measured.json}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    found = findings(plan, "a")
    assert str(found["aq.verdict"]).startswith("MEASUREMENT PROBLEM: acceptance 4200.0%")
    assert found["aq.pays"] is False


def test_bench_serve_results_are_read_as_written(pdir: PlanDir) -> None:
    """What bench.serve writes (orch.bench/v2, against the stub server) is what analyze.compare
    reads: no refused key, medians with intervals, provenance from the run."""
    extra = (
        "".join(
            f"""
      - id: {name}
        kind: bench.serve
        needs: [launch]
        params: {{server: launch, concurrency: [1, 2], requests: 2, warmup: 1, output_tokens: 4,
                 input_words: 6, min_windows: 2, max_windows: 2, stability: 0.9, label: {name}}}
    """
            for name in ("base", "cand")
        )
        + """
      - id: analyze
        kind: analyze.compare
        needs: [base, cand]
        params:
          baseline: ${tasks.base.findings.result}
          candidates:
            cand: ${tasks.cand.findings.result}
    """
    )
    plan = pdir.write(stub_plan(free_port(), extra=extra))
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    f = findings(plan, "analyze")
    assert f["cand.even_at"] or f["cand.wins_at"] or f["cand.loses_at"]
    note = str(run_orch("status", plan, "--json").stdout)
    assert "windows vs" in note  # speedup_cN notes: 'lo-hi, n windows vs n windows: ...'
    md = Path(str(f["report"])).read_text()
    assert "- **baseline** (base): run #1, task base, at " in md
    assert "- **cand** (cand): run #1, task cand, at " in md


def test_another_engine_without_speculation_is_faster_not_paid_and_its_hosts_are_named() -> None:
    """analyze_engines in plans/rehearsal_sglang.yaml: vLLM against SGLang, same model."""
    host = {"cpu": "AMD EPYC", "cpus": 2, "gpus": "none seen"}
    base = _result(
        {
            "server": {"engine": "vllm"},
            "host": host,
            "levels": [_lv(1, 300, 297, 303), _lv(4, 1000, 990, 1010)],
        }
    )
    sglang = {
        "server": {"engine": "sglang"},
        "host": {**host, "cpu": "Intel Xeon"},
        "levels": [_lv(1, 750, 740, 760), _lv(4, 2400, 2380, 2420)],
    }
    v = compare("sglang", _result(sglang), base)
    assert v.verdict.startswith("faster at every concurrency measured (1, 4): 2.4-2.5x")
    assert "measured on different hosts (cpu 'AMD EPYC' vs 'Intel Xeon')" in v.notes
    assert "# a: the engines against the baseline" in render("a", base, [v])
    speculative = {**sglang, "spec": {"draft_tokens": 3, "accept_length": 3.5}}
    assert compare("eagle", _result(speculative), base).verdict.startswith("speculation pays")
