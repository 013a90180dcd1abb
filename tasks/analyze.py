"""`analyze.compare`: does speculative decoding pay? Candidate runs against a baseline run.

Each run is a benchmark result of one server configuration on the same benchmark: output
throughput per concurrency level, what the server resolved (its `max_running_requests`), and for
speculative runs the acceptance figures. A result is given inline in the plan or as the path of
a JSON file (relative to orch's working directory; a `${tasks.ID.findings.KEY}` works too), the
file `bench.serve` writes. Its schema, `orch.bench/v1` (inline results take the same keys, less
`schema`):

    {
      "schema": "orch.bench/v1",             # optional; another value is refused
      "label": "SGLang base, Kimi-K2.5 TP8", # optional, for the report
      "levels": [                            # one per requested concurrency (may be [] for a
        {"concurrency": 1,                   #   candidate known only by its acceptance)
         "achieved_concurrency": 1.0,        # optional: mean requests in flight, measured
         "output_tok_s": 63.6,               # output tokens per second, all requests
         "tpot_ms": 15.7, "ttft_ms": 210.0}, # optional
        {"concurrency": 128, "achieved_concurrency": 48.0, "output_tok_s": 849.0}
      ],
      "server": {"engine": "sglang",         # optional: sglang | vllm
                 "version": "0.5.23",        # optional
                 "max_running_requests": 48},# optional: what the server resolved at startup
      "spec": {                              # optional: only for speculative runs
        "algorithm": "EAGLE3", "drafter": "AQ-MedAI/Kimi-K25-eagle3",   # optional labels
        "draft_tokens": 3,                   # k: drafts proposed per verify step
        "num_draft_tokens": 4,               # or SGLang's flag (chain drafting: k + 1)
        "accept_length": 1.65,               # tau: tokens per verify step, bonus included
        "acceptance": 0.42,                  # or "42%": the engine's own figure ...
        "acceptance_definition": "sglang_legacy"   # ... and its definition (see below)
      },
      "benchmark": {"tool": "sglang.bench_serving", "dataset": "sharegpt",
                    "temperature": 0.0}      # optional, free-form; compared key by key
    }

Unknown keys inside `levels`, `server`, `spec` are an error (a typo must not vanish); unknown
top-level keys of a file (the tool's raw output, say) are ignored.

Acceptance definitions (serving-reference.md section 0.1): `strict` is accepted drafts /
proposed drafts (vLLM; SGLang since PR #23530), = (tau - 1) / k; `sglang_legacy` is SGLang's
log line and gauge before PR #23530, accept length / num_draft_tokens, = tau / (k + 1). vLLM
figures default to `strict`; an SGLang figure must say which, since the same log line changed
meaning. Every figure is put on the strict definition and on the per-token alpha of section 4.

Findings, per candidate NAME: NAME.verdict, NAME.pays, NAME.speedup_c1, NAME.speedup_peak,
NAME.loses_above, NAME.capped, NAME.accept_length, NAME.draft_tokens, NAME.acceptance,
NAME.alpha, NAME.acceptance_reported, NAME.break_even_step_ms, NAME.speedup_ceiling (each only
where the data allows); then `report`: the Markdown report, `<task id>.md` in the run's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    model_validator,
)

from orchestrator import Context, Task, TaskError

SCHEMA = "orch.bench/v1"
Definition = Literal["strict", "sglang_legacy"]
DEFINITIONS: dict[str, str] = {
    "strict": "accepted / proposed drafts = (tau-1)/k",
    "sglang_legacy": "accept length / num_draft_tokens = tau/(k+1), SGLang before PR #23530",
}
DRAFT_COSTS = (0.05, 0.1, 0.2)  # draft/target step cost ratios section 4 tabulates


# --- the math (serving-reference.md section 4 unless said otherwise) ---------------------------

def tau_from_alpha(alpha: float, k: int) -> float:
    """Expected tokens per verify step, bonus included: (1 - a^(k+1)) / (1 - a) (section 4)."""
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
    """The one definition: accepted / proposed drafts = (tau - 1) / k (sections 0.1 and 4)."""
    return (tau - 1.0) / k


def tau_from_rate(rate: float, k: int, definition: Definition) -> float:
    """tau from an engine's acceptance figure (section 0.1).

    strict: rate = (tau-1)/k. sglang_legacy: rate = (accepted + bs) / (bs * num_draft_tokens)
    = tau / num_draft_tokens, with num_draft_tokens = k+1 in chain drafting (topk 1).
    """
    tau = 1.0 + rate * k if definition == "strict" else rate * (k + 1)
    if tau < 1.0 - 1e-9:  # legacy figures start at 1/(k+1): zero drafts accepted
        raise ValueError(f"{rate:g} is below the floor of {definition} for k={k}, "
                         f"1/(k+1) = {1 / (k + 1):.3g}: check k and the definition")
    return max(tau, 1.0)


def modelled_speedup(tau: float, k: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """S = tau / (k*c + v), Leviathan Thm 3.8 with v = T_verify/T_dec (section 4)."""
    return tau / (k * draft_cost + verify_cost)


# --- params --------------------------------------------------------------------------------------

class Level(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(ge=1, description="requested: the client's max concurrency")
    achieved_concurrency: float | None = Field(
        None, gt=0, description="measured mean requests in flight")
    output_tok_s: float = Field(gt=0, description="output tokens per second, all requests")
    tpot_ms: float | None = Field(None, gt=0)
    ttft_ms: float | None = Field(None, gt=0)
    # What bench.serve measures besides (not used by the comparison, kept with the result).
    request_s: float | None = None
    completed: int | None = None
    errors: int | None = None
    first_error: str | None = None
    duration_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    ttft: dict[str, float] | None = None
    tpot: dict[str, float] | None = None
    itl: dict[str, float] | None = None
    e2e: dict[str, float] | None = None
    spec: dict[str, Any] | None = None


class Server(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["sglang", "vllm"] | None = None
    version: str | None = None
    max_running_requests: int | None = Field(
        None, ge=1, description="as the server resolved it (SGLang: /server_info, startup log)")


def _fraction(value: object) -> object:
    """'42%' -> 0.42; a bare 42 is refused below (le=1), not guessed at."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return float(value.strip()[:-1]) / 100
    return value


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: str | None = None
    drafter: str | None = None
    draft_tokens: int | None = Field(
        None, ge=1, description="k: drafts proposed per verify step (SGLang speculative_num_steps"
                                " with topk 1, vLLM num_speculative_tokens)")
    num_draft_tokens: int | None = Field(
        None, ge=2, description="SGLang --speculative-num-draft-tokens (chain drafting: k + 1)")
    accept_length: float | None = Field(
        None, ge=1, description="tau: tokens per verify step, bonus token included")
    acceptance: Annotated[float | None, BeforeValidator(_fraction)] = Field(
        None, ge=0, le=1, description="the engine's own acceptance figure: 0.42 or '42%'")
    acceptance_definition: Definition | None = None
    # The counts bench.serve derived them from (vLLM /metrics deltas, SGLang meta_info).
    alpha: float | None = None
    drafts: int | None = None
    proposed: int | None = None
    accepted: int | None = None
    verify_passes: int | None = None
    output_tokens: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        k, n = self.draft_tokens, self.num_draft_tokens
        if k is not None and n is not None and n != k + 1:
            raise ValueError(f"num_draft_tokens {n} is not draft_tokens + 1 = {k + 1}: tree "
                             "drafting (topk > 1) is not what section 4's formulas model")
        if (self.accept_length is not None or self.acceptance is not None) and self.k is None:
            raise ValueError("an acceptance figure needs draft_tokens (k) or num_draft_tokens: "
                             "tau and rates mean nothing without k")
        if self.k is not None and self.accept_length is not None \
                and self.accept_length > self.k + 1:
            raise ValueError(f"accept_length {self.accept_length:g} exceeds k+1 = {self.k + 1}: "
                             "is k the number of drafts per step (num_draft_tokens - 1)?")
        return self

    @property
    def k(self) -> int | None:
        if self.draft_tokens is not None:
            return self.draft_tokens
        return None if self.num_draft_tokens is None else self.num_draft_tokens - 1


