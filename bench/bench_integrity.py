"""What checking the store costs at every open: quick_check, integrity_check, orch's invariants.

    python bench/bench_integrity.py [--tasks 1000] [--repeat 50]

Runs a plan of `--tasks` python tasks that each record a finding (one store of the size the
engine bench uses), then times, on that store, each check a Store open can make: SQLite's
`PRAGMA quick_check` (pages and records), `PRAGMA integrity_check` (that too, and every index
against its table: the damage quick_check passes, which can hide a finding), and orch's own
invariant queries (store.invariant_queries: required values, types, statuses). Median of
`--repeat` each, and against `orch status PLAN` whole, measured in the same run.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.store.schema import SCHEMA_VERSION, invariant_queries  # noqa: E402

ORCH = Path(sys.executable).parent / "orch"


def median_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-integrity-") as tmp:
        folder = Path(tmp)
        (folder / "bench_found.py").write_text("def found():\n    return {'k': 1}\n")
        lines = ["name: integrity", "tasks:"]
        task = "    params: {function: 'bench_found:found'}"
        for i in range(args.tasks):
            lines += [f"  - id: t{i}", "    kind: python", task]
        plan = folder / "plan.yaml"
        plan.write_text("\n".join(lines) + "\n")
        subprocess.run([str(ORCH), "run", str(plan), "-q"], check=True, capture_output=True)
        store = folder / ".orch" / "integrity.db"
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
        queries = invariant_queries(SCHEMA_VERSION)
        figures = {
            "PRAGMA quick_check": median_ms(
                lambda: conn.execute("PRAGMA quick_check(1)").fetchone(), args.repeat
            ),
            "PRAGMA integrity_check": median_ms(
                lambda: conn.execute("PRAGMA integrity_check(1)").fetchone(), args.repeat
            ),
            "orch's invariants": median_ms(
                lambda: [conn.execute(q).fetchone() for _, q in queries], args.repeat
            ),
        }
        conn.close()
        status = median_ms(
            lambda: subprocess.run([str(ORCH), "status", str(plan)], capture_output=True),
            max(args.repeat // 5, 3),
        )
        size = store.stat().st_size
    print(f"a store of {args.tasks} tasks with a finding each ({size / 1024:.0f} KiB)")
    for name, ms in figures.items():
        print(f"  {name:24} {ms:7.2f} ms  ({ms / status:.1%} of `orch status`, {status:.0f} ms)")


if __name__ == "__main__":
    main()
