"""Power cuts for orch: a plan run on crashfs (tests/crashfs.py), the host cut off at a chosen
moment, the next run resumed, and what survived checked against what orch had said.

One trial (`Trial.run`):

1. `orch run PLAN` with its store in a crashfs mount, its processes (orch, its tasks, the servers
   they start) in a freezer cgroup of their own: the host. Its stderr (where orch reports each
   step) and a witness file (where each shell step writes `start ID` as it begins) lie outside
   the mount, as a person's terminal and the outside world do.
2. The cut: at the N-th write, truncate or fsync (every persistence point, counted by crashfs),
   or after a delay (a task running, orch reporting). Everything in the cgroup is killed; the
   mount is torn down; what crashfs had not synced is lost (or, with `keep="some"`, part of it
   reached the disk, torn at a sector).
3. The store is opened as the next run would open it, on a fresh mount, and checked:
   `integrity_check` and orch's invariants; every completion orch reported on stderr is there,
   with its findings; every step a witnessed step needs is recorded done (a dependent started
   only after its needs were durable).
4. `orch run PLAN` again: it must finish (exit 0, every task done), and no step whose completion
   was durable after the cut runs again; the crashed run is on record as ended.

The cgroup is cgroup v1's freezer (these machines mount it; CI's are the same kind); without it
the harness cannot hold a host's processes together, and says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRASHFS = Path(__file__).resolve().parent / "crashfs.py"
ORCH = str(Path(sys.executable).parent / "orch")
FREEZER = Path("/sys/fs/cgroup/freezer")
sys.path.insert(0, str(ROOT))
from orchestrator.store.schema import invariant_queries  # noqa: E402

# orch's store as it was before the sync rule (issue 41), for a sitecustomize.py or an exec:
# every commit `synchronous=NORMAL`, a completion said before its commit. The test that the
# harness bites (tests/test_crash_states.py) and the rule's cost (bench/bench_engine.py).
NO_SYNC_RULE = """\
import orchestrator.store.db as db
_tx = db.Store._tx
db.Store._tx = lambda self, hold=False, synced=True: _tx(self, hold, synced=False)
db.Store.after_commit = lambda self, tell: tell()
"""
COMPLETED = re.compile(r"task\.completed\s+task=(\S+)")
REVIVED = re.compile(r"task\.revived\s+task=(\S+)")  # a held server gone: started again


def witnessed(lines: list[str]) -> list[str]:
    """The steps a witness file saw start: `start $ORCH_TASK` lines, whose marker is
    `RUN:TASK:ATTEMPT@TAG`."""
    tokens = [ln.split()[1] for ln in lines if ln.startswith("start ") and len(ln.split()) > 1]
    return [t.split(":")[1] if ":" in t else t for t in tokens]


def available() -> str | None:
    """Why the harness cannot run here, or None."""
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (scripts/fuse-setup.sh installs Debian's fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc})"
    if not os.access(FREEZER, os.W_OK):
        return f"no writable cgroup v1 freezer at {FREEZER}: a host's processes cannot be held"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "no /dev/fuse"
    return None


# --- the mount ---------------------------------------------------------------------------------


class Mount:
    """crashfs over `backing` at `at`: a context manager; `cut_at`/`fail_at` as crashfs's."""

    def __init__(self, backing: Path, at: Path, log: Path, **options: object) -> None:
        self.backing, self.at, self.log = backing, at, log
        self.options = options
        self.cut_line: str | None = None
        self.ops: int | None = None

    def __enter__(self) -> Mount:
        self.at.mkdir(parents=True, exist_ok=True)
        events_r, events_w = os.pipe()
        control_r, self.control = os.pipe()
        argv = [sys.executable, str(CRASHFS), str(self.backing), str(self.at), str(events_w),
                str(control_r)]  # fmt: skip
        for key, value in self.options.items():
            if value is True:
                argv.append(f"--{key.replace('_', '-')}")
            elif value is not None and value is not False:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, pass_fds=(events_w, control_r), stderr=log,
                                         stdout=log)  # fmt: skip
        os.close(events_w)
        os.close(control_r)
        self.events = events_r
        self._buffer = b""
        if self._next_line(15.0) != "ready":
            self.down()
            raise RuntimeError(f"crashfs did not mount at {self.at}: see {self.log}")
        return self

    def _next_line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.events], [], [], left)[0]:
                return None
            chunk = os.read(self.events, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def poll_cut(self, timeout: float) -> str | None:
        """The cut's line (`cut N OP PATH`) once crashfs has cut, else None after `timeout`."""
        if self.cut_line is None:
            line = self._next_line(timeout)
            if line is not None and line.startswith("cut "):
                self.cut_line = line
        return self.cut_line

    def cut(self) -> str:
        """Power lost now."""
        if self.cut_line is None:
            os.write(self.control, b"cut\n")
            if self.poll_cut(10.0) is None:
                raise RuntimeError("crashfs did not cut")
        assert self.cut_line is not None
        return self.cut_line

    def down(self) -> None:
        """Gone with the host: crashfs killed, the mount torn down (what it held is lost)."""
        if self.events < 0:
            return
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(self.at)], capture_output=True)
        self._close()

    def _close(self) -> None:
        """Once: a descriptor closed twice may by then be another mount's (trials in threads)."""
        for fd in (self.events, self.control):
            if fd >= 0:
                os.close(fd)
        self.events = self.control = -1

    def __exit__(self, *exc: object) -> None:
        if self.cut_line is not None or self.proc.poll() is not None:
            self.down()
            return
        # A clean unmount: crashfs writes back what it held, as a clean shutdown does.
        subprocess.run(["fusermount3", "-u", str(self.at)], capture_output=True)
        try:
            self.proc.wait(timeout=30)
            line = self._next_line(5.0)
            self.ops = int(line.split()[1]) if line and line.startswith("ops ") else None
        except subprocess.TimeoutExpired:
            self.down()
            return
        self._close()