class Result(BaseModel):
    """One benchmark result: the `orch.bench/v1` document without `schema`."""

    model_config = ConfigDict(extra="forbid")

    label: str | None = None
    levels: list[Level] = []
    server: Server = Server()
    spec: Spec | None = None
    benchmark: dict[str, str | int | float | bool] = {}

    @model_validator(mode="after")
    def _check(self) -> Result:
        seen = [lv.concurrency for lv in self.levels]
        if len(seen) != len(set(seen)):
            raise ValueError(f"two levels with the same concurrency: {seen}")
        spec = self.spec
        if spec is not None and spec.acceptance is not None:
            if spec.acceptance_definition is None:
                if self.server.engine != "vllm":  # SGLang's figure changed meaning (PR #23530)
                    raise ValueError(
                        "spec.acceptance_definition is needed for this figure: 'strict' "
                        f"({DEFINITIONS['strict']}; vLLM, SGLang since PR #23530) or "
                        f"'sglang_legacy' ({DEFINITIONS['sglang_legacy']})")
                spec.acceptance_definition = "strict"
            assert spec.k is not None  # Spec checked it
            tau_from_rate(spec.acceptance, spec.k, spec.acceptance_definition)  # below floor?
        return self


def _source(value: Any) -> Any:
    """A result inline, or the path of its JSON file (read when the task runs)."""
    if isinstance(value, str | Result):
        return value
    if not isinstance(value, dict):
        raise ValueError("give a benchmark result (a mapping with `levels`) or the path of its "
                         "JSON file")
    return Result.model_validate(value)


