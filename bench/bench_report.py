"""`orch report` of a finished chain at 1,000, 4,000 and 8,000 tasks, per task, against
`orch status` of the same store measured in the same run.

    python bench/bench_report.py [--kind python|shell] [--sizes 1000,4000,8000] [--reps 3]

Each chain (bench_engine's `write_plan`: each task needs the previous) is run once, untimed;
then `orch report` and `orch status` of its store are timed as whole processes, in turn, the
median of `--reps`. `--kind shell` runs the issue's plan (`command: "true"`, a process a task:
~16 ms a task to build the stores, some minutes for 8,000); the default no-op `python` tasks
build them in seconds, and the report reads the same rows of either. The figure to watch is
the report's cost per task and its marginal cost between sizes: flat when the report grows
linearly with the plan (issue 40: 8,000 tasks took ~40 s, a timeline with a row per task).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench_engine import ORCH, PYTHON, proc, round_robin, timed, write_plan


def bench(tmp: Path, kind: str, sizes: list[int], reps: int) -> list[tuple[int, float, float]]:
    """(tasks, report s, status s) for each size."""
    got = []
    for n in sizes:
        plan = write_plan(tmp, "chain", n, kind)
        store = tmp / f"{plan.stem}.db"
        built = timed(proc([ORCH, "run", str(plan), "-q", "--store", str(store)]))
        print(f"  {n} {kind} tasks run in {built:.1f} s (untimed set-up)", file=sys.stderr)
        report = [ORCH, "report", str(plan), "--store", str(store), "-o", str(tmp / f"out{n}")]
        status = [ORCH, "status", "--store", str(store)]
        report_s, status_s = round_robin([report, status], reps)
        got.append((n, report_s, status_s))
    return got


def render(rows: list[tuple[int, float, float]], kind: str, reps: int) -> str:
    out = [
        f"orch report bench: chains of {kind} tasks, python {sys.version.split()[0]},"
        f" {os.cpu_count()} CPUs, median of {reps}, whole processes",
        "",
        f"{'tasks':>6} {'report ms':>10} {'status ms':>10} {'report/status':>14}"
        f" {'report ms/task':>15} {'marginal ms/task':>17}",
    ]
    previous: tuple[int, float, float] | None = None
    for n, report_s, status_s in rows:
        marginal = (
            f"{(report_s - previous[1]) * 1000 / (n - previous[0]):.3f}"
            if previous is not None
            else ""
        )
        out.append(
            f"{n:>6} {report_s * 1000:>10.0f} {status_s * 1000:>10.0f}"
            f" {report_s / status_s:>13.1f}x {report_s * 1000 / n:>15.3f} {marginal:>17}"
        )
        previous = (n, report_s, status_s)
    (n0, r0, _), (n1, r1, _) = rows[0], rows[-1]
    out.append(
        f"\n{n1 / n0:.0f}x the tasks, {r1 / r0:.1f}x the report's time"
        " (linear growth with a fixed start-up: under the tasks' ratio)"
    )
    out.append(f"(`python -c pass` here: {timed(proc([PYTHON, '-c', 'pass'])) * 1000:.0f} ms)")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kind", choices=("python", "shell"), default="python")
    parser.add_argument("--sizes", default="1000,4000,8000", help="chain lengths, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.sizes.split(","))
    with tempfile.TemporaryDirectory(prefix="orch-bench-report-") as tmp:
        rows = bench(Path(tmp), args.kind, sizes, args.reps)
    print(render(rows, args.kind, args.reps))


if __name__ == "__main__":
    main()