# --- the host ----------------------------------------------------------------------------------


class Host:
    """Processes that go down together, as a machine's do when its power goes: every process
    started through `popen`, and every one they start, in one freezer cgroup."""

    def __init__(self, name: str) -> None:
        self.group = FREEZER / name
        self.group.mkdir()

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        # Joined before exec: nothing the process starts is ever outside the group.
        join = f'echo $$ > {self.group}/cgroup.procs && exec "$@"'
        return subprocess.Popen(["sh", "-c", join, "sh", *argv], **kwargs)  # type: ignore[call-overload]

    def pids(self) -> list[int]:
        return [int(p) for p in (self.group / "cgroup.procs").read_text().split()]

    def power_off(self) -> None:
        """Every process stops at once (frozen), then is killed; they die as the mount goes."""
        state = self.group / "freezer.state"
        state.write_text("FROZEN")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        state.write_text("THAWED")

    def reap(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes outlived the power cut: {self.pids()}")
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.reap()
            self.group.rmdir()


# --- a trial -------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What one trial found: `problems` empty is a pass."""

    cut: str | None  # crashfs's `cut N OP PATH`, or None: the run ended before the cut
    reported: list[str] = field(default_factory=list)  # completions orch said before the cut
    durable: list[str] = field(default_factory=list)  # completed in the store after the cut
    rerun: list[str] = field(default_factory=list)  # steps the resume ran again
    revived: list[str] = field(default_factory=list)  # of them, servers that died with the host
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        keys = ("cut", "reported", "durable", "rerun", "revived", "problems")
        return {k: getattr(self, k) for k in keys}


@dataclass
class Trial:
    """One plan, run to a power cut and resumed, in `work` (made empty first)."""

    work: Path
    plan_text: str  # may say {witness} where a step writes `start ID`
    needs: dict[str, list[str]]  # each witnessed step's needs
    keys: dict[str, list[str]] = field(default_factory=dict)  # findings a step always records
    name: str = "crash"
    last_run: int = 0  # the latest run the store held after the cut
    duration: float = 1.0  # a whole run's seconds, as count_ops found it

    def _paths(self) -> tuple[Path, Path, Path, Path]:
        return (self.work / "disk", self.work / "mnt", self.work / "witness", self.work / "plan")

    def prepare(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.work)
        disk, mnt, witness, plan = self._paths()
        for folder in (disk, mnt, plan, self.work / "tmp"):
            folder.mkdir(parents=True)
        witness.touch()
        (plan / f"{self.name}.yaml").write_text(self.plan_text.replace("{witness}", str(witness)))

    def env(self) -> dict[str, str]:
        """The host's processes' environment: their temporary files (a server's scratch
        folder, which a dead run's lost record cannot remove) stay in the trial's folder."""
        return {**os.environ, "NO_COLOR": "1", "TMPDIR": str(self.work / "tmp")}

    def orch_argv(self) -> list[str]:
        disk, mnt, _, plan = self._paths()
        return [ORCH, "run", str(plan / f"{self.name}.yaml"), "--store",
                str(mnt / ".orch" / f"{self.name}.db")]  # fmt: skip

    def count_ops(self) -> int:
        """A whole run's persistence points (writes, truncates, fsyncs), no cut; its length
        in seconds is kept in `duration`."""
        self.prepare()
        started = time.monotonic()
        disk, mnt, _, _ = self._paths()
        host = Host(f"orch-crash-{os.getpid()}-count")
        try:
            with Mount(disk, mnt, self.work / "crashfs.log") as mount:
                proc = host.popen(self.orch_argv(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, cwd=self.work,
                                  env=self.env())  # fmt: skip
                if proc.wait(timeout=300) != 0:
                    raise RuntimeError("the plan fails without a cut")
                self.duration = time.monotonic() - started
            assert mount.ops is not None
            return mount.ops
        finally:
            host.close()

    def run(self, cut_at: int | None = None, after_s: float | None = None,
            keep: str = "none", seed: int = 0, timeout: float = 120.0) -> Verdict:  # fmt: skip
        """Cut at the `cut_at`-th persistence point, or `after_s` seconds into the run."""
        self.prepare()
        disk, mnt, witness, _ = self._paths()
        err = self.work / "crashed.err"
        host = Host(f"orch-crash-{os.getpid()}-{seed}")
        try:
            with Mount(disk, mnt, self.work / "crashfs.log", cut_at=cut_at, keep=keep,
                       seed=seed) as mount, open(err, "wb") as stderr:  # fmt: skip
                proc = host.popen(self.orch_argv(), stdout=subprocess.DEVNULL, stderr=stderr,
                                  cwd=self.work, env=self.env())  # fmt: skip
                cut = self._await_cut(mount, proc, after_s, timeout)
                if cut is not None:
                    host.power_off()
                    mount.down()
                host.reap()
                proc.wait(timeout=10)
            verdict = Verdict(cut)
            said = err.read_text(errors="replace")
            verdict.reported = COMPLETED.findall(said)
            started = witnessed(witness.read_text().splitlines())
            self._check_after_cut(verdict, said, started)
            if cut is not None:
                self._check_resume(verdict, host)
            return verdict
        finally:
            host.close()

    def _await_cut(self, mount: Mount, proc: subprocess.Popen[bytes], after_s: float | None,
                   timeout: float) -> str | None:  # fmt: skip
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        while time.monotonic() < deadline:
            if (line := mount.poll_cut(0.01)) is not None:
                return line
            if after_s is not None and time.monotonic() - started >= after_s:
                return mount.cut()
            if proc.poll() is not None:
                return mount.poll_cut(0.2)  # a cut at the last write races the exit
        raise RuntimeError(f"the run neither ended nor reached its cut in {timeout:.0f} s")

    def _store(self) -> Path:
        return self._paths()[1] / ".orch" / f"{self.name}.db"

    def _check_after_cut(self, verdict: Verdict, said: str, started: list[str]) -> None:
        """The store as the next run finds it (a fresh mount, nothing held): sound, and holding
        everything that was said or acted on."""
        disk, mnt, _, _ = self._paths()
        self.last_run = 0
        with Mount(disk, mnt, self.work / "crashfs.log"):
            store = self._store()
            if not store.exists():
                if verdict.reported or started:
                    verdict.problems.append("the store is gone, but steps were reported")
                return
            conn = sqlite3.connect(store)
            try:
                ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
                if ok != "ok":
                    verdict.problems.append(f"integrity_check: {ok}")
                    return
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version:  # 0: the schema itself was not yet committed
                    for table, query in invariant_queries(version):
                        if (bad := conn.execute(query).fetchone()) is not None:
                            verdict.problems.append(f"invariant broken in {table}: {bad}")
                done = dict(conn.execute("SELECT id, attempts FROM todos WHERE status='completed'")
                            .fetchall()) if version else {}  # fmt: skip
                self.last_run = conn.execute("SELECT coalesce(max(id), 0) FROM runs").fetchone()[
                    0] if version else 0  # fmt: skip
                findings = {
                    (task, key)
                    for task, key in conn.execute(
                        "SELECT f.task_id, f.key FROM findings f JOIN todos t ON t.id=f.task_id"
                        " AND f.attempt=t.attempts"
                    )
                } if version else set()  # fmt: skip
            finally:
                conn.close()
        verdict.durable = sorted(done)
        for task in verdict.reported:
            if task not in done:
                verdict.problems.append(f"{task}: reported completed, lost at the cut")
        for task in verdict.reported:  # with what it found
            for key in self.keys.get(task, []) if task in done else []:
                if (task, key) not in findings:
                    verdict.problems.append(f"{task}: finding {key} lost at the cut")
        for task in started:
            for need in self.needs.get(task, []):
                if need not in done:
                    verdict.problems.append(
                        f"{task} started, but {need}, which it needs, is not recorded done"
                    )

    def _check_resume(self, verdict: Verdict, host: Host) -> None:
        """The next run finishes the plan and runs no step whose completion was durable."""
        disk, mnt, witness, _ = self._paths()
        before = len(witness.read_text().splitlines())
        err = self.work / "resumed.err"
        with Mount(disk, mnt, self.work / "crashfs.log"), open(err, "wb") as stderr:
            proc = host.popen(self.orch_argv(), stdout=subprocess.DEVNULL, stderr=stderr,
                              cwd=self.work, env=self.env())  # fmt: skip
            code = proc.wait(timeout=300)
            host.reap()
            conn = sqlite3.connect(self._store())
            try:
                statuses = dict(conn.execute("SELECT id, status FROM todos WHERE in_plan=1"))
                runs = conn.execute("SELECT id, ended_at, outcome FROM runs ORDER BY id").fetchall()
                again = [
                    r[0]
                    for r in conn.execute(
                        "SELECT DISTINCT task_id FROM transitions WHERE to_status='in_progress'"
                        " AND run_id > ?",
                        (self.last_run,),
                    )
                ]
            finally:
                conn.close()
        if code != 0:
            tail = err.read_text(errors="replace")[-800:]
            verdict.problems.append(f"the resumed run exited {code}: {tail}")
        undone = sorted(t for t, s in statuses.items() if s not in ("completed", "skipped"))
        if undone:
            verdict.problems.append(f"not done after the resume: {undone}")
        started_again = witnessed(witness.read_text().splitlines()[before:])
        verdict.rerun = sorted(set(again) | set(started_again))
        # A launch whose server died with the host is started again, and orch says so: what
        # it made is gone, which its record cannot undo (docs/design.md, "Crashes").
        verdict.revived = sorted(set(REVIVED.findall(err.read_text(errors="replace"))))
        for task in verdict.rerun:
            if task in verdict.durable and task not in verdict.revived:
                verdict.problems.append(f"{task}: ran again after its completion was durable")
        if any(ended is None for _, ended, _ in runs):
            verdict.problems.append(f"a run is left without an end: {runs}")


@contextlib.contextmanager
def trial_dir(base: Path) -> Iterator[Path]:
    """A work folder for trials, removed after (nothing is left mounted in it)."""
    base.mkdir(parents=True, exist_ok=True)
    try:
        yield base
    finally:
        for mnt in base.rglob("mnt"):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
