"""Do two runs of the rehearsal give the same answer? The rehearsal N times, verdicts compared.

    scripts/vllm_cpu/setup.sh && python bench/bench_rehearsal.py [--runs 5] [--var K=V ...]
    python bench/bench_rehearsal.py --plan plans/rehearsal_sglang.yaml   # SGLang's (setup.sh)

Each run starts the "production" vLLM (scripts/vllm_cpu/serve.sh), runs `orch run PLAN` with a
fresh store, and reads every analysis's findings: each candidate's outcome at each
concurrency (win, even, loss, inconclusive) and its speed-up. After the run it counts the
engine processes left (none should be). It prints one
verdict table per run with its wall time, then the judgement: a (candidate, concurrency)
level that is a win in one run and a loss in another is a FLIP (the failure this bench
exists to catch); a level with the same win or loss in every run is decisive.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_loadgen import ROOT, SERVERS, free_port, wait_healthy

ORCH = Path(sys.executable).parent / "orch"
OUTCOMES = (("wins_at", "win"), ("even_at", "even"), ("loses_at", "loss"))
Levels = dict[tuple[str, int], tuple[str, str]]  # (candidate, concurrency) -> outcome, figure


def one_run(work: Path, plan: Path, extra: list[str]) -> tuple[float, Levels, dict[str, str], int]:
    """One rehearsal with a fresh store: wall time, outcomes per level, verdicts, exit code."""
    production_port, port = free_port(), free_port()
    log = (work / f"production-{production_port}.log").open("w")
    production = subprocess.Popen(
        [str(ROOT / "scripts/vllm_cpu/serve.sh"), str(production_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    store = work / f"rehearsal-{production_port}.db"
    try:
        wait_healthy(f"http://127.0.0.1:{production_port}", production)
        started = time.monotonic()
        rc = subprocess.run(
            [
                str(ORCH),
                "run",
                str(plan),
                "-q",
                "--store",
                str(store),
                "--var",
                f"servers={SERVERS}",
                "--var",
                f"production_port={production_port}",
                "--var",
                f"port={port}",
                *extra,
            ],
            cwd=ROOT,
            stdout=(work / "orch.log").open("a"),
            stderr=subprocess.STDOUT,
        ).returncode
        wall = time.monotonic() - started
    finally:
        if production.poll() is None:
            os.killpg(production.pid, signal.SIGKILL)
        production.wait()
    board = subprocess.run(
        [str(ORCH), "status", "--store", str(store), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = {
        f["key"]: f
        for t in json.loads(board.stdout)["tasks"]
        if any(f["key"].endswith(".verdict") for f in t["findings"])  # an analyze.compare
        for f in t["findings"]
    }
    levels: Levels = {}
    verdicts = {}
    for key, f in found.items():
        name, _, what = key.partition(".")
        if what == "verdict":
            verdicts[name] = str(f["value"])
        for finding, outcome in (*OUTCOMES, ("inconclusive_at", "inconclusive")):
            if what == finding and f["value"]:
                for c in str(f["value"]).split(", "):
                    speedup = found.get(f"{name}.speedup_c{c}", {}).get("value")
                    levels[(name, int(c))] = (outcome, f"{speedup}x" if speedup else "")
    return wall, levels, verdicts, rc


def engines_left() -> int:
    """Processes of a vLLM or SGLang server still alive (the rehearsal stops every one)."""
    names = ("vllm_cli.py", "sglang_cli.py", "sglang::", "EngineCore")
    left = 0
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        left += entry.isdigit() and any(n in cmdline for n in names)
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--var", action="append", default=[], help="passed to orch run")
    ap.add_argument("--plan", type=Path, default=ROOT / "plans/rehearsal.yaml")
    args = ap.parse_args()
    if not (SERVERS / "models/.done").exists():
        sys.exit("run scripts/vllm_cpu/setup.sh first")
    extra = [x for v in args.var for x in ("--var", v)]
    work = Path(tempfile.mkdtemp(prefix="bench-rehearsal-"))
    runs = []
    try:
        for number in range(1, args.runs + 1):
            runs.append(one_run(work, args.plan.resolve(), extra))
            wall, levels, verdicts, rc = runs[-1]
            left = engines_left()
            print(
                f"## run {number}: {wall:.0f} s, exit {rc}, engine processes left: {left}",
                flush=True,
            )
            for (name, c), (outcome, figure) in sorted(levels.items()):
                print(f"  {name:8} c={c:<3} {outcome:13} {figure}", flush=True)
            for name, text in sorted(verdicts.items()):
                print(f"  {name}: {text}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = sorted({k for _, levels, _, _ in runs for k in levels})
    flips, decisive = [], []
    for key in keys:
        seen = [levels.get(key, ("missing", ""))[0] for _, levels, _, _ in runs]
        if "win" in seen and "loss" in seen:
            flips.append(key)
        if seen[0] in ("win", "loss") and all(s == seen[0] for s in seen):
            decisive.append(key)
    print(
        f"\n{len(runs)} runs, {len(keys)} (candidate, concurrency) levels: "
        f"{len(flips)} flipped between a win and a loss, {len(decisive)} decisive in every run "
        f"({', '.join(f'{n} c={c}' for n, c in decisive) or 'none'}); wall "
        + ", ".join(f"{wall:.0f}" for wall, *_ in runs)
        + " s"
    )
    sys.exit(1 if flips else 0)


if __name__ == "__main__":
    main()