Source = Annotated[Result | str, PlainValidator(_source)]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]


class CompareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: Source
    candidates: dict[Name, Source] = Field(min_length=1)
    noise: float = Field(0.03, ge=0, lt=1, description="speed-ups within 1 +- noise are 'even'")
    match_tolerance: float = Field(
        0.1, ge=0, lt=1, description="levels match when achieved concurrencies differ less")


def load_result(source: Result | str, what: str) -> Result:
    """The result itself, or read from its orch.bench/v1 JSON file."""
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
    if (schema := data.get("schema", SCHEMA)) != SCHEMA:
        raise TaskError(f"{what}: {path} is {schema!r}; this orch reads {SCHEMA}")
    try:
        return Result.model_validate({k: v for k, v in data.items() if k in Result.model_fields})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskError(f"{what}: {path}: {problems}") from None


# --- the analysis --------------------------------------------------------------------------------

def fx(ratio: float) -> str:
    """1.4x, 0.36x, 1.0x."""
    text = f"{ratio:.2f}"
    return (text[:-1] if text.endswith("0") else text) + "x"


def fc(concurrency: float) -> str:
    return f"{concurrency:.3g}"


@dataclass(frozen=True)
class Point:
    """A level at the concurrency it really ran at."""

    level: Level
    concurrency: float  # achieved; else min(requested, max_running_requests)
    inferred: bool  # concurrency not measured but taken from the server's cap

    @property
    def per_request(self) -> float:
        return self.level.output_tok_s / self.concurrency


def points(result: Result) -> list[Point]:
    mrr = result.server.max_running_requests
    out = []
    for lv in sorted(result.levels, key=lambda lv: lv.concurrency):
        if lv.achieved_concurrency is not None:
            out.append(Point(lv, lv.achieved_concurrency, False))
        else:
            capped = mrr is not None and mrr < lv.concurrency
            out.append(Point(lv, float(mrr) if capped and mrr else float(lv.concurrency), capped))
    return out


@dataclass(frozen=True)
class Match:
    """A candidate level and the baseline level at (about) the same achieved concurrency."""

    cand: Point
    base: Point

    @property
    def speedup(self) -> float:
        return self.cand.level.output_tok_s / self.base.level.output_tok_s


@dataclass
class Acceptance:
    tau: float
    k: int
    strict: float
    alpha: float
    source: str  # where tau came from
    reported: float | None = None
    definition: Definition | None = None
    notes: list[str] = field(default_factory=list)


