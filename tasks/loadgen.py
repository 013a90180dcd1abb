"""`bench.serve`: a streaming, asynchronous load generator for OpenAI-compatible servers.

A sweep over concurrency levels; at each, `warmup` requests that are not counted, then
`requests` requests with at most `concurrency` in flight (vLLM's and SGLang's
`--max-concurrency`, with every request sent at once: `--request-rate inf`). Definitions are
theirs (serving-reference.md section 3):

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

Speculative decoding is measured from the engine's own counters, taken before and after each
level's timed part (warm-up excluded): vLLM's `vllm:spec_decode_*` counters from /metrics
(tau = 1 + accepted / drafts, k = draft tokens / drafts); SGLang's per-request `meta_info`
through its native /generate (tau = sum completion_tokens / sum spec_verify_ct, token-
weighted). Every figure is reported as tau with k, the strict rate (tau - 1) / k and the
per-token alpha, so two engines' numbers compare.

Results: findings, and the `orch.bench/v1` JSON (tasks/analyze.py) that analyze.compare reads.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import Context, Duration, Task, TaskError
from probes import http
from tasks.analyze import SCHEMA, alpha_from_tau, strict_rate

WORDS = [
    "the", "a", "of", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from",
    "that", "this", "it", "be", "are", "model", "server", "token", "stream", "metric", "request",
    "response", "cache", "batch", "draft", "hello", "world", "fast", "slow", "small", "large",
    "test", "check", "run", "start", "stop", "queue", "time", "one", "two", "three", "four",
    "five", "six", "seven", "eight", "nine", "ten", "zero"
]
VLLM_SPEC = "vllm:spec_decode_"


class BenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(None, description="name of a server.launch server (its task id)")
    url: str | None = Field(None, description="or the base URL of any OpenAI-compatible server")
    model: str | None = Field(None, description="served model name (default: the server's)")
    api: Literal["auto", "openai", "sglang"] = Field(
        "auto", description="openai: /v1/completions; sglang: native /generate (meta_info "
                            "gives acceptance); auto: sglang for an SGLang server")
    concurrency: list[Annotated[int, Field(ge=1)]] = Field([1, 8, 32, 128], min_length=1)
    requests: int = Field(64, ge=1, description="timed requests per level")
    warmup: int = Field(2, ge=0, description="requests per level not counted")
    dataset: str | None = Field(
        None, description='JSONL of {"prompt": ..., "output_tokens": N}; default: generated')
    input_words: int = Field(128, ge=1, description="generated prompts: words per prompt")
    input_tokens: int | None = Field(
        None, ge=1, description="generated prompts of exactly this many tokens, cut with the "
                                "server's own tokenizer (POST /tokenize: vLLM)")
    output_tokens: int = Field(128, ge=1)
    temperature: float = 0.0
    ignore_eos: bool = True
    seed: int = 0
    request_timeout: float = Field(600.0, gt=0)
    output: str | None = Field(None, description="result JSON; default <run dir>/<task>.json")
    label: str | None = None
    progress_every: Duration = 10.0

    @model_validator(mode="after")
    def _target(self) -> BenchParams:
        if (self.server is None) == (self.url is None):
            raise ValueError("give exactly one of `server` (a server.launch task's id) or `url`")
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
    error: str = ""


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
        return [Prompt(" ".join(rnd.choice(WORDS) for _ in range(p.input_words)),
                       p.output_tokens) for _ in range(max(p.requests, 1))]
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
            prompts.append(Prompt(str(row["prompt"]), int(row.get("output_tokens",
                                                                     p.output_tokens))))
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskError(f"{path}:{number}: not a {{\"prompt\": ...}} line ({exc})") from None
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
            got = http.request_json(target.url + "/tokenize", {
                "model": target.model, "prompt": prompt.text, "add_special_tokens": False})
        except http.Unreachable as exc:
            raise TaskError(f"input_tokens needs the server's /tokenize (vLLM has it): {exc}; "
                            "use input_words or a dataset") from None
        ids = list(got.get("tokens") or [])
        if len(ids) < tokens:
            raise TaskError(f"a generated prompt is only {len(ids)} tokens; raise input_words "
                            f"above {tokens}")
        out.append(Prompt(prompt.text, prompt.output_tokens, ids[:tokens]))
    return out


def request_body(target: Target, prompt: Prompt, p: BenchParams) -> tuple[str, dict[str, Any]]:
    """Path and JSON body of one streaming request."""
    if target.api == "sglang":
        source = {"text": prompt.text} if prompt.ids is None else {"input_ids": prompt.ids}
        return "/generate", {**source, "stream": True, "sampling_params": {
            "max_new_tokens": prompt.output_tokens, "temperature": p.temperature,
            "ignore_eos": p.ignore_eos}}
    return "/v1/completions", {
        "model": target.model, "prompt": prompt.text if prompt.ids is None else prompt.ids,
        "max_tokens": prompt.output_tokens,
        "temperature": p.temperature, "ignore_eos": p.ignore_eos, "stream": True,
        "stream_options": {"include_usage": True}}


def read_chunk(api: str, data: dict[str, Any], out: Outcome, state: dict[str, Any]) -> bool:
    """Fold one streamed JSON chunk into `out`; True if it carried tokens.

    OpenAI: choices[0].text is the delta; the last chunk has `usage`. SGLang /generate: `text`
    is the whole text so far, `meta_info` the running counts (section 1.5).
    """
    if api == "sglang":
        text: str = data.get("text", "")
        seen: int = state.get("seen", 0)
        state["seen"] = len(text)
        meta = data.get("meta_info") or {}
        out.output_tokens = int(meta.get("completion_tokens", out.output_tokens))
        out.prompt_tokens = int(meta.get("prompt_tokens", out.prompt_tokens))
        out.verify_ct = int(meta.get("spec_verify_ct", out.verify_ct))
        return len(text) > seen
    if usage := data.get("usage"):
        out.output_tokens = int(usage.get("completion_tokens") or 0)
        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    return bool(data.get("choices"))  # text may be empty (held back by the detokenizer)


async def one_request(session: Any, target: Target, prompt: Prompt, p: BenchParams) -> Outcome:
    import aiohttp

    path, body = request_body(target, prompt, p)
    out = Outcome(ok=False)
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


# --- a level -------------------------------------------------------------------------------------

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
    """The level's figures, keys as orch.bench/v1 levels."""
    done = [o for o in outcomes if o.ok]
    output = sum(o.output_tokens for o in done)
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in done if o.output_tokens > 1]
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
        "ttft": stats_ms([o.ttft for o in done]),
        "tpot": stats_ms(tpots),
        "itl": stats_ms([gap for o in done for gap in o.itl]),
        "e2e": stats_ms([o.latency for o in done]),
    }
    level["ttft_ms"] = level["ttft"].get("mean")
    level["tpot_ms"] = level["tpot"].get("mean")
    if errors:
        level["first_error"] = errors[0][:300]
    return level


