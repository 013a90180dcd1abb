"""What masking a task's output costs: its output through orch (a secret registered) against
straight to the file (none), per MB.

    python bench/bench_logpump.py [--mb 64] [--repeat 5]

A child prints `--mb` MB of 100-byte lines (`yes` cut by `head`), through
orchestrator.proc.spawn.run_process as a task's command runs, `--repeat` times each way,
alternated. It prints the median wall time of each, the extra milliseconds per MB the pipe and
the masking thread cost, and the ratio; and checks the logs are the same bytes (the secret
never printed) and that the log cap (run at 8 MiB) still holds with the pipe.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.core import redact  # noqa: E402
from orchestrator.proc.spawn import run_process  # noqa: E402


def once(log: Path, mb: int, limit: int | None) -> float:
    log.unlink(missing_ok=True)
    line = "0123456789" * 10  # `yes` adds the newline: 101 bytes a line
    command = f"yes {line} | head -c {mb * 1_000_000}"
    started = time.perf_counter()
    result = run_process(["bash", "-c", command], log_path=log, log_limit=limit)
    took = time.perf_counter() - started
    assert result.returncode == 0
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-logpump-") as tmp:
        plain_log, masked_log = Path(tmp, "plain.log"), Path(tmp, "masked.log")
        plain, masked = [], []
        for _ in range(args.repeat):
            redact.forget()
            plain.append(once(plain_log, args.mb, None))
            redact.register(["hf_not_in_this_output_4f2a"])
            masked.append(once(masked_log, args.mb, None))
        same = plain_log.read_bytes() == masked_log.read_bytes()
        capped = once(masked_log, args.mb, 8 << 20) and masked_log.stat().st_size
        redact.forget()
    a, b = statistics.median(plain), statistics.median(masked)
    print(f"{args.mb} MB of output, median of {args.repeat}")
    print(f"  straight to the file      {a:.3f} s  ({args.mb / a:.0f} MB/s)")
    print(f"  through orch, masked      {b:.3f} s  ({args.mb / b:.0f} MB/s)")
    print(f"  cost of masking           {(b - a) / args.mb * 1000:.2f} ms per MB, {b / a:.2f}x")
    print(f"  logs identical: {same}; with an 8 MiB cap the masked log is {capped / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
