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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from orchestrator import Context, Finding, Task, TaskError
from orchestrator.core.safeopen import write_atomically
from orchestrator.kinds.sections import Section

SCHEMA = "orch.bench/v2"  # what bench.serve writes
SCHEMAS = ("orch.bench/v1", SCHEMA)  # what this module reads
Definition = Literal["strict", "sglang_legacy"]
DEFINITIONS: dict[str, str] = {
    "strict": "accepted / proposed drafts = (tau-1)/k",
    "sglang_legacy": "accept length / num_draft_tokens = tau/(k+1), SGLang before PR #23530",
}
DRAFT_COSTS = (0.05, 0.1, 0.2)  # draft/target cost ratios the modelled speed-up is given for
PROBLEM = "MEASUREMENT PROBLEM"
# Benchmark keys that name things rather than set the workload, and keys that set how long or
# how often it is measured but not what is measured. Any other key (dataset, output_tokens,
# input_*, temperature, ignore_eos, api, seed, ...) shapes the workload: if it differs, the
# two results measure different work and no speed-up is computed.
NAMING_KEYS = frozenset({"tool", "label"})
MEASURING_KEYS = frozenset(
    {"requests", "warmup", "stability", "min_windows", "max_windows", "client_cpus"}
)


# --- the math: chain drafting, i.i.d. per-token acceptance (Leviathan et al.) ------------------


def tau_from_alpha(alpha: float, k: int) -> float:
    """Expected tokens per verify step, bonus included: (1 - a^(k+1)) / (1 - a)."""
    # Summed as 1 + a + ... + a^k: the closed form cancels badly as a -> 1.
    return sum(alpha**i for i in range(k + 1))