async def run_level(target: Target, prompts: list[Prompt], p: BenchParams, concurrency: int,
                    before_timed: Callable[[], None],
                    progress: Callable[[str], None] | None = None,
                    every: float = 10.0) -> tuple[list[Outcome], float]:
    """Warm-up, then the timed requests with at most `concurrency` in flight; every `every`
    seconds `progress` hears how far the level is (a c=128 level on a big model takes long)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=p.request_timeout)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        warm = [one_request(session, target, prompts[i % len(prompts)], p)
                for i in range(p.warmup)]
        for outcome in await asyncio.gather(*warm):
            if not outcome.ok:
                raise TaskError(f"warm-up request failed at c={concurrency}: {outcome.error}")
        await asyncio.to_thread(before_timed)
        gate = asyncio.Semaphore(concurrency)
        done: list[Outcome] = []

        async def limited(prompt: Prompt) -> Outcome:
            async with gate:
                outcome = await one_request(session, target, prompt, p)
            done.append(outcome)
            return outcome

        async def report() -> None:
            while progress is not None:
                await asyncio.sleep(every)
                tokens = sum(o.output_tokens for o in done)
                progress(f"c={concurrency}: {len(done)}/{p.requests} requests done, "
                         f"{tokens / (time.perf_counter() - started):.1f} tok/s so far")

        started = time.perf_counter()
        reporter = asyncio.create_task(report())
        try:
            outcomes = await asyncio.gather(*(limited(prompts[i % len(prompts)])
                                              for i in range(p.requests)))
        finally:
            reporter.cancel()
        return list(outcomes), time.perf_counter() - started


# --- speculation ---------------------------------------------------------------------------------

def vllm_spec_counters(url: str) -> dict[str, float]:
    """vLLM's spec-decode counters now (empty when speculation is off)."""
    samples = http.metric_samples(http.request(url + "/metrics").decode(), VLLM_SPEC)
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    out = {n: http.total(samples, f"{VLLM_SPEC}{n}_total") for n in names}
    positions = {key.partition("position=")[2].split(",")[0].rstrip("}")
                 for key in samples if key.startswith(f"{VLLM_SPEC}num_accepted_tokens_per_pos")}
    for pos in sorted(positions, key=int):
        out[f"pos{pos}"] = http.total(samples, f"{VLLM_SPEC}num_accepted_tokens_per_pos_total",
                                      position=pos)
    return out if any(samples) else {}


