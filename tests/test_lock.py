"""The store's run lock (store/lock.py): one live run per store, held by a real second
process here; a lock whose holder died is taken over at once. Each test fails when the
behaviour it names is removed (bench/mutation_probe.py ran mutants of lock.py against them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import StoreError, StoreLocked
from orchestrator.store.lock import RunLock

from conftest import PlanDir, run_orch

# --- store/lock.py: a real second process holds the lock ------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from orchestrator.store.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire({"pid": %d, "host": "holder-host"})
lock.note_run(5)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
print("released", flush=True)
time.sleep(300)
"""


class Holder:
    """A process that takes the store's lock, holds it `hold` seconds, then releases it."""

    def __init__(self, store: Path, hold: float = 300.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER % os.getpid(), str(store), str(hold)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "held\n"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=10)  # reaps it and closes its pipe


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Holder]:
    h = Holder(tmp_path / "s.db")
    try:
        yield h
    finally:
        h.kill()


def test_live_holder_refuses_the_lock_and_is_named(tmp_path: Path, holder: Holder) -> None:
    """While another process holds the lock: refused after the retry window, naming it."""
    lock = RunLock(tmp_path / "s.db")
    assert lock.try_probe() is False
    fds = len(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    with pytest.raises(StoreLocked) as err:
        lock.acquire({"pid": os.getpid()})
    assert time.monotonic() - started >= 0.4, "a glance by `orch status` is waited out first"
    assert str(err.value).startswith(
        f"s.db is in use by orch run #5 (pid {os.getpid()} on holder-host, since "
    )
    assert "wait for that run to end, or stop it" in str(err.value)
    assert lock._fd is None and len(os.listdir("/proc/self/fd")) == fds, "no fd kept open"


def test_lock_is_taken_over_when_its_holder_is_killed(tmp_path: Path, holder: Holder) -> None:
    """SIGKILL of the holder frees the lock at once: the kernel drops the flock."""
    lock = RunLock(tmp_path / "s.db")
    holder.kill()
    assert lock.try_probe() is True
    lock.acquire({"pid": os.getpid(), "host": "me"})
    try:
        assert RunLock(tmp_path / "s.db").try_probe() is False
    finally:
        lock.release()
    assert RunLock(tmp_path / "s.db").try_probe() is True
    assert lock.path.exists(), "the file stays for the next run"


def test_lock_freed_during_the_retry_window_is_taken(tmp_path: Path) -> None:
    """A holder that lets go within half a second (a status glance) does not refuse a run."""
    h = Holder(tmp_path / "s.db", hold=0.2)
    try:
        lock = RunLock(tmp_path / "s.db")
        assert lock.try_probe() is False, "held when the run asks for it"
        lock.acquire({"pid": os.getpid()})  # StoreLocked, were the glance not waited out
        try:
            assert RunLock(tmp_path / "s.db").try_probe() is False, "now the run holds it"
            assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        finally:
            lock.release()
    finally:
        h.kill()


def test_a_lock_file_that_cannot_be_opened_is_a_clear_store_error(tmp_path: Path) -> None:
    """The lock's folder is a file (a mistyped --store): a StoreError naming the lock and
    the system's reason, not an OSError's traceback, and nothing is held."""
    (tmp_path / "plans").write_text("not a folder")
    lock = RunLock(tmp_path / "plans" / "s.db")
    with pytest.raises(StoreError, match=r"cannot take the run lock .*plans/s\.db\.lock: "):
        lock.acquire({"pid": os.getpid()})
    assert lock._fd is None


def test_the_lock_and_its_folder_are_private(tmp_path: Path) -> None:
    """The lock names the holder (pid, host, run): 0600, in a folder it makes 0700."""
    lock = RunLock(tmp_path / "new" / "s.db")
    lock.acquire({"pid": os.getpid()})
    try:
        assert (lock.path.stat().st_mode & 0o777, lock.path.parent.stat().st_mode & 0o777) == (
            0o600,
            0o700,
        )
    finally:
        lock.release()


def test_lock_file_names_the_holder_and_overwrites_old_text(tmp_path: Path) -> None:
    """The lock file is exactly the holder's JSON, even over a longer stale text."""

    lock = RunLock(tmp_path / "s.db")
    lock.path.write_text("x" * 500)
    lock.acquire({"pid": 1234, "host": "h"})
    try:
        first = json.loads(lock.path.read_text())
        assert first["pid"] == 1234 and first["host"] == "h" and "run_id" not in first
        assert abs(first["locked_at"] - time.time()) < 5
        lock.note_run(9)
        assert json.loads(lock.path.read_text())["run_id"] == 9
        assert lock.describe_holder().startswith("orch run #9 (pid 1234 on h, since ")
    finally:
        lock.release()
    lock.release()  # a second release is harmless
    lock.path.write_text("not json")
    assert lock.describe_holder() == "another orch run"
    lock.path.write_text('{"pid": 3}')  # what it does not say is unknown, not an error
    epoch = time.strftime("%H:%M:%S", time.localtime(0))
    assert lock.describe_holder() == f"orch run #? (pid 3 on ?, since {epoch})"


def test_probe_of_a_missing_lock_file_creates_nothing(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "a" / "b" / "s.db")
    assert lock.try_probe() is True
    assert not lock.path.exists()
    lock.acquire({})  # creates the folders as well
    lock.release()
    assert lock.path.exists()


def test_cli_run_refused_while_a_live_process_holds_the_lock(pdir: PlanDir) -> None:
    """`orch run` against a held store exits 3 naming the holder, and runs nothing; once the
    holder is SIGKILLed the next run goes through."""
    plan = pdir.write(f"""
        name: t
        tasks: [{{id: a, kind: shell, params: {{command: "touch {pdir.root}/ran"}}}}]
    """)
    h = Holder(pdir.store_path())
    try:
        r = run_orch("run", plan)
        assert r.returncode == 3, r.stderr
        assert "in use by orch run #5" in r.stderr and "Traceback" not in r.stderr
        assert not (pdir.root / "ran").exists()
    finally:
        h.kill()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert (pdir.root / "ran").exists()


def test_something_else_in_the_locks_place_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO where the lock file goes would block the open for reading forever: both the
    run and a status glance refuse it, naming it."""
    lock = RunLock(tmp_path / "s.db")
    os.mkfifo(lock.path)
    for attempt in (lambda: lock.acquire({"pid": os.getpid()}), lock.try_probe):
        with pytest.raises(StoreError, match=r"the run lock .*s\.db\.lock is a FIFO"):
            attempt()
    assert lock._fd is None


def test_waiting_out_a_glance_naps_rather_than_spins(tmp_path: Path) -> None:
    """The retry window polls every 20 ms: a run waiting for a status glance to end costs
    next to no CPU (a spinning wait would burn the core it waits for)."""
    h = Holder(tmp_path / "s.db", hold=0.25)
    try:
        lock = RunLock(tmp_path / "s.db")
        cpu, wall = time.thread_time(), time.monotonic()
        lock.acquire({"pid": os.getpid()})
        cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
        lock.release()
    finally:
        h.kill()
    assert wall > 0.05, "the holder was still holding: the run had to wait"
    assert cpu < 0.05, f"{cpu:.3f}s of CPU to wait {wall:.3f}s"
