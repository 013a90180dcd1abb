"""`analyze.compare`: section 4's math, the verdicts, and plans fed the field reports' figures.

Figures from shared/context/README.md: SGLang base 63.6 tok/s at c=1, 2370 tok/s peak at c=128;
AQ-MedAI EAGLE-3 drafter 849 tok/s peak, ~42% acceptance, accept length ~1.65 with 4 draft
tokens (steps 3, topk 1: k = 3 drafts), max_running_requests 48 in spec mode vs 2048 without;
custom drafter ~25%; vLLM base 82.5 / 1536 tok/s, vLLM + drafter ~15% and a 0.66x multiplier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tasks.analyze import (
    CompareParams,
    Result,
    alpha_from_tau,
    compare,
    modelled_speedup,
    render,
    strict_rate,
    tau_from_alpha,
    tau_from_rate,
)

from conftest import PlanDir, run_orch

SGLANG_BASE: dict[str, Any] = {
    "label": "SGLang base, no speculation",
    "levels": [{"concurrency": 1, "output_tok_s": 63.6},
               {"concurrency": 128, "output_tok_s": 2370}],
    "server": {"engine": "sglang", "max_running_requests": 2048},
}
AQ_MEDAI: dict[str, Any] = {
    "levels": [{"concurrency": 128, "output_tok_s": 849}],  # achieved not reported
    "server": {"engine": "sglang", "max_running_requests": 48},
    "spec": {"algorithm": "EAGLE3", "num_draft_tokens": 4, "accept_length": 1.65,
             "acceptance": "42%", "acceptance_definition": "sglang_legacy"},
}
CUSTOM: dict[str, Any] = {  # the report gives only its acceptance, from the same SGLang log
    "server": {"engine": "sglang", "max_running_requests": 48},
    "spec": {"num_draft_tokens": 4, "acceptance": 0.25, "acceptance_definition": "sglang_legacy"},
}
VLLM_BASE: dict[str, Any] = {
    "levels": [{"concurrency": 1, "output_tok_s": 82.5},
               {"concurrency": 128, "output_tok_s": 1536}],
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
    return [{"concurrency": c, "output_tok_s": t} for c, t in pairs]


# --- the math ----------------------------------------------------------------------------------

def test_alpha_inverts_the_expected_accept_length() -> None:
    """tau=1.65, k=3 gives alpha 0.411 (section 0.1); the inversion round-trips at the ends."""
    assert alpha_from_tau(1.65, 3) == pytest.approx(0.411, abs=5e-4)
    a = alpha_from_tau(1.65, 3)
    assert a + a**2 + a**3 == pytest.approx(0.65, abs=1e-9)
    assert alpha_from_tau(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert alpha_from_tau(4.0, 3) == pytest.approx(1.0, abs=1e-9)
    for alpha in (0.1, 0.5, 0.9):
        assert alpha_from_tau(tau_from_alpha(alpha, 4), 4) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ValueError, match="outside"):
        alpha_from_tau(4.5, 3)


def test_tau_table_of_section_4() -> None:
    """tau(alpha, k) reproduces section 4's table for alpha 0.6/0.7/0.8 and k = 1..4."""
    table = {0.6: (1.60, 1.96, 2.18, 2.31), 0.7: (1.70, 2.19, 2.53, 2.77),
             0.8: (1.80, 2.44, 2.95, 3.36)}
    for alpha, row in table.items():
        assert [round(tau_from_alpha(alpha, k), 2) for k in (1, 2, 3, 4)] == list(row)


def test_sglang_42_percent_and_vllm_15_percent_on_one_definition() -> None:
    """Section 0.1: SGLang's old 42% is tau/(k+1); strict it is ~22%, vs vLLM's 15% strict."""
    # the old SGLang log's 41% for tau=1.65 is tau/(k+1) = 1.65/4
    assert tau_from_rate(0.4125, 3, "sglang_legacy") == pytest.approx(1.65)
    assert strict_rate(1.65, 3) == pytest.approx(0.2167, abs=1e-4)
    tau = tau_from_rate(0.42, 3, "sglang_legacy")
    assert tau == pytest.approx(1.68)
    assert strict_rate(tau, 3) == pytest.approx(0.2267, abs=1e-4)
    # vLLM's 15% is already strict: tau = 1 + 0.15k (section 4)
    assert tau_from_rate(0.15, 3, "strict") == pytest.approx(1.45)
    assert alpha_from_tau(1.45, 3) == pytest.approx(0.32, abs=0.005)
    assert tau_from_rate(0.15, 4, "strict") == pytest.approx(1.60)
    assert alpha_from_tau(1.60, 4) == pytest.approx(0.38, abs=0.005)


