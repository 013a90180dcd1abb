"""What an engine adapter says, and the defaults of any OpenAI-compatible server.

An adapter is everything orch knows of one serving engine, asked by `server.launch` (its
command line, its readiness and settings), `bench.serve` (its streams, where its acceptance
comes from and how it is counted) and `analyze.compare` (its name, its acceptance figure's
definition, its cap). None of them holds an engine's name in its logic.

Acceptance is handed on as the engine's own counts (`Counts`: vLLM's draft counters, SGLang's
verify passes, ...); the adapter turns counts into tau (tokens per verify step) and k (drafts
per step); the arithmetic from there (strict rate, alpha) is orch's, the same for every engine
(tasks/analysis/speculation.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import OptionValue


class Speculative(BaseModel):
    """Speculative decoding, one meaning of k for both engines."""

    model_config = ConfigDict(extra="forbid")

    algorithm: OptionValue = Field(
        description="SGLang: EAGLE3, EAGLE, NGRAM, ...; vLLM method: eagle3, "
        "draft_model, ngram, ..."
    )
    draft_model: OptionValue | None = None
    draft_tokens: int | None = Field(
        None,
        ge=1,
        description="k: drafts per verify step (SGLang --speculative-num-steps with "
        "topk 1; vLLM num_speculative_tokens)",
    )
    topk: int = Field(1, ge=1, description="SGLang --speculative-eagle-topk")
    num_draft_tokens: int | None = Field(
        None, ge=2, description="SGLang --speculative-num-draft-tokens; k+1 when topk is 1"
    )
    config: dict[str, Any] = Field(
        {}, description="vLLM: more keys of --speculative-config (prompt_lookup_max, ...)"
    )

    @model_validator(mode="after")
    def _tree(self) -> Speculative:
        if self.topk > 1 and (self.num_draft_tokens is None or self.draft_tokens is None):
            raise ValueError("topk > 1 (tree drafting) needs draft_tokens and num_draft_tokens")
        return self

    @property
    def verify_tokens(self) -> int | None:
        if self.num_draft_tokens is not None or self.draft_tokens is None:
            return self.num_draft_tokens
        return self.draft_tokens + 1


class Launch(Protocol):
    """What an adapter reads of `server.launch`'s params (tasks/serving/launch.py)."""

    @property
    def model(self) -> str | None: ...
    @property
    def launcher(self) -> list[str] | None: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def max_running_requests(self) -> int | None: ...
    @property
    def speculative(self) -> Speculative | None: ...
    @property
    def extra_args(self) -> list[str]: ...
    def common_flags(self) -> list[str]: ...


Counts = dict[str, float]  # an engine's acceptance counters, by its names
OPENAI = "openai"  # the OpenAI-compatible API every engine here serves


@dataclass(frozen=True)
class Request:
    """One streaming generation, in no engine's words yet."""

    model: str
    text: str
    ids: list[int] | None  # sent instead of the text: an exact input length
    output_tokens: int
    temperature: float
    ignore_eos: bool


@dataclass
class Stream:
    """One answer as it streams, as the adapter reads its chunks."""

    output_tokens: int = 0
    prompt_tokens: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # the engine's per-request counters
    seen: int = 0  # what the adapter needs between chunks (SGLang: characters of text seen)


@dataclass(frozen=True)
class Measured:
    """Acceptance from counts: tau and k on the strict definition, with the engine's own
    figures beside them (named as the engine names them)."""

    tau: float
    k: float
    figures: dict[str, Any] = field(default_factory=dict)


