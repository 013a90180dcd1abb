"""Power cuts: orch's store on crashfs, the host cut off at persistence points, mid-task and
while orch reports, then resumed (tests/crashharness.py). The long campaign, over a thousand
cuts and both plan shapes, is bench/bench_crash_campaign.py; this is its short form, and the
proof that the harness bites: without the sync rule it finds reported completions lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_plans import demo_trial, rehearsal_trial
from crashharness import NO_SYNC_RULE, ORCH, Mount, Trial, Verdict, available

pytestmark = pytest.mark.skipif(
    (why := available()) is not None, reason=f"power cuts need FUSE and a freezer cgroup: {why}"
)


def sweep(trial: Trial, points: list[int], keep: str = "none") -> list[Verdict]:
    return [trial.run(cut_at=k, keep=keep, seed=k) for k in points]


def spread(total: int, n: int) -> list[int]:
    """`n` persistence points spread over a run of `total`, the first and the last among them."""
    return sorted({1 + round(i * (total - 1) / (n - 1)) for i in range(n)})


def problems(verdicts: list[Verdict]) -> list[str]:
    return [f"{v.cut}: {p}" for v in verdicts for p in v.problems]


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "trial"
    for mnt in tmp_path.rglob("mnt"):  # a failed trial's mount must not outlive the test
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def test_power_cut_at_persistence_points_of_the_demo_shape_loses_nothing_reported(
    work: Path,
) -> None:
    trial = demo_trial(work)
    total = trial.count_ops()
    verdicts = sweep(trial, spread(total, 24)) + sweep(trial, spread(total, 8)[1:-1], "some")
    verdicts += [trial.run(after_s=s, seed=i) for i, s in enumerate((0.15, 0.3, 0.45))]
    assert not problems(verdicts), problems(verdicts)
    cut = [v for v in verdicts if v.cut is not None]
    # Not vacuous: cuts fell before, between and after completions, and the resumed runs
    # re-ran what was not durable and nothing that was.
    assert len(cut) >= len(verdicts) - 2, [v.cut for v in verdicts]
    assert any(v.reported and v.rerun for v in cut), [v.as_json() for v in cut]
    assert any(not v.durable for v in cut) and any(len(v.durable) == 5 for v in cut)


def test_power_cuts_in_the_rehearsal_shape_relaunch_servers_and_keep_results(
    work: Path,
) -> None:
    """A server launched before the cut died with the host: the resumed run starts it again
    for the steps that need it; a bench result the completion names is still there (the
    analysis reads it)."""
    trial = rehearsal_trial(work)
    total = trial.count_ops()
    verdicts = sweep(trial, spread(total, 10)[1:])
    assert not problems(verdicts), problems(verdicts)
    assert any("bench_base" in v.durable and "analyze" in v.rerun for v in verdicts)
    assert any(v.revived for v in verdicts), [v.as_json() for v in verdicts]


def test_without_the_sync_rule_the_harness_finds_reported_completions_lost(
    work: Path, tmp_path: Path
) -> None:
    """The rule taken out, as it was (every commit `synchronous=NORMAL`, a completion reported
    before its commit): the same harness must see completions that orch reported gone."""
    patch = tmp_path / "nosync"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(NO_SYNC_RULE)
    trial = demo_trial(work)
    total = trial.count_ops()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(patch) + (os.pathsep + old if old else "")
    try:
        verdicts = sweep(trial, spread(total, 16)[4:-2])
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.update(PYTHONPATH=old)
    lost = [p for p in problems(verdicts) if "reported completed, lost at the cut" in p]
    assert lost, [v.as_json() for v in verdicts]


# --- storage faults at every commit point --------------------------------------------------------


FAULTS = {  # what orch says of each, whichever write it hit
    "ENOSPC": ("the disk is full", "No space left on device"),
    "EIO": ("cannot be read or written", "Input/output error", "disk I/O error"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_storage_fault_at_each_write_is_named_for_what_it_is(work: Path, fault: str) -> None:
    """crashfs fails every write from the N-th on (a disk that fills, a device that errs), for
    N spread over a whole run: orch stops with the fault's name, never "damaged", the store is
    intact, and once the fault is gone the next run finishes the plan."""
    trial = demo_trial(work)
    total = trial.count_ops()
    seen = []
    for n in spread(total, 14)[1:]:
        trial.prepare()
        disk, mnt = work / "disk", work / "mnt"
        with Mount(disk, mnt, work / "crashfs.log", fail_at=n, errno=fault):
            r = subprocess.run(trial.orch_argv(), capture_output=True, text=True, cwd=work,
                               env=trial.env(), timeout=120)  # fmt: skip
        said = r.stderr
        assert "Traceback" not in said, (n, said[-2000:])
        assert "damaged" not in said, (n, said[-2000:])
        if r.returncode == 0:
            continue  # the fault fell after the last write that mattered (the logs' close)
        seen.append(n)
        assert r.returncode == 2, (n, r.returncode, said[-2000:])
        assert any(words in said for words in FAULTS[fault]), (n, said[-2000:])
        resumed = trial.orch_argv()
        with Mount(disk, mnt, work / "crashfs.log"):
            again = subprocess.run(resumed, capture_output=True, text=True, cwd=work,
                                   env=trial.env(), timeout=120)  # fmt: skip
            check = subprocess.run([ORCH, "status", "--store", resumed[-1], "--json"],
                                   capture_output=True, text=True, cwd=work)  # fmt: skip
        assert again.returncode == 0, (n, again.stderr[-2000:])
        assert check.returncode == 0 and '"completed": 5' in check.stdout, check.stdout[-500:]
    assert len(seen) >= 8, seen


def test_many_findings_on_a_full_disk_are_named_a_full_disk(tmp_path: Path) -> None:
    """The issue's case: a task printing 40,000 findings on a 2 MiB file system. The commit
    held open for them fails with SQLITE_FULL, SQLite rolls the transaction back, and the
    held part with it: orch must say the disk is full (it said "damaged ... no transaction is
    active", and an operator who follows that throws good history away)."""
    from test_storage_faults import tmpfs

    plan = (
        "name: full\ntasks:\n  - {id: a, kind: shell, params: {command: 'echo hi'}}\n"
        "  - id: many\n    kind: shell\n    needs: [a]\n"
        "    params: {command: 'for i in $(seq 40000); do echo ::finding k$i=$i; done'}\n"
    )
    with tmpfs(tmp_path / "small", "2m") as root:
        (tmp_path / "p.yaml").write_text(plan)
        for _ in range(3):
            for leftover in root.iterdir():
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
            r = subprocess.run([ORCH, "run", str(tmp_path / "p.yaml"), "-q", "--store",
                                str(root / "full.db")], capture_output=True, text=True)  # fmt: skip
            assert r.returncode == 2, r.stderr[-1000:]
            assert "the disk is full" in r.stderr and "damaged" not in r.stderr, r.stderr[-1000:]
            integrity = subprocess.run(
                [sys.executable, "-c", "import sqlite3,sys; print(sqlite3.connect(sys.argv[1])"
                 ".execute('PRAGMA integrity_check').fetchone()[0])", str(root / "full.db")],
                capture_output=True, text=True)  # fmt: skip
            assert integrity.stdout.strip() == "ok", integrity