def acceptance(spec: Spec | None, engine: str | None) -> Acceptance | None:
    """tau and k, and from them the strict rate and alpha; the engine's figure on that scale."""
    if spec is None or spec.k is None or (spec.accept_length is None and spec.acceptance is None):
        return None
    k = spec.k
    reported_tau = None
    if spec.acceptance is not None and spec.acceptance_definition is not None:
        reported_tau = tau_from_rate(spec.acceptance, k, spec.acceptance_definition)
    tau = spec.accept_length if spec.accept_length is not None else reported_tau
    assert tau is not None
    source = "accept length" if spec.accept_length is not None else "the reported acceptance"
    acc = Acceptance(tau, k, strict_rate(tau, k), alpha_from_tau(tau, k), source,
                     spec.acceptance, spec.acceptance_definition)
    if spec.acceptance is not None and reported_tau is not None:
        who = {"sglang": "SGLang", "vllm": "vLLM"}.get(engine or "", "the engine")
        acc.notes.append(
            f"{who} reported {spec.acceptance:.0%} on the {spec.acceptance_definition} definition "
            f"({DEFINITIONS[str(spec.acceptance_definition)]}), i.e. tau = "
            f"{reported_tau:.2f} and {strict_rate(reported_tau, k):.1%} accepted/proposed")
        if reported_tau <= 1.05:  # a legacy figure at 1/(k+1) means tau = 1
            acc.notes.append("at or near that definition's floor: (almost) no draft accepted")
        if spec.accept_length is not None and abs(reported_tau - tau) > max(0.1, 0.05 * tau):
            acc.notes.append(f"INCONSISTENT with accept length {tau:.2f}: check k "
                             "(drafts per step, not num_draft_tokens) and the definition")
    return acc


@dataclass
class BreakEven:
    """Section 4's single-stream break-even for tau and k against the baseline's decode step."""

    base_tok_s: float  # the baseline's single-stream output
    t_dec_ms: float
    step_budget_ms: float  # a speculative step (k drafts + verify + overhead) must be faster
    max_draft_cost: float  # c with v = 1
    ceiling: float  # S with free drafts and verify = one decode step: tau
    modelled: dict[float, float]
    measured: float | None  # speed-up measured at c=1

    def text(self, acc: Acceptance) -> str:
        lines = [
            f"baseline decode step T_dec = 1000 / {self.base_tok_s:g} tok/s = "
            f"{self.t_dec_ms:.1f} ms; a speculative step emits tau = {acc.tau:.2f} tokens, so "
            f"it must take < tau * T_dec = {self.step_budget_ms:.1f} ms (k={acc.k} drafts + "
            "verify + overhead) to win at c=1",
            f"with verify = one decode step (v=1) a draft step must cost < (tau-1)/k = "
            f"{self.max_draft_cost:.2f} of a target step; ceiling with free drafts: "
            f"{fx(self.ceiling)}",
            "modelled S = tau/(k*c+1): " + ", ".join(
                f"{fx(s)} at c={c:g}" for c, s in self.modelled.items()),
        ]
        if self.measured is not None:
            cost = acc.tau / self.measured
            lines.append(f"measured {fx(self.measured)} at c=1: a speculative step costs "
                         f"tau/S = {cost:.2f} decode steps, i.e. a draft step ~"
                         f"{(cost - 1) / acc.k:.2f} of a target step (v=1)")
        lines.append(f"at higher load verifying B*(k+1) tokens turns compute-bound, "
                     f"v_B -> k+1 = {acc.k + 1}, so the break-even tau rises with batch size "
                     "and speculation loses where it exceeds the measured tau")
        return "; ".join(lines)


@dataclass
class Verdict:
    """One candidate against the baseline."""

    name: str
    result: Result
    points: list[Point]
    matches: list[Match]
    c1: Match | None
    peak: tuple[Point, Point] | None
    peak_comparable: bool
    capped: bool
    cap_note: str | None
    acceptance: Acceptance | None
    break_even: BreakEven | None
    verdict: str = ""
    pays: bool = False
    loses_above: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def speedup_peak(self) -> float | None:
        return None if self.peak is None else (
            self.peak[0].level.output_tok_s / self.peak[1].level.output_tok_s)