def test_legacy_figure_below_its_floor_is_refused() -> None:
    """A legacy rate starts at 1/(k+1): 25% with k=3 is tau=1, 20% is impossible."""
    assert tau_from_rate(0.25, 3, "sglang_legacy") == 1.0
    with pytest.raises(ValueError, match="below the floor"):
        tau_from_rate(0.20, 3, "sglang_legacy")


def test_modelled_speedup_and_break_even_of_section_4() -> None:
    """S = tau/(k*c+1): 1.43x / 1.27x / 1.03x at c = 0.05 / 0.1 / 0.2; the 25.9 ms budget."""
    assert [round(modelled_speedup(1.65, 3, c), 2) for c in (0.05, 0.1, 0.2)] == [
        1.43, 1.27, 1.03]
    v = compare("aq", _result(AQ_MEDAI), _result(SGLANG_BASE))
    assert v.break_even is not None
    assert v.break_even.t_dec_ms == pytest.approx(15.72, abs=0.01)
    assert v.break_even.step_budget_ms == pytest.approx(25.94, abs=0.01)
    assert v.break_even.max_draft_cost == pytest.approx(0.2167, abs=1e-4)
    assert v.break_even.ceiling == 1.65


# --- params ------------------------------------------------------------------------------------

def test_params_refuse_ambiguous_or_impossible_acceptance() -> None:
    """An SGLang rate needs its definition; tau above k+1, tree drafting, 42 for 42% are refused."""
    def problem(spec: dict[str, Any], engine: str = "sglang") -> str:
        with pytest.raises(ValidationError) as exc:
            Result.model_validate({"server": {"engine": engine}, "spec": spec})
        return str(exc.value)

    assert "acceptance_definition is needed" in problem({"draft_tokens": 3, "acceptance": 0.42})
    assert "exceeds k+1" in problem({"draft_tokens": 3, "accept_length": 4.2})
    assert "tree" in problem({"draft_tokens": 3, "num_draft_tokens": 8})
    assert "needs draft_tokens" in problem({"accept_length": 1.65})
    assert "less than or equal to 1" in problem({"draft_tokens": 3, "acceptance": 42}, "vllm")
    vllm = Result.model_validate({"server": {"engine": "vllm"},
                                  "spec": {"draft_tokens": 3, "acceptance": "15%"}})
    assert vllm.spec is not None and vllm.spec.acceptance == pytest.approx(0.15)
    assert vllm.spec.acceptance_definition == "strict"
    with pytest.raises(ValidationError, match="pattern"):
        CompareParams.model_validate({"baseline": "b.json", "candidates": {"a b": "c.json"}})


# --- the verdicts ------------------------------------------------------------------------------

def test_verdict_pays_at_low_load_and_names_the_crossover() -> None:
    """1.4x at c=1 shrinking to 0.8x at c=128: 'speculation pays: 1.4x at c=1, loses above c=32'."""
    base = _result({"levels": _levels((1, 60), (8, 400), (32, 1200), (128, 2400))})
    cand = _result({"levels": _levels((1, 84), (8, 480), (32, 1260), (128, 1920)),
                    "spec": {"draft_tokens": 3, "accept_length": 2.2}})
    v = compare("eagle", cand, base)
    assert v.verdict == "speculation pays: 1.4x at c=1, loses above c=32"
    assert v.pays and v.loses_above == 32 and not v.capped
    assert v.c1 is not None and v.c1.speedup == pytest.approx(1.4)
    assert v.speedup_peak == pytest.approx(0.8)
    assert v.break_even is not None and v.break_even.measured == pytest.approx(1.4)
    assert "tau/S = 1.57 decode steps" in render("an", base, [v])


def test_levels_compare_at_equal_achieved_concurrency() -> None:
    """A candidate asked for 64 that ran 33 in flight is compared with the baseline's 32."""
    base = _result({"levels": [{"concurrency": 32, "achieved_concurrency": 31.5,
                                "output_tok_s": 1000},
                               {"concurrency": 64, "achieved_concurrency": 63.0,
                                "output_tok_s": 1800}]})
    cand = _result({"levels": [{"concurrency": 64, "achieved_concurrency": 33.0,
                                "output_tok_s": 1100}]})
    v = compare("c", cand, base)
    assert [(m.cand.level.concurrency, m.base.level.concurrency) for m in v.matches] == [(64, 32)]
    assert v.verdict.startswith("speculation pays: 1.1x at c=33")
    assert v.capped and "cause is unknown" in (v.cap_note or "")


