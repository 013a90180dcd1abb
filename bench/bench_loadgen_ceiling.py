"""How many streams can bench.serve's load generator read before it times itself, not the
server? Against bench/stream_server.py (a token every `--interval-ms` per stream, on a fixed
schedule: the true TPOT is known), at rising concurrency.

    python bench/bench_loadgen_ceiling.py [--streams 64,256,1024] [--server-procs 4]
                                          [--interval-ms 10] [--client-cpu N] [--json]

Each level is one window of the real measure_level (tasks/loadgen.py) with `requests` = 2 x
streams of 100 tokens. Printed per level: the output tok/s the server's schedule gives and what
the client measured, the client's median TPOT against the interval, its event loop's CPU share
and how long it was behind (LoopWatch), and whether the window was kept or refused, and why.
Past its ceiling the client's figures drift from the schedule, and the window must be refused
("the load generator was the bottleneck") rather than reported. The server's own lateness
(its p99 write past due) is printed too: a server behind its schedule is no ruler.

The client is one event loop, so one core: `--client-cpu` pins it (keep it off the server's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def level(url: str, streams: int, interval: float) -> dict[str, Any]:
    from orchestrator import TaskError
    from tasks.loadgen import BenchParams, Target, load_prompts, measure_level

    p = BenchParams(
        url=url,
        requests=2 * streams,
        warmup=1,
        output_tokens=TOKENS,
        input_words=4,
        min_windows=1,
        max_windows=1,
        request_timeout=120,
    )
    target = Target(url, "tiny", "openai", None, {})
    started = time.perf_counter()
    try:
        measured = asyncio.run(measure_level(target, load_prompts(p), p, streams, None))
    except TaskError as exc:  # refused: the reason says whose fault
        return {"streams": streams, "kept": False, "why": str(exc).split(": ", 1)[-1]}
    window = measured.windows[0]
    f = window.figures
    return {
        "streams": streams,
        "kept": True,
        "schedule_tok_s": round(streams / interval, 1),
        "measured_tok_s": round(f["output_tok_s"], 1),
        "tpot_p50_ms": round(f["tpot"].get("p50", 0.0), 2),
        "client": f["client"],
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="64,256,512,1024,2048")
    ap.add_argument("--server-procs", type=int, default=4)
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--client-cpu", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "stream_server.py"),
            str(port),
            "--procs",
            str(args.server_procs),
            "--interval-ms",
            str(args.interval_ms),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        rows = [level(url, int(n), args.interval_ms / 1000) for n in args.streams.split(",")]
    finally:
        server.send_signal(signal.SIGTERM)
        _, said = server.communicate(timeout=60)
    lateness = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    server_late = max((s["late_p99_ms"] for s in lateness), default=None)
    doc = {
        "interval_ms": args.interval_ms,
        "server_procs": args.server_procs,
        "server_late_p99_ms": server_late,
        "cpus": os.cpu_count(),
        "levels": rows,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"load generator ceiling: a token every {args.interval_ms:g} ms a stream, "
        f"{TOKENS} tokens, server {args.server_procs} processes (its writes p99 "
        f"{server_late:.1f} ms late), {os.cpu_count()} CPUs"
    )
    print(
        f"{'streams':>8} {'schedule':>10} {'measured':>10} {'TPOT p50':>9} {'busy':>5} "
        f"{'behind':>6}  verdict"
    )
    for r in rows:
        if not r["kept"]:
            print(
                f"{r['streams']:>8} {'':>10} {'':>10} {'':>9} {'':>5} {'':>6}  refused: "
                f"{r['why'][:150]}"
            )
            continue
        c = r["client"]
        print(
            f"{r['streams']:>8} {r['schedule_tok_s']:>10.0f} {r['measured_tok_s']:>10.0f} "
            f"{r['tpot_p50_ms']:>7.2f}ms {c['busy']:>5.2f} {c['late']:>6.0%}  kept"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