def _match(cand: list[Point], base: list[Point], tolerance: float) -> list[Match]:
    out = []
    for c in cand:
        near = [b for b in base if abs(b.concurrency - c.concurrency)
                <= tolerance * max(b.concurrency, c.concurrency)]
        if near:
            out.append(Match(c, min(near, key=lambda b: abs(b.concurrency - c.concurrency))))
    return out


def _cap(result: Result, pts: list[Point], base: Result, tolerance: float,
         base_pts: list[Point]) -> str | None:
    """Why the candidate's achieved concurrency fell short of the requested (the 48 case)."""
    mrr = result.server.max_running_requests
    over = [p for p in pts if mrr is not None and p.level.concurrency > mrr]
    short = [p for p in pts if p.concurrency < (1 - tolerance) * p.level.concurrency]
    if not over and not short:
        return None
    p = max(over or short, key=lambda p: p.level.concurrency)
    ran = f"{fc(p.concurrency)} in flight{' (inferred)' if p.inferred else ''}"
    if over:
        base_mrr = base.server.max_running_requests
        text = (f"capped by the server: max_running_requests={mrr}"
                + (f" (baseline: {base_mrr})" if base_mrr is not None else "")
                + f"; c={p.level.concurrency} requested, {ran}")
        if result.server.engine == "sglang" and result.spec is not None:
            text += ("; SGLang resets max_running_requests to 48 for speculative decoding "
                     "unless --max-running-requests is set (serving-reference 1.2): re-run with "
                     f"--max-running-requests {p.level.concurrency} and check "
                     "--cuda-graph-max-bs before concluding (0.2)")
    else:
        text = (f"admission fell short: c={p.level.concurrency} requested, {ran}; the server's "
                "max_running_requests was not recorded, so the cause is unknown")
    # Per request (section 0.2): the capped peak measures the cap, not speculation. The
    # baseline's per-request speed falls with load, so at the nearest level at or above the
    # candidate's concurrency it bounds the baseline at equal concurrency from below.
    above = [b for b in base_pts if b.concurrency >= p.concurrency * (1 - tolerance)]
    if above:
        b = min(above, key=lambda b: b.concurrency)
        ratio = p.per_request / b.per_request
        text += (f"; per request {p.per_request:.1f} tok/s with {fc(p.concurrency)} in flight vs "
                 f"{b.per_request:.1f} for the baseline with {fc(b.concurrency)} ({fx(ratio)})")
        if ratio < 1 and b.concurrency > p.concurrency * (1 + tolerance):
            text += (f": at {fc(p.concurrency)} in flight the baseline would be at least that "
                     "fast, so no sign of a speed-up at equal concurrency either")
        elif ratio >= 1 and b.concurrency > p.concurrency * (1 + tolerance):
            text += (f": measure the baseline at c={fc(p.concurrency)} or lift the cap to "
                     "decide")
    return text


def compare(name: str, cand: Result, base: Result, noise: float = 0.03,
            tolerance: float = 0.1) -> Verdict:
    """Speed-ups at c=1, at peak and at equal achieved concurrency; cap; acceptance; verdict."""
    cpts, bpts = points(cand), points(base)
    c1 = next((Match(c, b) for c in cpts for b in bpts
               if c.level.concurrency == 1 and b.level.concurrency == 1), None)
    peak = None
    comparable = False
    if cpts and bpts:
        cp = max(cpts, key=lambda p: p.level.output_tok_s)
        bp = max(bpts, key=lambda p: p.level.output_tok_s)
        peak = (cp, bp)
        # A candidate never run up to the baseline's peak concurrency has no peak to compare.
        comparable = max(p.level.concurrency for p in cpts) >= bp.level.concurrency
    cap_note = _cap(cand, cpts, base, tolerance, bpts)
    acc = acceptance(cand.spec, cand.server.engine)
    v = Verdict(name, cand, cpts, _match(cpts, bpts, tolerance), c1, peak, comparable,
                cap_note is not None, cap_note, acc, None)
    base_c1 = next((b for b in bpts if b.level.concurrency == 1), None)
    if acc is not None and base_c1 is not None and acc.tau > 1 + noise:
        t_dec = 1000.0 / base_c1.level.output_tok_s  # section 4: 63.6 tok/s -> 15.7 ms
        v.break_even = BreakEven(
            base_c1.level.output_tok_s, t_dec, acc.tau * t_dec, acc.strict, acc.tau,
            {c: modelled_speedup(acc.tau, acc.k, c) for c in DRAFT_COSTS},
            None if c1 is None else c1.speedup)
    _decide(v, base, noise)
    return v


