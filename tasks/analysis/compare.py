"""`analyze.compare`: does speculative decoding pay? Candidate runs against a baseline run.

Each run is a benchmark result of one server configuration: output throughput per concurrency
level, what the server resolved, and for speculative runs the acceptance figures. A result is
given inline in the plan or as the path of a JSON file (relative to orch's working directory; a
`${tasks.ID.findings.KEY}` works too), the file `bench.serve` writes. Its schema,
`orch.bench/v2` (`orch.bench/v1` files still read: a v1 level is a point measured once; inline
results take the same keys, less `schema`):

    {
      "schema": "orch.bench/v2",             # optional; v1 or v2, another value is refused
      "label": "SGLang base, Kimi-K2.5 TP8", # optional, for the report
      "source": {"run": 5, "task": "bench_base",          # optional: where it was measured
                 "at": "2026-11-30T18:32:00+00:00"},
      "levels": [                            # one per requested concurrency (may be [] for a
        {"concurrency": 8,                   #   candidate known only by its acceptance)
         "achieved_concurrency": 7.9,        # optional: requests in flight, measured
         "output_tok_s": 410.0,              # output tokens per second, all requests
         "tpot_ms": 19.1, "ttft_ms": 210.0,  # optional
         "windows": 5,                       # optional (v2): measurement windows kept; the
                                             #   figures above are their MEDIANS
         "stable": true,                     # the last windows agreed within the threshold
         "spread": 0.021,                    # max relative deviation of the windows' tok/s
         "interval": {"output_tok_s": [401.0, 417.0], "tpot_ms": [18.8, 19.5],
                      "ttft_ms": [190.0, 240.0], "achieved_concurrency": [7.8, 8.0]},
                                             # [min, max] over the kept windows: covers the
                                             #   median with probability 1 - 2^(1-n)
         "per_window": [{"output_tok_s": 410.0, "tpot_ms": 19.1, "ttft_ms": 205.0,
                         "achieved_concurrency": 7.9, "duration_s": 12.0,
                         "client": {"busy": 0.12, "late": 0.01, "lag_p50_ms": 0.1,
                                    "lag_p99_ms": 1.8, "lag_max_ms": 4.0}}],
                                             # client (optional): the load generator's own
                                             #   event loop: CPU share, share of the window it
                                             #   was behind, how late it woke
         "rejected": ["window 1: warm-up transient, 31% below the rest"]},
        {"concurrency": 128, "achieved_concurrency": 48.0, "output_tok_s": 849.0}
      ],
      "server": {"engine": "sglang",         # optional: sglang | vllm
                 "version": "0.5.23",        # optional
                 "max_running_requests": 48, # optional: what the server resolved at startup
                 "settings": {"max_model_len": 512, "speculative_num_steps": 3}},
                                             # optional, free-form: what else it resolved
      "spec": {                              # optional: only for speculative runs
        "algorithm": "EAGLE3", "drafter": "AQ-MedAI/Kimi-K25-eagle3",   # optional labels
        "draft_tokens": 3,                   # k: drafts proposed per verify step
        "num_draft_tokens": 4,               # or SGLang's flag (chain drafting: k + 1)
        "accept_length": 1.65,               # tau: tokens per verify step, bonus included
        "acceptance": 0.42,                  # or "42%": the engine's own figure ...
        "acceptance_definition": "sglang_legacy"   # ... and its definition (see below)
      },
      "benchmark": {"tool": "orch bench.serve", "dataset": "sharegpt", "output_tokens": 256,
                    "temperature": 0.0}      # optional, flat scalars; compared key by key
    }

Unknown keys inside `levels`, `server`, `spec`, `source` are an error (a typo must not vanish);
unknown top-level keys of a file (the tool's raw output, say) are ignored.

Refused or flagged. A result that cannot be read one way only is refused with the key named: an
acceptance figure without k, an SGLang figure without its definition, num_draft_tokens other than
k+1 (tree drafting, which the chain-drafting math below does not model), an interval with its low
end above its high end. A well-formed figure that physics or its definition forbids is a
measurement, so it is kept and the verdict starts with `MEASUREMENT PROBLEM:`: tau outside
[1, k+1], an acceptance outside its definition's range (bench.serve writes what the engine's
counters say), a speed-up above tau (a speculative step cheaper than one decode step), a
speculative step costing more than k+1 decode steps, a median outside its own interval.

Acceptance definitions: `strict` is accepted drafts / proposed drafts (vLLM; SGLang since PR
#23530), = (tau - 1) / k; `sglang_legacy` is SGLang's log line and gauge before PR #23530,
accept length / num_draft_tokens, = tau / (k + 1). vLLM figures default to `strict`; an SGLang
figure must say which, since the same log line changed meaning. Every figure is put on the
strict definition and on the per-token alpha of the math below (tau_from_alpha).

Names: "concurrency N" is the requested concurrency (the client's limit); "N in flight" the
achieved one (measured mean requests in flight); the draft model's cost per step relative to a
target step is the "draft/target cost ratio".

Capacity: the candidate's peak (its highest throughput over every level it ran, compared or
not, capped or not) against the baseline's, wherever each peaked; absent only where a side ran
no level or the two measured different work (the report says which). A level the server's cap
held (max_running_requests below the concurrency requested) is a known peak however few ran;
a candidate that peaked at its highest level, asked for less than the baseline's peak and its
own cap, may serve more beyond: its capacity is "at least".

The verdict, one line: `MEASUREMENT PROBLEM: ... — ` first where there is one; then a known
capacity below the baseline's, what decides a migration first (`capacity 0.36x: 849 against
2370 tok/s; capped at 48 running requests; the baseline's peak at concurrency 128 — `); then
the levels compared and what qualifies them, a higher capacity among those (a peak at another
load is no evidence that speculation pays).

Findings, per candidate NAME: NAME.verdict, NAME.pays, NAME.wins_at, NAME.even_at,
NAME.loses_at, NAME.speedup_cN (one per compared level, N its requested concurrency),
NAME.speedup_peak (at the baseline's peak, when compared there), NAME.capacity (the ratio),
NAME.capacity_tok_s, NAME.capacity_concurrency (requested) and NAME.capacity_cap (where the cap
held it) of the candidate's peak, NAME.capped, NAME.accept_length, NAME.draft_tokens,
NAME.acceptance, NAME.alpha, NAME.acceptance_reported, NAME.break_even_step_ms,
NAME.speedup_ceiling (each only where the data allows); then the baseline's peak, once:
baseline_capacity_tok_s, baseline_capacity_concurrency, baseline_capacity_cap; then `report`:
the Markdown report, `<task id>.md` in the run's folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import Context, Finding, Task, TaskError
from orchestrator.core.safeopen import write_atomically
from orchestrator.kinds.sections import Section
from tasks.analysis.judging import compare, workload_differences
from tasks.analysis.models import SCHEMA, CompareParams, Result, load_result
from tasks.analysis.render import record, record_peak, render


class AnalyzeCompare(Task[CompareParams]):
    """Compare candidate benchmark runs with a baseline: speed-ups, the cap, acceptance, verdict."""

    Params = CompareParams
    path_params = frozenset({"baseline", "candidates"})  # result files it reads

    def run(self, ctx: Context) -> None:
        p = self.params
        base = load_result(p.baseline, "baseline")
        if not base.levels:
            raise TaskError("baseline: no levels, nothing to compare against")
        again = None
        if p.baseline_again is not None:
            again = load_result(p.baseline_again, "baseline_again")
            if differ := workload_differences(base, again):
                raise TaskError(
                    "baseline_again measured other work than baseline: " + ", ".join(differ)
                )
        verdicts = [
            compare(
                name,
                load_result(src, f"candidate {name}"),
                base,
                p.noise,
                p.match_tolerance,
                p.max_draft_cost,
                again,
                p.draft_cost,
            )
            for name, src in p.candidates.items()
        ]
        # absolute(), not resolve(): a link at the name is refused (write_atomically), not followed
        report = (ctx.log_path.parent / f"{ctx.task_id}.md").absolute()
        text = render(ctx.task_id, base, verdicts, again)
        report.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(report, text)
        ctx.log(text)  # `orch logs ID` shows the report too
        for v in verdicts:
            record(ctx, v)
        if (peak := verdicts[0].base_peak) is not None:  # one baseline: its peak once
            record_peak(ctx, "baseline_capacity", verdicts[0], peak)
        ctx.finding("report", str(report), note=f"{len(verdicts)} candidate(s)")
        inputs = report.with_suffix(".inputs.json")  # what `orch report` draws the curves from
        write_atomically(
            inputs,
            json.dumps(
                {
                    "baseline": _document(p.baseline),
                    "candidates": {name: _document(src) for name, src in p.candidates.items()},
                    **(
                        {"baseline_again": _document(p.baseline_again)}
                        if p.baseline_again is not None
                        else {}
                    ),
                }
            ),
        )
        ctx.finding("inputs", str(inputs), note="the compared results, for orch report")

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        """Baseline and candidates on the same charts, then the analysis as written."""
        from tasks.analysis.plots import bench_figures

        notes, figures, text = [], [], ""
        if (found := findings.get("inputs")) is not None:
            try:
                inputs = json.loads(Path(str(found.value)).read_text())
                series = [
                    (
                        f"baseline: {inputs['baseline'].get('label') or 'baseline'}",
                        inputs["baseline"],
                    )
                ]
                if "baseline_again" in inputs:
                    series.append(("baseline, launched again", inputs["baseline_again"]))
                series += [(name, doc) for name, doc in inputs["candidates"].items()]
                figures = bench_figures("compare", series)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                notes.append(f"{found.value}: cannot be drawn ({exc})")
        if (md := findings.get("report")) is not None:
            try:
                text = Path(str(md.value)).read_text()
            except OSError as exc:
                notes.append(f"{md.value}: cannot be read ({exc.strerror})")
        # The answers the page opens with: each candidate's verdict, capacity first when lower.
        verdicts = tuple(
            f"{key.removesuffix('.verdict')}: {f.value}"
            for key, f in findings.items()
            if key.endswith(".verdict")
        )
        return (
            Section(
                "Analysis: baseline and candidates", figures, text, tuple(notes), headline=verdicts
            ),
        )


def _document(source: Result | str) -> dict[str, Any]:
    """The orch.bench document as written (a file's JSON, or an inline result's fields)."""
    if isinstance(source, Result):
        return {"schema": SCHEMA, **source.model_dump(mode="json", exclude_none=True)}
    data = json.loads(Path(source).read_text())  # load_result read it already: it is JSON
    return data if isinstance(data, dict) else {}