class Engine:
    """A serving engine. The defaults are a generic OpenAI-compatible server's: it streams
    /v1/completions, says nothing of itself, reports no acceptance."""

    name = ""  # the flavour in plans, `server.engine` in results
    title = "the engine"  # in sentences
    launcher: tuple[str, ...] = ()  # argv before the flags
    # The API bench.serve uses when the plan says `auto`, and the one its acceptance comes on
    # per request (None: acceptance does not depend on the API, or there is none).
    api = OPENAI
    acceptance_api: str | None = None
    # Whether a connection that carried a streamed answer may carry the next request (HTTP
    # keep-alive as the engine says it); False: a connection of its own for each request.
    keep_alive = True
    # Where a benchmark's acceptance comes from, written into the result.
    acceptance_source = ""
    # The definition of the engine's own acceptance rate when a result does not say it (None:
    # it must be said: the figure changed meaning over versions, or the engine is unknown).
    rate_definition: str | None = None

    # --- server.launch ----------------------------------------------------------------------

    def command(self, p: Launch) -> list[str]:
        """The engine's command line from typed params."""
        raise NotImplementedError(self.name)

    def launch_note(self, p: Launch) -> str | None:
        """A word before launching (a default that will shape the results)."""
        return None

    def settings(self, url: str) -> dict[str, Any] | None:
        """What a running server says of itself (its version, resolved settings); None when
        it does not answer as this engine."""
        return None

    def configured(self, p: Launch) -> dict[str, Any]:
        """Settings the server does not report but the launch set."""
        return {}

    def finding_note(self, key: str, value: Any, p: Launch) -> str | None:
        """A note for a resolved setting's finding."""
        return None

    # --- bench.serve: streams ---------------------------------------------------------------

    def request(self, api: str, r: Request) -> tuple[str, dict[str, Any]]:
        """Path and JSON body of one streaming request on `api`."""
        if api != OPENAI:
            raise ValueError(f"{self.title} has no API {api!r}")
        return "/v1/completions", {
            "model": r.model,
            "prompt": r.text if r.ids is None else r.ids,
            "max_tokens": r.output_tokens,
            "temperature": r.temperature,
            "ignore_eos": r.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def tokenize(self, url: str, model: str, text: str) -> list[int] | None:
        """`text` as the server's tokenizer cuts it, special tokens left out; None where the
        engine has no tokenizer endpoint orch knows. Raises http.Unreachable when asking fails."""
        return None

    def read_chunk(self, api: str, data: Mapping[str, Any], out: Stream) -> bool:
        """Fold one streamed JSON chunk into `out`; True if it carried tokens. OpenAI:
        choices[0].text is the delta; the last chunk has `usage`."""
        if usage := data.get("usage"):
            out.output_tokens = int(usage.get("completion_tokens") or 0)
            out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        return bool(data.get("choices"))  # text may be empty (held back by the detokenizer)

    # --- bench.serve: acceptance ------------------------------------------------------------

    def counters(self, url: str) -> Counts:
        """Counters read before and after a window ({}: none are read around windows)."""
        return {}

    def window_counts(
        self, before: Counts, after: Counts, streams: Sequence[Stream]
    ) -> Counts | None:
        """A window's acceptance counts: from the counters around it, or its streams' own;
        None when no speculation showed."""
        return None

    def measure(self, counts: Counts, k: int | None) -> Measured | None:
        """tau and k from counts (a window's, or several summed), `k` as planned or resolved."""
        return None

    def k_of(self, settings: Mapping[str, Any]) -> int | None:
        """k as the engine resolved it, from its settings (where the plan left it)."""
        return None

    def unmeasured(self, api: str, algorithm: str) -> str:
        """Why a benchmark of this engine speculating (`algorithm`) has no acceptance."""
        where = f"on {self.acceptance_api}" if self.acceptance_api else "in its counters"
        return f"not measured: the server speculates ({algorithm}) but reported none {where}"

    # --- analyze.compare --------------------------------------------------------------------

    def cap_advice(self, concurrency: int) -> str | None:
        """What to do when a speculative run was capped below `concurrency` by the server."""
        return None


def summed(parts: Sequence[Counts]) -> Counts:
    """Counts of several windows or levels, added key by key."""
    out: Counts = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


class SpecDecodeCounters(Engine):
    """An engine that counts speculative decoding on /metrics as vLLM names it (vLLM's
    vllm/v1/spec_decode/metrics.py; llama.cpp copied the names): `<prefix>num_drafts_total`
    (verify steps), `num_draft_tokens_total` (proposed), `num_accepted_tokens_total`
    (accepted) and `num_accepted_tokens_per_pos_total{position}`. Read around each window:
    tau = 1 + accepted / steps, k = proposed / steps; its own rate is the strict one."""

    metrics_prefix = ""
    rate_definition = "strict"  # accepted / proposed, always (vLLM; llama.cpp: accepted / drafted)
    NAMES = {
        "drafts": "num_drafts",
        "proposed": "num_draft_tokens",
        "accepted": "num_accepted_tokens",
    }

    def counters(self, url: str) -> Counts:
        from probes import http

        try:
            text = http.request(url + "/metrics").decode()
        except http.Unreachable:
            return {}  # no /metrics: no acceptance figures, not a failed benchmark
        prefix = self.metrics_prefix
        samples = http.metric_samples(text, prefix)
        out = {ours: http.total(samples, f"{prefix}{n}_total") for ours, n in self.NAMES.items()}
        per_pos = f"{prefix}num_accepted_tokens_per_pos_total"
        positions = {
            key.partition("position=")[2].split(",")[0].rstrip("}")  # metric_samples' keys
            for key in samples
            if key.startswith(per_pos)
        }
        for pos in sorted(positions, key=int):
            out[f"pos{pos}"] = http.total(samples, per_pos, position=pos)
        return out if any(samples) else {}

    def window_counts(
        self, before: Counts, after: Counts, streams: Sequence[Stream]
    ) -> Counts | None:
        if not before:
            return None
        delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
        return delta if delta.get("drafts", 0.0) > 0 else None

    def measure(self, counts: Counts, k: int | None) -> Measured | None:
        steps = counts.get("drafts", 0.0)
        if steps <= 0:
            return None
        positions = sorted(
            (key for key in counts if key.startswith("pos")), key=lambda x: int(x[3:])
        )
        figures = {"per_position": [round(counts[key] / steps, 4) for key in positions]}
        tau = 1 + counts.get("accepted", 0.0) / steps
        return Measured(tau, counts.get("proposed", 0.0) / steps, figures if positions else {})