def _decide(v: Verdict, base: Result, noise: float) -> None:
    """The verdict line, e.g. 'speculation pays: 1.4x at c=1, loses above c=32'."""
    wins = [m for m in v.matches if m.speedup > 1 + noise]
    losses = [m for m in v.matches if m.speedup < 1 - noise]
    s_peak = v.speedup_peak
    peak_loses = s_peak is not None and v.peak_comparable and s_peak < 1 - noise
    acc = v.acceptance
    nothing_accepted = acc is not None and acc.tau <= 1 + noise
    details: list[str] = []
    if wins:
        v.pays = True
        first = min(wins, key=lambda m: m.cand.concurrency)
        head = f"speculation pays: {fx(first.speedup)} at c={fc(first.cand.concurrency)}"
        if later := [m for m in losses if m.cand.concurrency > first.cand.concurrency]:
            lost = min(m.cand.concurrency for m in later)
            v.loses_above = max(m.cand.concurrency for m in v.matches
                                if m.cand.concurrency < lost)
            details.append(f"loses above c={fc(v.loses_above)}")
        elif peak_loses:
            details.append(f"loses at peak ({fx(s_peak or 0)})")
    elif v.matches or peak_loses or nothing_accepted:
        head = "no speed-up"
        best = max(v.matches, key=lambda m: m.speedup, default=None)
        if best is not None and not (peak_loses and v.peak and best.cand is v.peak[0]):
            details.append(f"at best {fx(best.speedup)} at c={fc(best.cand.concurrency)}")
        if peak_loses:
            details.append(f"loses at peak ({fx(s_peak or 0)})")
    elif v.points:
        head = "no speed-up measured at equal concurrency"
    elif acc is not None:  # tau bounds any speed-up (section 4): free drafts, v = 1
        head = f"not measured: at most {fx(acc.tau)} at c=1 (tau)"
    else:
        head = "no measurement"
    if nothing_accepted and acc is not None:
        details.append(f"tau={acc.tau:.2f}, no draft accepted")
    if v.capped:
        mrr = v.result.server.max_running_requests
        details.append(f"capped at {mrr} running requests" if mrr else "admission capped")
    sep = ", " if ":" in head else ": "  # 'pays: 1.4x at c=1, loses ...'; 'no speed-up: ...'
    v.verdict = head + (sep + ", ".join(details) if details else "")
    if acc is not None:
        if v.c1 is not None and v.c1.speedup > acc.tau * (1 + noise):
            v.notes.append(f"measured {fx(v.c1.speedup)} at c=1 exceeds the ceiling tau = "
                           f"{acc.tau:.2f}: are both runs the same benchmark?")
        v.notes.extend(n for n in acc.notes if n.startswith("INCONSISTENT"))
    v.notes.extend(_comparability(v.result, base))


def _comparability(cand: Result, base: Result) -> list[str]:
    """Same benchmark and engine? (serving-reference 3.3: the clients' defaults differ.)"""
    notes = []
    differ = [f"{k}: {base.benchmark[k]!r} vs {cand.benchmark[k]!r}"
              for k in sorted(base.benchmark.keys() & cand.benchmark.keys())
              if base.benchmark[k] != cand.benchmark[k]]
    if differ:
        notes.append("NOT the same benchmark (" + "; ".join(differ) + "): the speed-ups compare "
                     "the benchmarks as much as the servers")
    if base.server.engine and cand.server.engine and base.server.engine != cand.server.engine:
        notes.append(f"engines differ ({base.server.engine} vs {cand.server.engine}): compare "
                     "only with identical prompts, temperature and max tokens (bench_serving "
                     "sends temperature 0, vllm bench serve the model's default; "
                     "serving-reference 3.3)")
    return notes