def acceptance(tau: float, k: float) -> dict[str, Any]:
    """tau with k, on one definition: strict rate (tau-1)/k and the per-token alpha."""
    k_int = round(k)
    found: dict[str, Any] = {"accept_length": tau, "draft_tokens": k_int,
                             "acceptance": strict_rate(tau, k_int),
                             "acceptance_definition": "strict"}
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
    per_pos = [d[key] / drafts for key in sorted((k for k in d if k.startswith("pos")),
                                                 key=lambda k: int(k[3:]))]
    if per_pos:
        found["per_position"] = [round(x, 4) for x in per_pos]
    return found


def sglang_acceptance(outcomes: list[Outcome], k: int | None) -> dict[str, Any] | None:
    verify = sum(o.verify_ct for o in outcomes if o.ok)
    if verify <= 0 or not k:
        return None
    tokens = sum(o.output_tokens for o in outcomes if o.ok)
    found = acceptance(tokens / verify, k)
    found.update(verify_passes=verify, output_tokens=tokens)
    return found


def combine(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Acceptance over the whole sweep, from the summed counts of every level."""
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
    verify = sum(s["verify_passes"] for s in specs)
    return acceptance(sum(s["output_tokens"] for s in specs) / verify, k)


# --- the task ------------------------------------------------------------------------------------

def resolve_target(ctx: Context, p: BenchParams) -> Target:
    server: dict[str, Any] = {}
    if p.server is not None:
        held = ctx.held(p.server)
        if held is None:
            raise TaskError(f"no server {p.server!r} is running: its server.launch task must "
                            "run first in this run (servers end with the run that started them)")
        server = held
    url = (p.url or server["url"]).rstrip("/")
    model = p.model or server.get("served_model")
    if model is None:
        models = http.request_json(url + "/v1/models")
        model = models["data"][0]["id"]
    engine = server.get("flavour") if server.get("flavour") in ("vllm", "sglang") else None
    api = p.api if p.api != "auto" else ("sglang" if engine == "sglang" else "openai")
    return Target(url, str(model), api, engine, server)


class BenchServe(Task[BenchParams]):
    """Benchmark a serving endpoint over a concurrency sweep; findings and orch.bench/v1."""

    Params = BenchParams

    def run(self, ctx: Context) -> None:
        p = self.params
        target = resolve_target(ctx, p)
        prompts = load_prompts(p)
        if p.input_tokens is not None:
            prompts = exact_lengths(target, prompts, p.input_tokens)
        # k as planned, else as SGLang resolved it (its auto choice, /server_info)
        k = target.server.get("draft_tokens") or target.server.get("speculative_num_steps")
        levels = []
        for concurrency in p.concurrency:
            before: dict[str, float] = {}  # vLLM's counters once warm-up is done

            def snapshot(into: dict[str, float] = before) -> None:
                if target.api == "openai":
                    into.update(_counters(target.url))

            outcomes, duration = asyncio.run(run_level(target, prompts, p, concurrency,
                                                       snapshot, ctx.progress,
                                                       p.progress_every))
            level = summarize_level(concurrency, outcomes, duration)
            if target.api == "sglang":
                spec = sglang_acceptance(outcomes, k)
            else:
                spec = vllm_acceptance(before, _counters(target.url)) if before else None
            if spec:
                level["spec"] = spec
            levels.append(level)
            ctx.progress(_level_line(level))
            if level["completed"] == 0:
                raise TaskError(f"c={concurrency}: every request failed: "
                                f"{level.get('first_error')}")
        result = self.result(target, levels)
        path = Path(p.output) if p.output else ctx.log_path.parent / f"{ctx.task_id}.json"
        path = path.resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        ctx.log("\n".join(_level_line(lv) for lv in levels))
        self.record(ctx, levels, result, path)

    def result(self, target: Target, levels: list[dict[str, Any]]) -> dict[str, Any]:
        p = self.params
        server = {"engine": target.engine, "version": target.server.get("version"),
                  "max_running_requests": target.server.get("max_running_requests")}
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "label": p.label or (f"{target.engine or 'server'} {target.model}"),
            "levels": levels,
            "server": {k: v for k, v in server.items() if v is not None},
            "benchmark": {"tool": "orch bench.serve", "api": target.api,
                          "dataset": p.dataset or (
                              f"generated, {p.input_tokens} tokens" if p.input_tokens
                              else f"generated, {p.input_words} words"),
                          "output_tokens": p.output_tokens, "requests": p.requests,
                          "temperature": p.temperature, "ignore_eos": p.ignore_eos},
        }
        if (spec := combine(levels)) is not None:
            spec.pop("per_position", None)
            out["spec"] = {"algorithm": target.server.get("algorithm"), **spec}
        return out

    def record(self, ctx: Context, levels: list[dict[str, Any]], result: dict[str, Any],
               path: Path) -> None:
        for lv in levels:
            c = f"c{lv['concurrency']}"
            ctx.finding(f"{c}.output_tok_s", round(lv["output_tok_s"], 1), "tok/s")
            if lv["tpot_ms"] is not None:
                ctx.finding(f"{c}.tpot_ms", round(lv["tpot_ms"], 2), "ms")
            ctx.finding(f"{c}.ttft_p50_ms", round(lv["ttft"]["p50"], 1), "ms")
            ctx.finding(f"{c}.achieved_concurrency", round(lv["achieved_concurrency"], 2))
            if lv["errors"]:
                ctx.finding(f"{c}.errors", lv["errors"], note=lv.get("first_error"))
        peak = max(levels, key=lambda lv: lv["output_tok_s"])
        ctx.finding("peak_output_tok_s", round(peak["output_tok_s"], 1), "tok/s",
                    note=f"at c={peak['concurrency']}")
        if spec := result.get("spec"):
            ctx.finding("accept_length", round(spec["accept_length"], 3),
                        note=f"tau, tokens per verify step with k={spec['draft_tokens']}")
            ctx.finding("draft_tokens", spec["draft_tokens"])
            ctx.finding("acceptance", round(spec["acceptance"], 4), "ratio",
                        note="accepted/proposed drafts = (tau-1)/k")
            if "alpha" in spec:
                ctx.finding("alpha", round(spec["alpha"], 3), note="per-token acceptance")
        ctx.finding("result", str(path), note=SCHEMA)


def _counters(url: str) -> dict[str, float]:
    try:
        return vllm_spec_counters(url)
    except http.Unreachable:
        return {}  # not vLLM, or no /metrics: no acceptance figures, not a failed benchmark


def _level_line(lv: dict[str, Any]) -> str:
    line = (f"c={lv['concurrency']}: {lv['output_tok_s']:.1f} tok/s, {lv['request_s']:.2f} req/s,"
            f" achieved {lv['achieved_concurrency']:.1f}, TTFT p50 "
            f"{lv['ttft'].get('p50', 0):.1f} ms, TPOT mean {lv['tpot_ms'] or 0:.2f} ms, "
            f"{lv['completed']} ok, {lv['errors']} errors")
    if spec := lv.get("spec"):
        line += (f"; tau {spec['accept_length']:.2f} (k={spec['draft_tokens']}), "
                 f"acceptance {spec['acceptance']:.1%}")
    return line
