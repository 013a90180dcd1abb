"""Shared fixtures: real plan files, the real `orch` executable, real SQLite stores."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ORCH = str(Path(sys.executable).parent / "orch")
# Every process a test starts inherits this (run_orch, start_orch, subprocess, the servers orch
# launches): after the session, none may be alive (pytest_sessionfinish below).
SESSION_MARK = ("ORCH_TEST_SESSION", f"{os.getpid()}-{time.time_ns()}")
os.environ[SESSION_MARK[0]] = SESSION_MARK[1]


# Every temporary file of the session goes under one private folder, removed at the end:
# pytest's tmp_path, and through TMPDIR what the tests' processes make (vLLM's IPC sockets and
# vllm_dist_* files, torch's compile cache, bash's heredocs). /tmp must look as it did before;
# ORCH_TEST_SHARED_TMP=1 only reports what appeared there (other work on the host writes it too).
TMP_BEFORE: set[str] = set()
SESSION_TMP: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global SESSION_TMP
    if config.option.basetemp is not None or SESSION_TMP is not None:
        return  # the user chose where temporary files go
    TMP_BEFORE.update(os.listdir(tempfile.gettempdir()))
    SESSION_TMP = Path(tempfile.mkdtemp(prefix="orch-tests-"))
    os.environ["TMPDIR"] = str(SESSION_TMP)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    config.option.basetemp = str(SESSION_TMP / "pytest")


def pytest_unconfigure(config: pytest.Config) -> None:
    if SESSION_TMP is not None:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


def _tmp_leftovers() -> list[str]:
    """What appeared in the system's temp folder during the session, outside SESSION_TMP."""
    if SESSION_TMP is None:
        return []
    new = set(os.listdir(SESSION_TMP.parent)) - TMP_BEFORE
    # Another pytest session's folder is its own to remove (two sessions may run at once).
    return sorted(n for n in new if not n.startswith("orch-tests-"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if any process the tests started is still alive (and end them), or if
    something was left in /tmp outside the session's own temporary folder."""
    _end_leftover_processes(session)
    if left_in_tmp := _tmp_leftovers():
        sys.stderr.write(
            f"\nleft in {SESSION_TMP.parent} by the tests (TMPDIR not honoured?):"
            f" {', '.join(left_in_tmp)}\n"
        )
        if not os.environ.get("ORCH_TEST_SHARED_TMP"):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _end_leftover_processes(session: pytest.Session) -> None:
    from orchestrator.proc.procfs import marked, terminate_pids

    time.sleep(0.2)  # a process killed just before the end may still be exiting
    left = [pid for pid in marked(SESSION_MARK) if pid != os.getpid()]
    if not left:
        return
    names = []
    for pid in left:
        try:
            names.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
        except OSError:
            names.append(str(pid))
    terminate_pids(left, grace=2.0)
    sys.stderr.write(
        "\nprocesses started by the tests outlived them (now ended):\n  "
        + "\n  ".join(names)
        + "\n"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def run_orch(
    *args: str | Path,
    cwd: Path | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`orch ARGS` as a user runs it: a real process, NO_COLOR for stable text."""
    return subprocess.run(
        [ORCH, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def start_orch(*args: str | Path, cwd: Path | None = None) -> subprocess.Popen[str]:
    """`orch ARGS` in the background, in its own session (as a terminal job would be)."""
    return subprocess.Popen(
        [ORCH, *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


class PlanDir:
    """A scratch directory holding one plan file and its store."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, text: str, name: str = "plan.yaml") -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(text))
        return path

    def store_path(self, plan_name: str = "t") -> Path:
        return self.root / ".orch" / f"{plan_name}.db"

    @contextmanager
    def db(self, plan_name: str = "t") -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.store_path(plan_name))
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def statuses(self, plan_name: str = "t") -> dict[str, str]:
        with self.db(plan_name) as conn:
            return {r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM todos")}

    def status_of(self, task_id: str, plan_name: str = "t") -> str | None:
        """The task's status now, or None while a starting run has not created the store yet:
        for polling a run in the background."""
        if not self.store_path(plan_name).exists():
            return None
        try:
            return self.statuses(plan_name).get(task_id)
        except sqlite3.OperationalError:  # the schema is not there yet
            return None

    def todo(self, task_id: str, plan_name: str = "t") -> sqlite3.Row:
        with self.db(plan_name) as conn:
            row = conn.execute("SELECT * FROM todos WHERE id=?", (task_id,)).fetchone()
        assert row is not None, task_id
        return row

    def transitions(self, task_id: str, plan_name: str = "t") -> list[tuple[str | None, str]]:
        with self.db(plan_name) as conn:
            return [
                (r[0], r[1])
                for r in conn.execute(
                    "SELECT from_status, to_status FROM transitions WHERE task_id=? ORDER BY seq",
                    (task_id,),
                )
            ]


@pytest.fixture
def pdir(tmp_path: Path) -> PlanDir:
    return PlanDir(tmp_path)