# --- output --------------------------------------------------------------------------------------

def record(ctx: Context, v: Verdict) -> None:
    """The candidate's findings, verdict first (the board shows the first ones)."""
    n = v.name
    acc = v.acceptance
    summary = [] if acc is None else [
        f"tau {acc.tau:.2f} of k={acc.k}: {acc.strict:.1%} accepted/proposed"
        + (f" (the {acc.reported:.0%} reported is {acc.definition})"
           if acc.reported is not None and acc.definition != "strict" else "")]
    ctx.finding(f"{n}.verdict", v.verdict, note="; ".join(summary + v.notes) or None)
    ctx.finding(f"{n}.pays", v.pays)
    if v.c1 is not None:
        ctx.finding(f"{n}.speedup_c1", round(v.c1.speedup, 3), "x",
                    f"{v.c1.cand.level.output_tok_s:g} vs {v.c1.base.level.output_tok_s:g} tok/s")
    if v.peak is not None and v.speedup_peak is not None:
        cp, bp = v.peak
        ctx.finding(f"{n}.speedup_peak", round(v.speedup_peak, 3), "x",
                    f"{cp.level.output_tok_s:g} tok/s at c={cp.level.concurrency} "
                    f"({fc(cp.concurrency)} in flight) vs {bp.level.output_tok_s:g} at "
                    f"c={bp.level.concurrency}"
                    + ("" if v.peak_comparable else "; candidate not run that high"))
    if v.loses_above is not None:
        ctx.finding(f"{n}.loses_above", round(v.loses_above, 3), "requests in flight")
    ctx.finding(f"{n}.capped", v.capped, note=v.cap_note)
    if acc is not None:
        ctx.finding(f"{n}.accept_length", round(acc.tau, 4), "tokens/step",
                    f"tau incl. bonus token, from {acc.source}")
        ctx.finding(f"{n}.draft_tokens", acc.k, "tokens", "k drafts per verify step")
        ctx.finding(f"{n}.acceptance", round(acc.strict, 4), "ratio", "(tau-1)/k")
        ctx.finding(f"{n}.alpha", round(acc.alpha, 4), "ratio", "(1-a^(k+1))/(1-a) = tau")
        if acc.reported is not None:
            ctx.finding(f"{n}.acceptance_reported", acc.reported, "ratio",
                        acc.notes[0] if acc.notes else None)
    if (be := v.break_even) is not None:
        ctx.finding(f"{n}.break_even_step_ms", round(be.step_budget_ms, 2), "ms",
                    "tau * T_dec: a speculative step must be faster to win at c=1")
        ctx.finding(f"{n}.speedup_ceiling", round(be.ceiling, 3), "x", "tau")


def _cell(value: float | None, fmt: str = "{:g}") -> str:
    return "–" if value is None else fmt.format(value)


def _pts_line(pts: list[Point]) -> str:
    return ", ".join(f"{p.level.output_tok_s:g} tok/s at c={p.level.concurrency}"
                     + (f" ({fc(p.concurrency)} in flight)"
                        if abs(p.concurrency - p.level.concurrency) > 1e-9 else "")
                     for p in pts) or "no levels"


