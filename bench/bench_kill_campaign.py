"""Random-kill campaign: SIGKILL `orch run` at a random moment, run the plan again, check.

    .venv/bin/python bench/bench_kill_campaign.py [N=200] [--seed S] [--keep DIR]

Each trial starts from an empty store: `orch run` of a 30-task plan whose tasks leave
background children (`sleep 300 &`, every third one `setsid`, every fifth a double fork that
leaves its session) and append their marker to a per-task counter file when their real work is
done; SIGKILL at a moment drawn uniformly over the plan's duration (measured first); then
`orch run` again to completion. Checked after each trial:

- integrity failures: PRAGMA integrity_check is not ok, the second run did not exit 0, or a task
  is not completed;
- completed steps re-run: a task the store had recorded completed at the kill whose counter
  grew during the second run (work done again after it was recorded done);
- orphans: a live process carrying the campaign's environment tag (every task process has it,
  also the ones that left their group), or a process in one of orch's cgroups, after the
  second run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.proc.containment import Jail, cgroup2_mount  # noqa: E402
from orchestrator.proc.procfs import is_alive, marked, terminate_pids
from orchestrator.run.loop import PROCESS_MARKER, store_tag  # noqa: E402

ORCH = str(Path(sys.executable).parent / "orch")
TASKS = 30


def plan_text(root: Path, tag: str) -> str:
    lines = ["name: campaign", "tasks:"]
    for i in range(TASKS):
        if i % 5 == 4:  # leaves its session by a double fork
            child = "( setsid sh -c 'sleep 300' & ); "
        elif i % 3 == 2:
            child = "setsid sleep 300 & "
        else:
            child = "sleep 300 & "
        command = f"{child}sleep 0.03; echo $ORCH_TASK >> {root}/counters/t{i:02d}"
        needs = f", needs: [t{i - 1:02d}]" if i % 10 else ""
        lines.append(
            f"  - {{id: t{i:02d}, kind: shell{needs}, "
            f"params: {{command: {command!r}, env: {{CAMPAIGN: {tag}}}}}}}"
        )
    return "\n".join(lines) + "\n"


def orch(*args: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [ORCH, *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def counters(root: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in (root / "counters").iterdir()}


def completed(store: Path) -> set[str]:
    if not store.exists():
        return set()
    try:
        with sqlite3.connect(store) as conn:
            return {r[0] for r in conn.execute("SELECT id FROM todos WHERE status='completed'")}
    except sqlite3.Error:
        return set()


def orphans(tag: str, store: Path) -> list[int]:
    """Live processes carrying the tag, or held in the cgroup of one of the plan's attempts
    (named from its marker; other orch runs on the host have cgroups there too)."""
    found = set(marked(("CAMPAIGN", tag)))
    mount = cgroup2_mount()
    with contextlib.closing(sqlite3.connect(store)) as conn:
        attempts = conn.execute(
            "SELECT DISTINCT run_id, task_id, attempt FROM transitions"
            " WHERE to_status='in_progress'"
        ).fetchall()
    for run_id, task_id, attempt in attempts:
        marker = (PROCESS_MARKER, f"{run_id}:{task_id}:{attempt}@{store_tag(store)}")
        procs = Path(mount or "/nonexistent", "orch", Jail(marker, "cgroup").name, "cgroup.procs")
        with contextlib.suppress(OSError):
            found.update(int(x) for x in procs.read_text().split() if is_alive(int(x)))
    return sorted(found)


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return f"{pid} {cmd[:80]!r} cgroup {Path(f'/proc/{pid}/cgroup').read_text().split()[-1]}"
    except OSError:
        return str(pid)


def reset(root: Path) -> None:
    shutil.rmtree(root / ".orch", ignore_errors=True)
    shutil.rmtree(root / "counters", ignore_errors=True)
    (root / "counters").mkdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trials", nargs="?", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(args.keep or tempfile.mkdtemp(prefix="orch-kill-campaign-"))
    root.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{time.time_ns()}"
    plan = root / "plan.yaml"
    plan.write_text(plan_text(root, tag))
    store = root / ".orch" / "campaign.db"

    reset(root)
    started = time.monotonic()
    if orch("run", str(plan), cwd=root).wait() != 0:
        print("the plan does not complete without kills", file=sys.stderr)
        return 2
    duration = time.monotonic() - started
    print(f"plan: {TASKS} tasks, {duration:.2f}s a run; kills uniform in [0, {duration:.2f}]s")

    integrity = rerun = orphaned = mid_task = 0
    campaign_start = time.monotonic()
    try:
        for trial in range(1, args.trials + 1):
            reset(root)
            proc = orch("run", str(plan), cwd=root)
            time.sleep(rng.uniform(0, duration))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            done_at_kill, counts_at_kill = completed(store), counters(root)
            mid_task += len(counts_at_kill) < TASKS
            code = orch("run", str(plan), cwd=root).wait()
            after = counters(root)
            again = [t for t in done_at_kill if after.get(t, 0) > counts_at_kill.get(t, 0)]
            ok = False
            with sqlite3.connect(store) as conn:
                ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                statuses = {r[0] for r in conn.execute("SELECT status FROM todos")}
            bad = code != 0 or not ok or statuses != {"completed"} or len(after) != TASKS
            time.sleep(0.05)  # a process killed at the very end may still be exiting
            left = orphans(tag, store)
            integrity += bad
            rerun += len(again)
            orphaned += len(left)
            if bad or again or left:
                print(
                    f"trial {trial}: exit {code}, integrity {ok}, statuses {statuses}, "
                    f"re-run {again}, orphans {[describe(p) for p in left]}",
                    file=sys.stderr,
                )
                terminate_pids(left, grace=1.0)
            if trial % 20 == 0:
                print(f"  {trial} trials, {time.monotonic() - campaign_start:.0f}s", flush=True)
    finally:
        if store.exists():
            terminate_pids(orphans(tag, store), grace=1.0)
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"trials: {args.trials}  integrity failures: {integrity}  "
        f"completed steps re-run: {rerun}  orphans: {orphaned}  "
        f"(kills before the last task finished: {mid_task}; "
        f"{time.monotonic() - campaign_start:.0f}s)"
    )
    return 0 if integrity == rerun == orphaned == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
