"""Power-cut campaign: orch's store on crashfs, the host cut off at every persistence point of
two plans, and at random ones, then resumed and checked (tests/crashharness.py).

    .venv/bin/python bench/bench_crash_campaign.py [--jobs 2] [--some 150] [--timed 60]
        [--shapes demo,rehearsal] [--every 1] [--no-sync] [--json PATH] [--work DIR]

For each plan shape (tests/crash_plans.py: the demo's, the rehearsal's on stub servers) a clean
run counts its persistence points (writes, truncates, fsyncs, creates, renames, ...); then one
trial cuts at each of them with every unsynced write lost; `--some` more cut at random points
with part of what was unsynced kept, torn at a sector; `--timed` more cut after a random delay
(a task running, a server starting, orch reporting). Each trial resumes the plan and checks
(crashharness.Trial): integrity and orch's invariants, reported completions and their
findings, a started step's needs, no durable completion run again, the resume finishing.

`--no-sync` runs orch as it was before issue 41 (every commit synchronous=NORMAL, a completion
said before its commit): the same campaign must then find reported completions lost. Needs
root, /dev/fuse, Debian's fuse3 (scripts/fuse-setup.sh) and cgroup v1's freezer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from crash_plans import demo_trial, rehearsal_trial  # noqa: E402
from crashharness import NO_SYNC_RULE, Trial, Verdict, available, trial_dir  # noqa: E402

SHAPES = {"demo": demo_trial, "rehearsal": rehearsal_trial}


def kind_of(problem: str) -> str:
    """A problem's family, for the figures."""
    for words, kind in (
        ("reported completed, lost", "lost reported completions"),
        ("lost at the cut", "lost findings"),
        ("integrity_check", "integrity failures"),
        ("invariant broken", "invariant failures"),
        ("ran again after its completion was durable", "steps re-run after a durable completion"),
        ("which it needs, is not recorded done", "steps started before their needs were durable"),
        ("the resumed run exited", "resumes that failed"),
        ("not done after the resume", "resumes that left work"),
        ("left without an end", "runs left without an end"),
    ):
        if words in problem:
            return kind
    return "other"


def trials(
    points: int, duration: float, every: int, some: int, timed: int, seed: int
) -> list[dict[str, object]]:
    """The campaign's trials of one shape: every `every`-th point, `some` random ones keeping
    part of what was unsynced, `timed` after a random delay."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = [
        {"cut_at": k, "keep": "none"} for k in range(1, points + 1, every)
    ]
    out += [{"cut_at": rng.randint(1, points), "keep": "some"} for _ in range(some)]
    out += [
        {"after_s": round(rng.uniform(0.02, duration), 3), "keep": "none"} for _ in range(timed)
    ]
    for i, t in enumerate(out):
        t["seed"] = seed * 100_000 + i
    return out


def run_shape(shape: str, work: Path, args: argparse.Namespace) -> tuple[int, list[Verdict]]:
    counter = SHAPES[shape](work / f"{shape}-count")
    points = counter.count_ops()
    todo = trials(points, counter.duration, args.every, args.some, args.timed, args.seed)
    # One trial object per worker: its own folder, its own ports (the rehearsal's servers).
    workers: list[Trial] = [SHAPES[shape](work / f"{shape}-{i}") for i in range(args.jobs)]
    free = list(range(args.jobs))
    verdicts: list[Verdict] = []
    started = time.monotonic()

    def one(spec: dict[str, object]) -> Verdict:
        slot = free.pop()
        try:
            return workers[slot].run(**spec)  # type: ignore[arg-type]
        finally:
            free.append(slot)

    with ThreadPoolExecutor(args.jobs) as pool:
        for i, verdict in enumerate(pool.map(one, todo), 1):
            verdicts.append(verdict)
            if verdict.problems:
                print(f"  {shape} {verdict.cut}: {'; '.join(verdict.problems)[:300]}", flush=True)
            if i % 50 == 0 or i == len(todo):
                took = time.monotonic() - started
                print(f"{shape}: {i}/{len(todo)} trials, {took:.0f} s", file=sys.stderr,
                      flush=True)  # fmt: skip
    return points, verdicts


def figures(shape: str, points: int, verdicts: list[Verdict]) -> dict[str, object]:
    cut = [v for v in verdicts if v.cut is not None]
    kinds = Counter(kind_of(p) for v in verdicts for p in v.problems)
    return {
        "shape": shape,
        "persistence_points": points,
        "trials": len(verdicts),
        "crash_states": len(cut),
        "trials_with_problems": sum(bool(v.problems) for v in verdicts),
        "problems": dict(kinds),
        "reported_completions_checked": sum(len(v.reported) for v in cut),
        "durable_completions_checked": sum(len(v.durable) for v in cut),
        "steps_rerun_not_durable": sum(len(set(v.rerun) - set(v.durable)) for v in cut),
        "servers_revived": sum(len(v.revived) for v in cut),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", default="demo,rehearsal")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--every", type=int, default=1, help="cut at every N-th point (smoke)")
    parser.add_argument("--some", type=int, default=150, help="cuts keeping part (per shape)")
    parser.add_argument("--timed", type=int, default=60, help="cuts after a delay (per shape)")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--no-sync", action="store_true", help="orch without the sync rule")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work", type=Path, help="where the trials run (default: a temp dir)")
    args = parser.parse_args()
    if (why := available()) is not None:
        print(f"bench_crash_campaign: {why}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="orch-crash-"))
    if args.no_sync:
        patch = work / "nosync"
        patch.mkdir(parents=True, exist_ok=True)
        (patch / "sitecustomize.py").write_text(NO_SYNC_RULE)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(patch), os.environ.get("PYTHONPATH")) if p
        )
    out = []
    started = time.monotonic()
    with trial_dir(work):
        for shape in args.shapes.split(","):
            points, verdicts = run_shape(shape, work, args)
            out.append(figures(shape, points, verdicts))
    took = time.monotonic() - started
    print(f"\npower-cut campaign{' WITHOUT the sync rule' if args.no_sync else ''}: "
          f"{took / 60:.1f} min, jobs {args.jobs}")  # fmt: skip
    for f in out:
        print(f"  {f['shape']}: {f['crash_states']} crash states over {f['persistence_points']}"
              f" persistence points ({f['trials']} trials); problems: "
              f"{f['problems'] or 'none'}")  # fmt: skip
        print(f"    checked: {f['reported_completions_checked']} reported completions, "
              f"{f['durable_completions_checked']} durable ones; re-run (not durable): "
              f"{f['steps_rerun_not_durable']}; revived: {f['servers_revived']}")  # fmt: skip
    total = sum(int(f["crash_states"]) for f in out)  # type: ignore[call-overload]
    bad = sum(int(f["trials_with_problems"]) for f in out)  # type: ignore[call-overload]
    print(f"  all: {total} crash states, {bad} with problems")
    if args.json:
        args.json.write_text(json.dumps({"no_sync": args.no_sync, "shapes": out}, indent=2))
    return 1 if bad and not args.no_sync else 0


if __name__ == "__main__":
    sys.exit(main())