def alpha_from_tau(tau: float, k: int) -> float:
    """Per-token acceptance alpha (i.i.d.) with tau_from_alpha(alpha, k) = tau, by bisection."""
    if not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"accept length {tau:g} is outside [1, k+1] = [1, {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # tau_from_alpha rises monotonically on [0, 1]
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_from_alpha(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def strict_rate(tau: float, k: int) -> float:
    """The one definition: accepted / proposed drafts = (tau - 1) / k."""
    return (tau - 1.0) / k


def rate_floor(k: int, definition: Definition) -> float:
    """The figure a definition gives when no draft is accepted: 0 strict, 1/(k+1) legacy."""
    return 0.0 if definition == "strict" else 1.0 / (k + 1)


def _tau_of_rate(rate: float, k: int, definition: Definition) -> float:
    """strict: rate = (tau-1)/k. sglang_legacy: rate = (accepted + bs) / (bs * num_draft_tokens)
    = tau / num_draft_tokens, with num_draft_tokens = k+1 in chain drafting (topk 1)."""
    return 1.0 + rate * k if definition == "strict" else rate * (k + 1)


def tau_from_rate(rate: float, k: int, definition: Definition) -> float:
    """tau from an engine's acceptance figure; below the floor is an error."""
    tau = _tau_of_rate(rate, k, definition)
    if tau < 1.0 - 1e-9:  # legacy figures start at 1/(k+1): zero drafts accepted
        raise ValueError(
            f"{rate:g} is below the floor of {definition} for k={k}, "
            f"1/(k+1) = {1 / (k + 1):.3g}: check k and the definition"
        )
    return max(tau, 1.0)


def modelled_speedup(tau: float, k: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """S = tau / (k*r + v), Leviathan Thm 3.8, r the draft/target cost ratio and
    v = T_verify/T_dec."""
    return tau / (k * draft_cost + verify_cost)


# --- params --------------------------------------------------------------------------------------


def _ordered(pair: tuple[float, float]) -> tuple[float, float]:
    if pair[0] > pair[1]:
        raise ValueError(f"[{pair[0]:g}, {pair[1]:g}]: the low end is above the high end")
    return pair


NonNegative = Annotated[float, Field(ge=0)]
Bounds = Annotated[tuple[NonNegative, NonNegative], AfterValidator(_ordered)]


class Interval(BaseModel):
    """[min, max] over a level's kept measurement windows."""

    model_config = ConfigDict(extra="forbid")

    output_tok_s: Bounds | None = None
    tpot_ms: Bounds | None = None
    ttft_ms: Bounds | None = None
    achieved_concurrency: Bounds | None = None


class ClientFigures(BaseModel):
    """The load generator's own load over a window (a window where it was the bottleneck is
    refused, not kept: these are the kept windows' figures)."""

    model_config = ConfigDict(extra="forbid")

    busy: float
    late: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    # bench.serve spread over processes (client_processes): the figures above are the most
    # strained process's, `worst` its number (from 1), each one's in `per_process`.
    processes: int | None = Field(None, ge=2)
    worst: int | None = Field(None, ge=1)
    per_process: list[ClientFigures] | None = None
    pid: int | None = None  # one process's, in per_process


class Window(BaseModel):
    """One measurement window of a level, as bench.serve kept it."""

    model_config = ConfigDict(extra="forbid")

    output_tok_s: float | None = None
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    achieved_concurrency: float | None = None
    duration_s: float | None = None
    client: ClientFigures | None = None


class Level(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(ge=1, description="requested: the client's max concurrency")
    achieved_concurrency: float | None = Field(
        None, gt=0, description="measured requests in flight (v2: median over the windows)"
    )
    output_tok_s: float = Field(
        gt=0, description="output tokens per second, all requests (v2: median over the windows)"
    )
    tpot_ms: float | None = Field(None, gt=0)
    ttft_ms: float | None = Field(None, gt=0)
    # v2: the measurement windows behind the medians.
    windows: int | None = Field(None, ge=1, description="measurement windows kept")
    stable: bool | None = Field(None, description="the last windows agreed within the threshold")
    spread: float | None = Field(
        None, ge=0, description="max relative deviation of the kept windows' output_tok_s"
    )
    interval: Interval | None = None
    per_window: list[Window] | None = None
    rejected: list[str] | None = Field(None, description="windows thrown away, with the reason")
    # What bench.serve measures besides (not used by the comparison, kept with the result).
    request_s: float | None = None
    completed: int | None = None
    errors: int | None = None
    first_error: str | None = None
    unobserved: int | None = Field(
        None, description="answers whose tokens were not seen one by one"
    )
    timing_unobserved: int | None = Field(
        None, ge=0, description="windows kept for throughput only: their token timing not seen"
    )
    duration_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    ttft: dict[str, float] | None = None
    tpot: dict[str, float] | None = None
    itl: dict[str, float] | None = None
    e2e: dict[str, float] | None = None
    spec: dict[str, Any] | None = None
    spec_unused: dict[str, Any] | None = Field(
        None, description="the engine's counters over windows measured but not used"
    )
    above_cuda_graph_max_bs: int | None = Field(
        None, description="the server's CUDA-graph max decode batch, where this level is above it"
    )


class Server(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["sglang", "vllm"] | None = None
    version: str | None = None
    max_running_requests: int | None = Field(
        None, ge=1, description="as the server resolved it (SGLang: /server_info, startup log)"
    )
    settings: dict[str, Any] = Field(
        default_factory=dict, description="free-form: what else the server resolved"
    )


class Provenance(BaseModel):
    """Where a result was measured: orch's run and task, and when."""

    model_config = ConfigDict(extra="forbid")

    run: int | None = None
    task: str | None = None
    at: str | None = Field(None, description="ISO-8601")


def _fraction(value: object) -> object:
    """'42%' -> 0.42. A bare 42 is kept: out of range, it is flagged, not guessed at."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return float(value.strip()[:-1]) / 100
    return value


class Spec(BaseModel):
    """Speculative decoding settings and acceptance. Only what makes the figures unreadable is
    refused here; figures out of their range are measurements, flagged by `acceptance`."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str | None = None
    drafter: str | None = None
    draft_tokens: int | None = Field(
        None,
        ge=1,
        description="k: drafts proposed per verify step (SGLang speculative_num_steps"
        " with topk 1, vLLM num_speculative_tokens)",
    )
    num_draft_tokens: int | None = Field(
        None, ge=2, description="SGLang --speculative-num-draft-tokens (chain drafting: k + 1)"
    )
    accept_length: float | None = Field(
        None, description="tau: tokens per verify step, bonus token included"
    )
    acceptance: Annotated[float | None, BeforeValidator(_fraction)] = Field(
        None, description="the engine's own acceptance figure: 0.42 or '42%'"
    )
    acceptance_definition: Definition | None = None
    # The counts bench.serve derived them from (vLLM /metrics deltas, SGLang meta_info).
    alpha: float | None = None
    drafts: int | None = None
    proposed: int | None = None
    accepted: int | None = None
    verify_passes: int | None = None
    output_tokens: int | None = None
    correct_drafts: int | None = None
    proposed_drafts: int | None = None
    engine_accept_length: float | None = Field(
        None, description="SGLang's own: output tokens / verify passes (the first token too)"
    )
    engine_accept_rate: float | None = Field(
        None, description="SGLang's own: correct / proposed drafts"
    )
    source: str | None = Field(None, description="where the counts were read")

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        k, n = self.draft_tokens, self.num_draft_tokens
        if k is not None and n is not None and n != k + 1:
            raise ValueError(
                f"num_draft_tokens {n} is not draft_tokens + 1 = {k + 1}: tree "
                "drafting (topk > 1) is not what section 4's formulas model"
            )
        if (self.accept_length is not None or self.acceptance is not None) and self.k is None:
            raise ValueError(
                "an acceptance figure needs draft_tokens (k) or num_draft_tokens: "
                "tau and rates mean nothing without k"
            )
        return self

    @property
    def k(self) -> int | None:
        if self.draft_tokens is not None:
            return self.draft_tokens
        return None if self.num_draft_tokens is None else self.num_draft_tokens - 1


class Result(BaseModel):
    """One benchmark result: the `orch.bench/v2` document without `schema`."""

    model_config = ConfigDict(extra="forbid")

    label: str | None = None
    source: Provenance = Provenance()
    levels: list[Level] = []
    server: Server = Server()
    spec: Spec | None = None
    spec_unmeasured: str | None = Field(None, description="why a result has no acceptance")
    host: dict[str, Any] = Field(
        default_factory=dict, description="where it was measured: GPUs, driver, CPU model"
    )
    benchmark: dict[str, str | int | float | bool] = {}
    _origin: str = PrivateAttr("inline in the plan")  # or the file it was read from

    @model_validator(mode="after")
    def _check(self) -> Result:
        seen = [lv.concurrency for lv in self.levels]
        if len(seen) != len(set(seen)):
            raise ValueError(f"two levels with the same concurrency: {seen}")
        spec = self.spec
        if spec is not None and spec.acceptance is not None and spec.acceptance_definition is None:
            if self.server.engine != "vllm":  # SGLang's figure changed meaning (PR #23530)
                raise ValueError(
                    "spec.acceptance_definition is needed for this figure: 'strict' "
                    f"({DEFINITIONS['strict']}; vLLM, SGLang since PR #23530) or "
                    f"'sglang_legacy' ({DEFINITIONS['sglang_legacy']})"
                )
            spec.acceptance_definition = "strict"
        return self

    @property
    def origin(self) -> str:
        return self._origin


def _result_or_path(value: Any, info: ValidationInfo) -> Any:
    """A result inline, or the path of its JSON file (read when the task runs). A figure
    written in the plan itself that no definition allows is a plan error (the plan's loader
    passes `plan_file`); measured, or handed on from a finding, it is a measurement problem."""
    if isinstance(value, str | Result):
        return value
    if not isinstance(value, dict):
        raise ValueError(
            "give a benchmark result (a mapping with `levels`) or the path of its JSON file"
        )
    result = Result.model_validate(value)
    if (info.context or {}).get("plan_file") is not None and (problems := literal_problems(result)):
        raise ValueError("; ".join(problems) + ": no definition allows this figure")
    return result


ResultRef = Annotated[Result | str, PlainValidator(_result_or_path)]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]


class CompareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: ResultRef
    candidates: dict[Name, ResultRef] = Field(min_length=1)
    baseline_again: ResultRef | None = Field(
        None,
        description="the baseline measured again after the candidates, on a fresh launch "
        "(A/B/A): a level where the two disagree beyond their windows and the noise margin "
        "is inconclusive for every candidate; elsewhere the baseline's interval covers both "
        "launches and each candidate's is widened by their distance",
    )
    noise: float = Field(
        0.03,
        ge=0,
        lt=1,
        description="margin beyond the measured intervals: a level is a win only when the "
        "speed-up's interval lies above 1 + noise, a loss only below 1 - noise; "
        "for results measured once it is the only guard against run-to-run noise",
    )
    match_tolerance: float = Field(
        0.1, ge=0, lt=1, description="levels match when achieved concurrencies differ less"
    )
    max_draft_cost: float = Field(
        0.0,
        ge=0,
        description="the draft/target cost ratio a draft step may have: a "
        "speculative step costing more than k+1 + k * this many decode "
        "steps is flagged; 0 takes drafts as free, 1 allows a draft "
        "model as large as the target",
    )
    draft_cost: float = Field(
        0.0,
        ge=0,
        description="the draft/target cost ratio a draft step has at least, as the draft's "
        "size says (the target's own size: 1): a speed-up above tau / (k * this + 1), the "
        "candidate's ceiling, is a measurement problem; 0 takes drafts as free (ceiling tau)",
    )


def load_result(source: Result | str, what: str) -> Result:
    """The result itself, or read from its orch.bench/v1 or v2 JSON file."""
    if isinstance(source, Result):
        return source
    path = Path(source)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TaskError(f"{what}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TaskError(f"{what}: {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{what}: {path} holds no {SCHEMA} object")
    if (schema := data.get("schema", SCHEMA)) not in SCHEMAS:
        raise TaskError(f"{what}: {path} is {schema!r}; this orch reads {' and '.join(SCHEMAS)}")
    try:
        result = Result.model_validate({k: v for k, v in data.items() if k in Result.model_fields})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskError(f"{what}: {path}: {problems}") from None
    result._origin = f"{path} ({schema})"
    return result


# --- formatting ----------------------------------------------------------------------------------


def fx(ratio: float) -> str:
    """1.4x, 0.36x, 1.0x."""
    text = f"{ratio:.2f}"
    return (text[:-1] if text.endswith("0") else text) + "x"


def fc(concurrency: float) -> str:
    """Requests in flight: 48, 7.9, 31.5."""
    return f"{concurrency:.3g}"


def ft(tok_s: float) -> str:
    """Tokens per second: 63.6, 849, 2370, 410.2."""
    return f"{tok_s:.4g}" if abs(tok_s) < 10_000 else f"{tok_s:.0f}"


def fr(value: float) -> str:
    """A ratio's interval end: 1.21; an unbounded one: inf."""
    return "inf" if math.isinf(value) else f"{value:.2f}"


def _and(items: list[str]) -> str:
    """'1', '1 and 4', '1, 4 and 8'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _span(values: list[float]) -> str:
    """Speed-ups of several levels: '1.3-1.8x', '0.58-0.60x', or '1.4x' when they agree."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    if lo == hi:
        return fx(min(values))
    if lo.endswith("0") and hi.endswith("0"):
        lo, hi = lo[:-1], hi[:-1]
    return f"{lo}-{hi}x"


def _value(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


# --- the analysis --------------------------------------------------------------------------------

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


def _acceptance_problems(spec: Spec, k: int) -> list[str]:
    out = []
    if (tau := spec.accept_length) is not None and not 1 - 1e-9 <= tau <= k + 1 + 1e-9:
        out.append(f"accept length tau = {tau:.2f} is outside [1, k+1] = [1, {k + 1}]")
    rate, definition = spec.acceptance, spec.acceptance_definition
    if rate is not None and definition is not None:
        floor = rate_floor(k, definition)
        if not floor - 1e-9 <= rate <= 1 + 1e-9:
            hint = (
                " (a percentage is written 0.42 or '42%')"
                if rate > 1
                else ": check k and the definition"
            )
            out.append(
                f"acceptance {rate:.1%} is outside [{floor:.1%}, 100%], the range of the "
                f"{definition} definition with k={k}{hint}"
            )
    return out


def _reported_notes(
    rate: float,
    definition: Definition,
    reported_tau: float,
    acc: Acceptance,
    engine: str | None,
    has_tau: bool,
) -> list[str]:
    who = {"sglang": "SGLang", "vllm": "vLLM"}.get(engine or "", "the engine")
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
        if result.server.engine == "sglang" and result.spec is not None:
            text += (
                "; SGLang resets max_running_requests to 48 for speculative decoding "
                "unless --max-running-requests is set: re-run with "
                f"--max-running-requests {p.level.concurrency} and check "
                "--cuda-graph-max-bs before concluding (0.2)"
            )
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


def literal_problems(result: Result) -> list[str]:
    """Figures of a result that its own definitions forbid, whatever it is compared with."""
    spec, out = result.spec, _interval_problems("the level", result)
    if spec is None or (k := spec.k) is None:
        return out
    return _acceptance_problems(spec, k) + _level_tau_problems(result.levels, k) + out


def _interval_problems(who: str, result: Result) -> list[str]:
    out = []
    for lv in result.levels:
        if (
            lv.interval is not None
            and (iv := lv.interval.output_tok_s) is not None
            and not iv[0] * (1 - 1e-6) <= lv.output_tok_s <= iv[1] * (1 + 1e-6)
        ):
            out.append(
                f"{who} at concurrency {lv.concurrency}: median {ft(lv.output_tok_s)} "
                f"tok/s outside its own interval {ft(iv[0])}-{ft(iv[1])}"
            )
    return out


def _level_tau_problems(levels: Sequence[Level], k: int) -> list[str]:
    """Each level's own tau (bench.serve measures it per level) outside [1, k+1]."""
    out = []
    for lv in sorted(levels, key=lambda lv: lv.concurrency):
        raw = (lv.spec or {}).get("accept_length")
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            continue
        if not 1 - 1e-9 <= raw <= k + 1 + 1e-9:
            out.append(
                f"accept length tau = {raw:.2f} at concurrency {lv.concurrency} is "
                f"outside [1, k+1] = [1, {k + 1}]"
            )
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


# --- the verdict line ----------------------------------------------------------------------------


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


def _figure(m: Match, before: str = ", ", after: str = "") -> str:
    """'0.71x, 0.66-0.77'; '0.71x (0.66-0.77)' with before ' (' and after ')'."""
    return fx(m.speedup) + (f"{before}{m.spread_text}{after}" if m.spread_text else "")


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


# --- output --------------------------------------------------------------------------------------


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