def test_no_speed_up_when_even_within_noise() -> None:
    """Speed-ups within the noise band are no speed-up; the best one is named."""
    base = _result({"levels": _levels((1, 100), (16, 1000))})
    cand = _result({"levels": _levels((1, 102), (16, 990))})
    v = compare("c", cand, base)
    assert v.verdict == "no speed-up: at best 1.02x at c=1" and not v.pays


def test_peak_of_a_candidate_not_run_that_high_is_not_called_a_loss() -> None:
    """A candidate measured only at c=1 is not said to 'lose at peak' against c=128."""
    v = compare("c", _result({"levels": _levels((1, 90))}), _result(SGLANG_BASE))
    assert v.verdict == "speculation pays: 1.42x at c=1"
    assert v.speedup_peak is not None and not v.peak_comparable


def test_field_report_sglang_verdicts() -> None:
    """AQ-MedAI: capped at 48, loses at peak, 21.7% strict; custom: its 25% is tau = 1."""
    base = _result(SGLANG_BASE)
    aq = compare("aq_medai", _result(AQ_MEDAI), base)
    assert aq.verdict == "no speed-up: loses at peak (0.36x), capped at 48 running requests"
    assert aq.capped and aq.points[0].concurrency == 48 and aq.points[0].inferred
    note = aq.cap_note or ""
    assert "max_running_requests=48 (baseline: 2048)" in note
    assert "--max-running-requests 128" in note
    assert "per request 17.7 tok/s with 48 in flight vs 18.5" in note
    assert aq.acceptance is not None and aq.acceptance.k == 3
    assert aq.acceptance.strict == pytest.approx(0.2167, abs=1e-4)
    assert not any("INCONSISTENT" in n for n in aq.notes)
    custom = compare("custom", _result(CUSTOM), base)
    assert custom.verdict == "no speed-up: tau=1.00, no draft accepted"
    assert custom.acceptance is not None and custom.acceptance.alpha == pytest.approx(0, abs=1e-9)


def test_misread_k_shows_as_inconsistent() -> None:
    """Taking '4 proposed' as k=4 drafts makes SGLang's 42% disagree with tau=1.65."""
    spec = {"draft_tokens": 4, "accept_length": 1.65, "acceptance": 0.42,
            "acceptance_definition": "sglang_legacy"}
    v = compare("x", _result({**AQ_MEDAI, "spec": spec}), _result(SGLANG_BASE))
    assert any("INCONSISTENT with accept length 1.65" in n for n in v.notes)


def test_different_benchmarks_and_engines_are_flagged() -> None:
    """Differing benchmark keys and engines go into the verdict's notes (section 3.3)."""
    base = _result({**VLLM_BASE, "benchmark": {"dataset": "random", "temperature": 0.0}})
    cand = _result({**AQ_MEDAI, "benchmark": {"dataset": "sharegpt", "temperature": 0.0}})
    notes = " ".join(compare("x", cand, base).notes)
    assert "NOT the same benchmark (dataset: 'random' vs 'sharegpt')" in notes
    assert "engines differ (vllm vs sglang)" in notes and "temperature" not in notes.split(")")[0]


# --- through the real CLI ----------------------------------------------------------------------

def _findings(doc: dict[str, Any], task: str) -> dict[str, Any]:
    t = next(t for t in doc["tasks"] if t["id"] == task)
    return {f["key"]: f for f in t["findings"]}