def render(task_id: str, base: Result, verdicts: list[Verdict]) -> str:
    """The run's report: one summary table, then each candidate's levels and reasoning."""
    mrr = base.server.max_running_requests
    out = [f"# {task_id}: speculative decoding against the baseline", "",
           f"Baseline **{base.label or 'baseline'}**"
           + (f" ({base.server.engine}" + (f", max_running_requests {mrr}" if mrr else "") + ")"
              if base.server.engine else "")
           + f": {_pts_line(points(base))}.", "",
           "Acceptance on one definition: accepted / proposed drafts = (tau-1)/k; alpha is the "
           "per-token acceptance with (1-alpha^(k+1))/(1-alpha) = tau "
           "(serving-reference.md sections 0.1 and 4).", "",
           "| candidate | verdict | c=1 | peak | capped | tau (k) | (tau-1)/k | alpha "
           "| engine reported |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        acc = v.acceptance
        reported = "–"
        if acc is not None and acc.reported is not None:
            reported = f"{acc.reported:.0%} ({acc.definition})"
        out.append("| " + " | ".join([
            v.name, v.verdict, _cell(v.c1.speedup if v.c1 else None, "{:.2f}x"),
            _cell(v.speedup_peak, "{:.2f}x"),
            (f"yes, {v.result.server.max_running_requests}" if v.capped and
             v.result.server.max_running_requests else "yes" if v.capped else "no"),
            f"{acc.tau:.2f} ({acc.k})" if acc else "–",
            f"{acc.strict:.1%}" if acc else "–", f"{acc.alpha:.3f}" if acc else "–",
            reported]) + " |")
    for v in verdicts:
        out += ["", f"## {v.name}" + (f": {v.result.label}" if v.result.label else ""), "",
                f"**{v.verdict}**", "", f"Measured: {_pts_line(v.points)}."]
        if v.points:
            out += ["", "| c requested | in flight | tok/s | baseline tok/s | speed-up "
                        "| tok/s per request | spec step / decode step |",
                    "| --- | --- | --- | --- | --- | --- | --- |"]
            by_cand = {id(m.cand): m for m in v.matches}
            for p in v.points:
                m = by_cand.get(id(p))
                cost = (v.acceptance.tau / m.speedup
                        if m is not None and v.acceptance is not None else None)
                out.append("| " + " | ".join([
                    str(p.level.concurrency), fc(p.concurrency) + ("*" if p.inferred else ""),
                    f"{p.level.output_tok_s:g}",
                    f"{m.base.level.output_tok_s:g}" if m else "no level at this concurrency",
                    _cell(m.speedup if m else None, "{:.2f}x"), f"{p.per_request:.1f}",
                    _cell(cost, "{:.2f}")]) + " |")
            if any(p.inferred for p in v.points):
                out.append("\n\\* in flight not measured: taken as the server's "
                           "max_running_requests")
        bullets = [f"- **Capped.** {v.cap_note}."] if v.cap_note else []
        if (acc := v.acceptance) is not None:
            bullets.append(
                f"- **Acceptance.** tau = {acc.tau:.2f} with k = {acc.k} (from {acc.source}): "
                f"(tau-1)/k = {acc.strict:.1%} accepted/proposed, alpha = {acc.alpha:.3f}"
                + "".join(f"; {n}" for n in acc.notes) + ".")
            if v.break_even is not None:
                bullets.append(f"- **Break-even (section 4).** {v.break_even.text(acc)}.")
        bullets += [f"- {n}." for n in v.notes if acc is None or n not in acc.notes]
        out += ["", *bullets] if bullets else []
    return "\n".join(out) + "\n"


class AnalyzeCompare(Task[CompareParams]):
    """Compare candidate benchmark runs with a baseline: speed-ups, the cap, acceptance, verdict."""

    Params = CompareParams

    def run(self, ctx: Context) -> None:
        p = self.params
        base = load_result(p.baseline, "baseline")
        if not base.levels:
            raise TaskError("baseline: no levels, nothing to compare against")
        verdicts = [compare(name, load_result(src, f"candidate {name}"), base, p.noise,
                            p.match_tolerance)
                    for name, src in p.candidates.items()]
        report = (ctx.log_path.parent / f"{ctx.task_id}.md").resolve()
        text = render(ctx.task_id, base, verdicts)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(text)
        ctx.log(text)  # `orch logs ID` shows the report too
        for v in verdicts:
            record(ctx, v)
        ctx.finding("report", str(report), note=f"{len(verdicts)} candidate(s)")
