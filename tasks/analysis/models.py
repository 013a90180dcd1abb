"""The `orch.bench` result document as analyze.compare reads it (v1 and v2; bench.serve writes
v2), and the task's params: pydantic models that refuse what makes figures unreadable and
keep what is merely out of range (a measurement, flagged by the verdict)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, cast

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

from orchestrator import TaskError
from tasks.analysis.numbers import ft
from tasks.analysis.speculation import DEFINITIONS, Definition, rate_floor
from tasks.serving.engines import engine

SCHEMA = "orch.bench/v2"  # what bench.serve writes


SCHEMAS = ("orch.bench/v1", SCHEMA)  # what this module reads


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

    engine: str | None = Field(None, description="the engine's adapter name: vllm, sglang, ...")
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
    # The counts bench.serve derived them from (vLLM /metrics deltas, SGLang meta_info), as
    # orch.bench/v2 has named them at the top level since before `counts`: kept there for
    # whoever reads them (COUNT_NAMES), and under `counts` by the engine's adapter's names.
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
    counts: dict[str, float] | None = Field(
        None, description="the engine's own counts behind tau and k, by its names (its adapter)"
    )

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


# Spec's count fields: an engine's counts of these names are written at the top level too.
COUNT_NAMES = frozenset(
    ("drafts", "proposed", "accepted", "verify_passes", "output_tokens", "correct_drafts",
     "proposed_drafts")
)  # fmt: skip


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
            # An engine whose figure always had one definition lends it; one whose figure
            # changed meaning (SGLang's, at PR #23530), or an unknown one, must say it.
            implied = engine(self.server.engine).rate_definition
            if implied is None:
                raise ValueError(
                    "spec.acceptance_definition is needed for this figure: 'strict' "
                    f"({DEFINITIONS['strict']}; vLLM, SGLang since PR #23530) or "
                    f"'sglang_legacy' ({DEFINITIONS['sglang_legacy']})"
                )
            spec.acceptance_definition = cast(Definition, implied)
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