def test_field_reports_through_orch(pdir: PlanDir) -> None:
    """A plan fed the field reports: findings on one definition, the cap, verdicts, Markdown."""
    params_sglang = {"baseline": SGLANG_BASE,
                     "candidates": {"aq_medai": AQ_MEDAI, "custom": CUSTOM}}
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
    assert f["aq_medai.verdict"]["value"] == (
        "no speed-up: loses at peak (0.36x), capped at 48 running requests")
    assert f["aq_medai.pays"]["value"] is False
    assert f["aq_medai.capped"]["value"] is True
    assert "max_running_requests=48 (baseline: 2048)" in f["aq_medai.capped"]["note"]
    assert f["aq_medai.speedup_peak"]["value"] == pytest.approx(0.358, abs=1e-3)
    assert "aq_medai.speedup_c1" not in f  # the report has no single-stream spec figure
    assert f["aq_medai.accept_length"]["value"] == 1.65
    assert f["aq_medai.draft_tokens"]["value"] == 3
    assert f["aq_medai.acceptance"]["value"] == pytest.approx(0.2167, abs=1e-4)
    assert f["aq_medai.alpha"]["value"] == pytest.approx(0.411, abs=5e-4)
    assert f["aq_medai.acceptance_reported"]["value"] == pytest.approx(0.42)
    assert "22.7% accepted/proposed" in f["aq_medai.acceptance_reported"]["note"]
    assert f["aq_medai.break_even_step_ms"]["value"] == pytest.approx(25.94, abs=0.01)
    assert f["custom.verdict"]["value"] == "no speed-up: tau=1.00, no draft accepted"
    assert f["custom.acceptance"]["value"] == 0
    g = _findings(doc, "analyze_vllm")
    assert g["vllm_eagle3.acceptance"]["value"] == pytest.approx(0.15)  # same definition
    assert g["vllm_eagle3.alpha"]["value"] == pytest.approx(0.32, abs=0.005)
    assert g["vllm_eagle3.verdict"]["value"] == "no speed-up: loses at peak (0.66x)"
    assert {t["id"]: t["status"] for t in doc["tasks"]}["custom_drafter"] == "skipped"

    report = Path(f["report"]["value"])
    assert report.name == "analyze.md" and report.parent == pdir.root / ".orch" / "t.runs" / "1"
    md = report.read_text()
    assert ("| aq_medai | no speed-up: loses at peak (0.36x), capped at 48 running requests | – "
            "| 0.36x | yes, 48 | 1.65 (3) | 21.7% | 0.411 | 42% (sglang_legacy) |") in md
    assert "| custom | no speed-up: tau=1.00, no draft accepted |" in md
    assert "| 128 | 48* | 849 | no level at this concurrency | – | 17.7 | – |" in md
    assert "must take < tau * T_dec = 25.9 ms" in md
    assert "1.43x at c=0.05, 1.27x at c=0.1, 1.03x at c=0.2" in md
    assert "the baseline would be at least that fast" in md
    assert "| vllm_eagle3 |" in Path(g["report"]["value"]).read_text()
    board = run_orch("status", plan)
    assert "aq_medai.verdict=no speed-up" in board.stdout
    assert "| aq_medai |" in run_orch("logs", "analyze", "--plan", plan).stdout


def test_results_read_from_json_files(pdir: PlanDir) -> None:
    """Results given as orch.bench/v1 files; a file of another schema fails the task, named."""
    base = {"schema": "orch.bench/v1", "raw": {"tool output": "ignored"},
            "levels": [{"concurrency": 1, "achieved_concurrency": 1.0, "output_tok_s": 63.6,
                        "tpot_ms": 15.5},
                       {"concurrency": 32, "achieved_concurrency": 31.2,
                        "output_tok_s": 1200.0}]}
    cand = {"schema": "orch.bench/v1",
            "levels": [{"concurrency": 1, "achieved_concurrency": 1.0, "output_tok_s": 89.0},
                       {"concurrency": 32, "achieved_concurrency": 30.8, "output_tok_s": 1000.0}],
            "server": {"engine": "sglang", "max_running_requests": 48},
            "spec": {"draft_tokens": 3, "accept_length": 2.4}}
    (pdir.root / "base.json").write_text(json.dumps(base))
    (pdir.root / "cand.json").write_text(json.dumps(cand))
    (pdir.root / "v2.json").write_text(json.dumps({**cand, "schema": "orch.bench/v2"}))
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: "tasks.analyze:AnalyzeCompare"
            params: {{baseline: {pdir.root}/base.json, candidates: {{eagle: cand.json}}}}
          - id: b
            kind: "tasks.analyze:AnalyzeCompare"
            params: {{baseline: base.json, candidates: {{eagle: v2.json}}}}
    """)
    r = run_orch("run", plan, "--json", "--keep-going", cwd=pdir.root)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    f = _findings(doc, "a")
    assert f["eagle.verdict"]["value"] == "speculation pays: 1.4x at c=1, loses above c=1"
    assert f["eagle.speedup_c1"]["value"] == pytest.approx(1.399, abs=1e-3)
    assert f["eagle.loses_above"]["value"] == 1
    assert f["eagle.capped"]["value"] is False
    b = next(t for t in doc["tasks"] if t["id"] == "b")
    assert b["status"] == "failed"
    assert "candidate eagle: v2.json is 'orch.bench/v2'; this orch reads orch.bench/v1" in (
        b["last_error"])


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
