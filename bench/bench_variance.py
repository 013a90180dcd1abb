"""Where the rehearsal's run-to-run spread comes from: the same level across server launches.

    scripts/vllm_cpu/setup.sh && python bench/bench_variance.py [--launches 4] [--settings ...]

The rehearsal's verdicts compare medians of windows measured inside one server launch each;
their intervals know nothing of what changes from one launch to the next. This bench launches
the rehearsal's base server (tiny target, float32, 8 running requests, engine at nice 10)
`--launches` times per setting, the settings interleaved so the machine's drift hits them
alike, and measures the rehearsal's levels (1, 4, 8) with bench.serve's own code and the
rehearsal's parameters (16 requests of 32 tokens in, 48 out, windows until the last 3 agree
within 10%, at most 8). Per setting and level it prints:

- tok/s: the median over launches of each launch's median;
- within: the median over launches of the kept windows' (max - min) / median: what one
  launch's interval says;
- between: (max - min) / median of the launches' medians: what a second run would see;
- unstable: launches whose windows never agreed;
- the wall time of one launch plus its three levels.

Settings (pick with `--settings`, comma-separated):

- `today`: as the rehearsal ran before this bench (client and server share both cores);
- `long`: windows of 64 requests instead of 16 (4x the tokens per window);
- `pinned`: the engine and its OpenMP threads on CPU 1, the API process and the client on
  CPU 0 (VLLM_CLI_ENGINE_CPUS): a GPU host's split, where the engine does not compete with
  the process that streams its tokens;
- `pinned-long`: both;
- `rehearsal`: pinned, windows of 32 requests (plans/rehearsal.yaml since this bench).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_loadgen import ROOT, SERVERS, free_port, wait_healthy

LEVELS = (1, 4, 8)


@dataclass(frozen=True)
class Setting:
    requests: int  # per window
    engine_cpus: str  # VLLM_CLI_ENGINE_CPUS: "" leaves the engine where the kernel puts it
    client_cpus: str  # VLLM_CLI_API_CPUS and the client's: "" for all


SETTINGS = {
    "today": Setting(16, "", ""),
    "long": Setting(64, "", ""),
    "pinned": Setting(16, "1", "0"),
    "pinned-long": Setting(64, "1", "0"),
    "rehearsal": Setting(32, "1", "0"),
}


@dataclass
class Launch:
    wall_s: float
    levels: dict[int, tuple[float, float, bool]] = field(default_factory=dict)  # median, width


def launch(setting: Setting, work: Path) -> Launch:
    """One server launch, the three levels measured on it, the server ended."""
    from tasks.benchmark.level import measure_level, merge_windows
    from tasks.benchmark.params import BenchParams, Target
    from tasks.benchmark.prompts import exact_lengths, load_prompts

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CLI_ENGINE_NICE": "10",
        "VLLM_CLI_ENGINE_CPUS": setting.engine_cpus,
        "VLLM_CLI_API_CPUS": setting.client_cpus,
        "TMPDIR": str(work),
    }
    started = time.perf_counter()
    server = subprocess.Popen(
        [
            str(SERVERS / "venv/bin/python"),
            str(ROOT / "scripts/vllm_cpu/vllm_cli.py"),
            "serve",
            str(SERVERS / "models/target"),
            "--host=127.0.0.1",
            f"--port={port}",
            "--served-model-name=tiny",
            "--max-num-seqs=8",
            "--dtype=float32",
            "--max-model-len=512",
            "--enforce-eager",
        ],
        stdout=(work / f"server-{port}.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    try:
        wait_healthy(url, server)
        p = BenchParams(
            url=url,
            requests=setting.requests,
            warmup=2,
            output_tokens=48,
            input_words=64,
            input_tokens=32,
            min_windows=3,
            max_windows=8,
            stability=0.1,
        )
        target = Target(url, "tiny", "openai", "vllm", {})
        prompts = exact_lengths(target, load_prompts(p), 32)
        out = Launch(0.0)
        for c in LEVELS:
            level = merge_windows(c, asyncio.run(measure_level(target, prompts, p, c, None)))
            lo, hi = level["interval"]["output_tok_s"]
            median = level["output_tok_s"]
            out.levels[c] = (median, (hi - lo) / median, bool(level["stable"]))
        out.wall_s = time.perf_counter() - started
        return out
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def show(runs: dict[str, list[Launch]]) -> None:
    print(
        f"rehearsal base server, {len(next(iter(runs.values())))} launches per setting, "
        "interleaved; levels measured with bench.serve's windows (3 within 10%, at most 8)"
    )
    print(
        f"{'setting':12}{'level':>6}{'tok/s':>8}{'within':>8}{'between':>9}"
        f"{'unstable':>9}{'launch s':>9}   launch medians"
    )
    for name, launches in runs.items():
        wall = statistics.median(launch.wall_s for launch in launches)
        for c in LEVELS:
            medians = [launch.levels[c][0] for launch in launches]
            mid = statistics.median(medians)
            within = statistics.median(launch.levels[c][1] for launch in launches)
            unstable = sum(not launch.levels[c][2] for launch in launches)
            print(
                f"{name:12}{c:>6}{mid:8.0f}{within:8.0%}{(max(medians) - min(medians)) / mid:9.0%}"
                f"{unstable:>6}/{len(launches):<2}{wall:9.1f}   "
                + " ".join(f"{m:.0f}" for m in medians)
            )
    print(
        "within: one launch's window interval, (max - min) / median, median over launches; "
        "between: (max - min) / median of the launches' medians"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=4)
    ap.add_argument("--settings", default="today,long,pinned,pinned-long,rehearsal")
    args = ap.parse_args()
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    if unknown := [n for n in names if n not in SETTINGS]:
        sys.exit(f"unknown setting(s) {', '.join(unknown)}: choose from {', '.join(SETTINGS)}")
    if not (SERVERS / "models/.done").exists():
        sys.exit("run scripts/vllm_cpu/setup.sh first")
    if len(os.sched_getaffinity(0)) < 2 and any(SETTINGS[n].engine_cpus for n in names):
        sys.exit("the pinned settings need two CPUs")
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-variance-"))
    everywhere = os.sched_getaffinity(0)
    runs: dict[str, list[Launch]] = {n: [] for n in names}
    try:
        for rep in range(args.launches):
            for name in names if rep % 2 == 0 else names[::-1]:
                setting = SETTINGS[name]
                cpus = {int(c) for c in setting.client_cpus.split(",") if c}
                os.sched_setaffinity(0, cpus or everywhere)
                try:
                    runs[name].append(launch(setting, work))
                finally:
                    os.sched_setaffinity(0, everywhere)
                got = runs[name][-1]
                print(
                    f"  {name} launch {rep + 1}: {got.wall_s:.0f}s, "
                    + ", ".join(f"c={c} {m:.0f}" for c, (m, _, _) in got.levels.items()),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    show(runs)


if __name__ == "__main__":
    main()
