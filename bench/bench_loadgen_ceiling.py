"""How many tokens a second can bench.serve's load generator read before it times itself, not
the server, on 1, 2, 4 ... cores? Against bench/stream_server.py (a token every `--interval-ms`
per stream, on a fixed schedule: the true TPOT is known), at rising concurrency.

    python bench/bench_loadgen_ceiling.py [--client-cpus 1,2,4] [--streams 256,512,...]
                                          [--interval-ms 10] [--server-procs N] [--quick] [--json]

For each k of `--client-cpus`, the client runs on k CPUs (bench.serve's `cpus`) as k processes
(`client_processes`; k = 1 is the one event loop in this process), and the server on all the
other CPUs, as many processes (`--server-procs` to choose). The streams rise until a window is
refused. Each level is one window of the real load generator (tasks/benchmark/serve.py: `clients`,
judged by `judge_window`, as measure_level judges it) with `requests` = 2 x streams of 100
tokens (50 with `--quick`), the server started afresh for it. Printed per level: the output
tok/s the schedule gives and what the client measured, its median TPOT against the interval,
the busiest client process's CPU share and how long it was behind (LoopWatch), kept or
refused (and why), and how late the server's own writes were (p99): a server behind its
schedule is no ruler, and the level says so (the streams stop rising there). Per k: the
ceiling, the highest kept tok/s ("at least" where nothing was refused), and its ratio to one
core's.

Needs k + 1 CPUs at least; 4 cores' ceiling needs a host of 8 or more to leave the server room.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STREAMS = "256,512,1024,2048,4096"
QUICK_STREAMS = "256,1024,4096"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    cpus: list[int], procs: int, interval_ms: float
) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "stream_server.py"),
            str(port),
            "--procs",
            str(procs),
            "--interval-ms",
            str(interval_ms),
            "--cpus",
            ",".join(map(str, cpus)),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return server, url
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit(f"stream_server.py did not answer on {url}: {server.communicate()[1]}")


def server_late_ms(server: subprocess.Popen[str]) -> float:
    """The worst of the server processes' p99 lateness of their token writes (ms)."""
    server.send_signal(signal.SIGTERM)
    _, said = server.communicate(timeout=60)
    # The processes write one JSON object each to the same pipe: read them however they met.
    late, at, decoder = [], said.find("{"), json.JSONDecoder()
    while at != -1:
        obj, end = decoder.raw_decode(said, at)
        late.append(obj["late_p99_ms"])
        at = said.find("{", end)
    if not late:
        raise SystemExit(f"stream_server.py said nothing of its lateness: {said[-500:]}")
    return float(max(late))


