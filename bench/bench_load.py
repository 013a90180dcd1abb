"""load_plan alone on no-op chains (bench_engine's write_plan), each run in a fresh
interpreter after the imports, as `orch run` meets it (bench_engine's PHASES, which then runs
the plan too): median ms and ms per task.

    .venv/bin/python bench/bench_load.py [--reps 9] [N ...]   (default N: 1000 2000)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_engine import ENV, PHASES, PYTHON, write_plan


def child(code: str, *argv: str) -> str:
    """What `python -c code argv...` prints, run as the bench's children are."""
    return subprocess.run(
        [PYTHON, "-c", code, *argv], env=ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 2000])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    # Bytecode first, as pip writes an installed package's, for the orchestrator the runs
    # import (from the working directory, PYTHONPATH or the install: run it from another
    # checkout's folder to measure that one).
    package = Path(child("import orchestrator; print(orchestrator.__file__)")).parent
    print(f"load_plan of {package}")
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(package)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = write_plan(Path(tmp), "chain", n)
            # PHASES prints [imports, load_plan, execute]; each rep a store of its own
            stores = [Path(tmp) / f"chain{n}-{i}.db" for i in range(args.reps)]
            samples = [json.loads(child(PHASES, str(path), str(db)))[1] for db in stores]
            ms = statistics.median(samples) * 1000
            print(f"chain {n}: load_plan {ms:.1f} ms median of {args.reps}, {ms / n:.4f} ms/task")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