def level(url: str, streams: int, tokens: int, interval: float, cpus: list[int]) -> dict[str, Any]:
    """One window at `streams` streams, the client on `cpus`, as len(cpus) processes."""
    from tasks.benchmark.params import BenchParams, Target
    from tasks.benchmark.pool import clients
    from tasks.benchmark.prompts import load_prompts
    from tasks.benchmark.serve import pinned
    from tasks.benchmark.windows import judge_window

    p = BenchParams(
        url=url,
        requests=2 * streams,
        warmup=1,
        output_tokens=tokens,
        input_words=4,
        min_windows=1,
        max_windows=1,
        request_timeout=120,
        cpus=cpus,
        client_processes=len(cpus),
    )
    target = Target(url, "tiny", "openai", None, {})

    async def window() -> Any:
        async with clients(target, load_prompts(p), p, streams) as run:
            return await run(f"{streams} streams")

    started = time.perf_counter()
    with pinned(cpus):
        outcomes, duration, loads = asyncio.run(window())
    figures, problems, fatal = judge_window(streams, outcomes, duration, loads, p)
    client = figures["client"]
    return {
        "streams": streams,
        "processes": client.get("processes", 1),
        "schedule_tok_s": round(streams / interval, 1),
        "measured_tok_s": round(figures["output_tok_s"], 1),
        "tpot_p50_ms": figures["tpot"].get("p50"),
        "client": client,
        "kept": not problems and not fatal,
        "why": "; ".join(filter(None, [fatal, *problems])),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def measure(k: int, cpus: list[int], args: argparse.Namespace, tokens: int) -> dict[str, Any]:
    """The streams rising, k client CPUs and the rest the server's, until a window is
    refused or the server falls behind."""
    client, rest = cpus[:k], cpus[k:]
    procs = args.server_procs or len(rest)
    interval = args.interval_ms / 1000
    rows = []
    for streams in (int(n) for n in args.streams.split(",")):
        server, url = start_server(rest, procs, args.interval_ms)
        try:
            row = level(url, streams, tokens, interval, client)
        finally:
            row_late = server_late_ms(server)
        row["server_late_p99_ms"] = round(row_late, 2)
        # A write half an interval late: the server's schedule, the ruler, has slipped.
        row["server_behind"] = row_late > args.interval_ms / 2
        rows.append(row)
        if not args.json:
            print(format_row(row, args.interval_ms), flush=True)
        if not row["kept"] or row["server_behind"]:
            break
    kept = [r for r in rows if r["kept"] and not r["server_behind"]]
    best = max(kept, key=lambda r: r["measured_tok_s"], default=None)
    return {
        "client_cpus": k,
        "client_cpu_ids": client,
        "server_cpu_ids": rest,
        "server_procs": procs,
        "levels": rows,
        "ceiling_tok_s": best["measured_tok_s"] if best else None,
        "ceiling_streams": best["streams"] if best else None,
        # A window refused with the server on schedule: the client's ceiling was reached;
        # else it is above what was measured (the bench says "at least").
        "reached": any(not r["kept"] and not r["server_behind"] for r in rows),
        "server_behind_at": next((r["streams"] for r in rows if r["server_behind"]), None),
    }


def format_row(r: dict[str, Any], interval_ms: float) -> str:
    c = r["client"]
    tpot = f"{r['tpot_p50_ms']:.2f}ms" if r["tpot_p50_ms"] is not None else "-"
    verdict = "kept" if r["kept"] else f"refused: {r['why'][:160]}"
    if r["server_behind"]:
        verdict += f" (SERVER BEHIND, {r['server_late_p99_ms']:.1f} ms late p99: no ruler)"
    return (
        f"{r['streams']:>8} {r['processes']:>5} {r['schedule_tok_s']:>10.0f} "
        f"{r['measured_tok_s']:>10.0f} {tpot:>9}/{interval_ms:g} {c['busy']:>5.2f} "
        f"{c['late']:>6.0%} {r['server_late_p99_ms']:>8.1f}  {verdict}"
    )


def summary(run: dict[str, Any], one: dict[str, Any] | None) -> str:
    k = run["client_cpus"]
    if run["ceiling_tok_s"] is None:
        return f"{k} client CPU(s): no level kept"
    line = (
        f"{k} client CPU(s): ceiling {'' if run['reached'] else 'at least '}"
        f"{run['ceiling_tok_s']:,.0f} tok/s ({run['ceiling_streams']} streams)"
    )
    if run["server_behind_at"] is not None:
        line += f"; the server fell behind at {run['server_behind_at']} streams: give it more CPUs"
    if one is not None and one["ceiling_tok_s"] and k != 1:
        line += f"; {run['ceiling_tok_s'] / one['ceiling_tok_s']:.2f}x one CPU's"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-cpus", default="1,2,4", help="client CPU counts to measure")
    ap.add_argument("--streams", default=None, help=f"rising concurrency (default {STREAMS})")
    ap.add_argument("--server-procs", type=int, default=None, help="default: one per CPU left")
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help=f"streams {QUICK_STREAMS}, 50 tokens")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.streams = args.streams or (QUICK_STREAMS if args.quick else STREAMS)
    tokens = 50 if args.quick else 100
    sys.path.insert(0, str(ROOT))
    # A socket per stream at both ends: thousands of them.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cpus = sorted(os.sched_getaffinity(0))
    ks = [int(k) for k in args.client_cpus.split(",")]
    if too_many := [k for k in ks if k >= len(cpus)]:
        raise SystemExit(
            f"--client-cpus {too_many}: this host gives {len(cpus)} CPUs, and the "
            "server needs at least one besides the client's"
        )
    if not args.json:
        print(
            f"load generator ceiling: a token every {args.interval_ms:g} ms a stream, {tokens} "
            f"tokens a request, 2 x streams requests a window; {len(cpus)} CPUs, open files "
            f"{hard}"
        )
    runs = []
    for k in ks:
        if not args.json:
            print(
                f"\n{k} client CPU(s) {cpus[:k]}, server on {cpus[k:]} "
                f"({args.server_procs or len(cpus) - k} processes)\n"
                f"{'streams':>8} {'procs':>5} {'schedule':>10} {'measured':>10} "
                f"{'TPOT p50/interval':>17} {'busy':>5} {'behind':>6} {'srv late':>8}  verdict",
                flush=True,
            )
        runs.append(measure(k, cpus, args, tokens))
    one = next((r for r in runs if r["client_cpus"] == 1), None)
    for run in runs:
        if one is not None and one["ceiling_tok_s"] and run["ceiling_tok_s"]:
            run["ratio_to_1"] = round(run["ceiling_tok_s"] / one["ceiling_tok_s"], 3)
    if args.json:
        doc = {
            "interval_ms": args.interval_ms,
            "tokens": tokens,
            "cpus": len(cpus),
            "runs": runs,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print()
    for run in runs:
        print(summary(run, one))
    return 0


if __name__ == "__main__":
    sys.exit(main())
