"""Storage faults are outcomes, not tracebacks: damaged, removed, full, read-only, private.

Every case uses a real store made by a real `orch run`, then damages the file, the folder or
the file system under it (a small tmpfs, mounted here as root) and runs the real CLI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import cli
from orchestrator.core.errors import StoreError
from orchestrator.core.findings import Finding
from orchestrator.core.status import Status
from orchestrator.store.db import Store, TodoSpec

from conftest import PlanDir, run_orch, start_orch, wait_for

# One task that counts its runs in a file: a store taken as new would run it again.
COUNTING_PLAN = """\
name: t
tasks:
  - id: a
    kind: shell
    params: {{command: "echo ::finding k=1; echo ran >> {root}/a.count"}}
"""
# `a` says it started, then sleeps: time to damage the store under a live run.
SLOW_PLAN = """\
name: t
tasks:
  - id: a
    kind: shell
    params: {{command: "touch {root}/started; sleep 1.5"}}
  - id: b
    kind: shell
    needs: [a]
    params: {{command: "touch {root}/b.ran"}}
"""
COMMANDS = {
    "run": ["run", "plan.yaml"],
    "status": ["status", "plan.yaml"],
    "logs": ["logs", "plan.yaml", "a"],
    "history": ["history", "plan.yaml"],
}


def finished_store(pdir: PlanDir) -> Path:
    pdir.write(COUNTING_PLAN.format(root=pdir.root))
    r = run_orch("run", "plan.yaml", cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    assert not pdir.store_path().with_name("t.db-wal").exists()  # all in the main file
    return pdir.store_path()


def assert_refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, one `orch:` message naming the store and saying what is wrong; no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("orch: ") and ".orch/t.db" in r.stderr, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


def _empty(data: bytes) -> bytes:
    return b""


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _header_garbage(data: bytes) -> bytes:
    return os.urandom(100) + data[100:]


def _text_file(data: bytes) -> bytes:
    return b"name: t\ntasks: []\n"


def _pages_garbage(data: bytes) -> bytes:  # every b-tree page after the first, scrambled
    size = int.from_bytes(data[16:18], "big")  # the header's page size
    return data[:size] + bytes(b ^ 0x5A for b in data[size:])


def _index_garbage(data: bytes) -> bytes:
    """An index page scrambled: no command's queries read it, only quick_check notices."""
    conn = sqlite3.connect(":memory:")
    conn.deserialize(data[:18] + b"\x01\x01" + data[20:])  # as rollback-journal: WAL needs a file
    (root,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE type='index' AND tbl_name='transitions'"
    ).fetchone()
    conn.close()
    size = int.from_bytes(data[16:18], "big")  # the header's page size
    at = (root - 1) * size
    return data[:at] + bytes(b ^ 0x5A for b in data[at : at + size]) + data[at + size :]


def _index_disagrees(data: bytes) -> bytes:
    """The findings' index declared on other columns than it was built from: every page is
    sound (quick_check passes), but the index no longer matches its table."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "t.db")
        path.write_bytes(data)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA writable_schema=ON")
            conn.execute(
                'UPDATE sqlite_master SET sql = replace(sql, \'"task_id", "attempt"\', '
                "'\"key\", \"attempt\"') WHERE name = 'idx_findings_task_id_attempt'"
            )
            conn.commit()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA quick_check").fetchone() == ("ok",)
        return path.read_bytes()


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_empty, ("is empty (0 bytes)", "move it aside", "restore a backup")),
        (_half, ("truncated",)),
        (_header_garbage, ("not an SQLite database",)),
        (_text_file, ("not an SQLite database",)),
        (_pages_garbage, ("damaged", "restore a backup")),
        (_index_garbage, ("damaged (integrity_check", "restore a backup")),
        (_index_disagrees, ("damaged (integrity_check", "missing from index")),
    ],
    ids=["empty", "half", "header", "text", "pages", "index", "index-disagrees"],
)
def test_damaged_store_is_refused_by_every_command_never_taken_as_new(
    pdir: PlanDir, damage: Callable[[bytes], bytes], words: tuple[str, ...]
) -> None:
    store = finished_store(pdir)
    damaged = damage(store.read_bytes())
    store.write_bytes(damaged)
    for name, args in COMMANDS.items():
        assert_refused(run_orch(*args, cwd=pdir.root), *words)
        assert store.read_bytes() == damaged, f"{name} wrote into the damaged store"
    assert (pdir.root / "a.count").read_text() == "ran\n", "the completed task ran again"


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("UPDATE todos SET attempts = NULL", "todos row 'a': attempts is NULL"),
        ("UPDATE todos SET attempts = 'x'", "todos row 'a': attempts is text, not integer"),
        ("UPDATE todos SET status = 'done'", "todos row 'a': status 'done' is no status"),
        ("UPDATE todos SET position = NULL", "todos row 'a': position is NULL"),
        ("UPDATE transitions SET to_status = 'zzz'", "transitions row 1: to_status 'zzz'"),
        ("UPDATE runs SET started_at = 'soon'", "runs row 1: started_at is text, not real"),
        ("UPDATE findings SET key = NULL", "findings row 1: key is NULL"),
        # Text that SQLite keeps and orch reads back as JSON: a damaged byte, a hand edit.
        ("UPDATE todos SET spec = char(0) || spec", "todos row 'a': spec is not a JSON object"),
        ("UPDATE todos SET needs = '{}'", "todos row 'a': needs is not a JSON array"),
        # A damaged byte in a REAL: a date past year 9999 would end every view in a traceback.
        ("UPDATE runs SET started_at = 1.17e14", "runs row 1: started_at 117000000000000.0 is"),
        ("UPDATE todos SET updated_at = 9e999", "todos row 'a': updated_at Inf is no time"),
        ("UPDATE transitions SET at = -1.5", "transitions row 1: at -1.5 is no time orch wrote"),
    ],
    ids=[
        "attempts-null",
        "attempts-text",
        "status",
        "position",
        "transition",
        "run",
        "finding",
        "spec-json",
        "needs-json",
        "run-time",
        "todo-time",
        "transition-time",
    ],
)
def test_a_store_that_breaks_orchs_invariants_is_refused_with_the_row_named(
    pdir: PlanDir, sql: str, named: str
) -> None:
    """An edited or half-migrated store that SQLite finds sound but orch never wrote: every
    command refuses it with the row and the value named (exit 2), no TypeError traceback."""
    pdir.write(
        COUNTING_PLAN.replace("echo ran", "echo ::finding k=1; echo ran").format(root=pdir.root)
    )
    assert run_orch("run", "plan.yaml", cwd=pdir.root).returncode == 0
    store = pdir.store_path()
    with contextlib.closing(sqlite3.connect(store)) as conn:
        conn.execute(sql)
        conn.commit()
    for args in COMMANDS.values():
        assert_refused(run_orch(*args, cwd=pdir.root), "damaged", named)


def test_store_of_a_newer_orch_is_refused(pdir: PlanDir) -> None:
    store = finished_store(pdir)
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA user_version=99")
    conn.close()
    for args in COMMANDS.values():
        assert_refused(run_orch(*args, cwd=pdir.root), "newer orch (schema 99", "upgrade orch")


def test_sqlite_file_that_is_not_an_orch_store_is_refused(pdir: PlanDir) -> None:
    pdir.write(COUNTING_PLAN.format(root=pdir.root))
    pdir.store_path().parent.mkdir()
    with sqlite3.connect(pdir.store_path()) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.close()
    assert_refused(run_orch("run", "plan.yaml", cwd=pdir.root), "not an orch store")
    assert not (pdir.root / "a.count").exists()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished store kept aside; the property overwrites a damaged copy of it."""
    pdir = PlanDir(tmp_path_factory.mktemp("pristine"))
    return finished_store(pdir).rename(pdir.root / "pristine.db")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    at=st.one_of(st.integers(0, 99), st.integers(100, 1 << 20)),
    junk=st.binary(min_size=1, max_size=64),
)
def test_any_damage_to_the_store_is_an_outcome_not_a_traceback(
    pristine: Path, at: int, junk: bytes
) -> None:
    """Bytes overwritten anywhere (the header, or any page): each reading command either works
    or exits 2 with an `orch:` message; nothing raises. (A byte inside a row's text passes
    SQLite's checks: `orch logs` may then find no log where the row says, its own exit 1.)"""
    original = pristine.read_bytes()
    offset = at % len(original)
    damaged = original[:offset] + junk + original[offset + len(junk) :]
    store = pristine.with_name(".orch") / "t.db"
    store.write_bytes(damaged[: len(original)])
    for args in (
        ["status"],
        ["history"],
        ["history", "--transitions"],
        ["logs", "a"],
        ["plan", "plan.yaml"],
    ):
        with contextlib.chdir(pristine.parent):  # the log's path is kept relative to here
            r = CliRunner().invoke(cli, [*args, "--store", str(store)])
        no_log = args[0] == "logs" and r.output == "no output recorded for a\n"
        assert r.exit_code in (0, 2) or (r.exit_code == 1 and no_log), (
            args,
            r.exit_code,
            r.output,
            r.exception,
        )
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
        if r.exit_code == 2:
            assert r.output.startswith(f"orch: {store}"), r.output


@pytest.mark.parametrize("what", ["store", "folder"])
def test_store_removed_mid_run_stops_the_run(pdir: PlanDir, what: str) -> None:
    """The run would go on recording into the unlinked file: it stops at its next commit.
    `store`: the file alone (its logs stay); `folder`: all of .orch/."""
    pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", "plan.yaml", cwd=pdir.root)
    wait_for((pdir.root / "started").exists, what="task a started")
    if what == "folder":
        shutil.rmtree(pdir.root / ".orch")
    for name in ("t.db", "t.db-wal", "t.db-shm"):
        pdir.store_path().with_name(name).unlink(missing_ok=True)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert "was removed during the run" in err and "the run stopped" in err, err
    assert not (pdir.root / "b.ran").exists(), "the run went on after losing its store"


def test_store_replaced_mid_run_stops_the_run(pdir: PlanDir) -> None:
    """Replaced by a copy of itself (a restore from backup): the run stops, and the copy, which
    names this run, records the task interrupted with why."""
    pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", "plan.yaml", cwd=pdir.root)
    wait_for((pdir.root / "started").exists, what="task a started")
    store = pdir.store_path()
    backup = store.with_name("backup.db")
    with sqlite3.connect(store) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)  # a restore from backup, as an operator might do mid-run
    live.close()
    copy.close()
    os.replace(backup, store)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "was replaced by another file during the run" in err and "Traceback" not in err
    assert not (pdir.root / "b.ran").exists()
    assert pdir.statuses() == {"a": "interrupted", "b": "pending"}
    assert "the run stopped" in pdir.todo("a")["reason"]
    with pdir.db() as conn:
        assert [r[0] for r in conn.execute("SELECT outcome FROM runs")] == ["failed"]


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small file system of its own (root only), unmounted whatever happens."""
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


FILLING_PLAN = """\
name: t
tasks:
  - id: a
    kind: shell
    params: {command: "echo ran >> a.count"}
  - id: fill
    kind: shell
    needs: [a]
    params: {command: "test -e freed || head -c 64M /dev/zero > fill || true"}
  - id: c
    kind: shell
    needs: [fill]
    params: {command: "echo ran >> c.count"}
"""


def test_full_disk_stops_the_run_cleanly_and_status_still_reads(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as root:
        pdir = PlanDir(root)
        pdir.write(FILLING_PLAN)
        r = run_orch("run", "plan.yaml", cwd=root)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert "disk is full" in r.stderr or "No space left on device" in r.stderr, r.stderr
        assert "run again" in r.stderr

        s = run_orch("status", "plan.yaml", cwd=root)
        assert s.returncode == 0 and "Traceback" not in s.stderr, s.stderr
        assert "✓ a" in s.stdout or "a " in s.stdout
        with pdir.db() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

        (root / "fill").unlink()
        (root / "freed").touch()
        r = run_orch("run", "plan.yaml", cwd=root)
        assert r.returncode == 0, r.stderr
        assert set(pdir.statuses().values()) == {"completed"}
        assert (root / "a.count").read_text() == "ran\n", "a completed step ran again"


def test_read_only_store_can_be_read_but_not_run(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "4m") as root:
        pdir = PlanDir(root)
        pdir.write(COUNTING_PLAN.format(root=root))
        assert run_orch("run", "plan.yaml", cwd=root).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        status = run_orch("status", "plan.yaml", cwd=root)
        assert status.returncode == 0 and "1 completed" in status.stdout, status.stderr
        logs = run_orch("logs", "plan.yaml", "a", cwd=root)
        assert logs.returncode == 0 and "echo ran" in logs.stdout, logs.stderr
        history = run_orch("history", "plan.yaml", cwd=root)
        assert history.returncode == 0 and "completed" in history.stdout, history.stderr
        done = run_orch("run", "plan.yaml", cwd=root)  # finished: nothing to write
        assert done.returncode == 0 and "nothing to do" in done.stderr, done.stderr
        run = run_orch("run", "plan.yaml", "--rerun", "a", cwd=root)
        assert_refused(run, "read-only")
        assert (root / "a.count").read_text() == "ran\n"


UNFINISH = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("UPDATE todos SET status='pending' WHERE id='a'")
conn.commit()
os._exit(0)  # no close: the commit stays in the WAL, the main file still says completed
"""


def test_a_read_only_store_whose_wal_holds_commits_is_not_taken_as_finished(
    tmp_path: Path,
) -> None:
    """The re-run's quick look never reads the main file without its WAL: a commit there
    (here `a` made pending again) would be missed, and the plan called finished."""
    with tmpfs(tmp_path / "ro", "4m") as root:
        pdir = PlanDir(root)
        pdir.write(COUNTING_PLAN.format(root=root))
        assert run_orch("run", "plan.yaml", cwd=root).returncode == 0
        subprocess.run([sys.executable, "-c", UNFINISH, str(pdir.store_path())], check=True)
        assert pdir.store_path().with_name("t.db-wal").stat().st_size > 0
        pdir.store_path().with_name("t.db-shm").unlink()  # mode=ro can then not read the WAL
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        run = run_orch("run", "plan.yaml", cwd=root)
        assert "nothing to do" not in run.stderr
        assert_refused(run, "read-only")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_store_in_a_read_only_folder_can_be_read(pdir: PlanDir) -> None:
    store = finished_store(pdir)
    store.chmod(0o444)
    store.parent.chmod(0o555)
    try:
        status = run_orch("status", "plan.yaml", cwd=pdir.root)
        assert status.returncode == 0 and "1 completed" in status.stdout, status.stderr
        assert_refused(run_orch("run", "plan.yaml", "--rerun", "a", cwd=pdir.root), "read-only")
    finally:
        store.parent.chmod(0o700)


@contextmanager
def read_only_folder(where: Path, fill: Callable[[Path], None]) -> Iterator[str]:
    """`where`, made by `fill` and then sealed, as root too: a tmpfs remounted read-only (root
    writes through file modes), else mode 0555. Yields what the system says to a write."""
    if os.geteuid() == 0:
        with tmpfs(where, "1m"):
            fill(where)
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
            yield "Read-only file system"
        return
    where.mkdir()
    fill(where)
    sealed = [where, *(p for p in where.iterdir() if p.is_dir())]
    for folder in sealed:
        folder.chmod(0o555)
    try:
        yield "Permission denied"
    finally:
        for folder in sealed:
            folder.chmod(0o700)


@pytest.mark.parametrize("orch_folder", [False, True], ids=["no .orch", "empty .orch"])
def test_a_store_that_cannot_be_created_says_so_not_removed(
    tmp_path: Path, orch_folder: bool
) -> None:
    """A plan in a read-only folder: the store cannot be made. Said as such (never "removed
    during the run"), naming the store and the way out (--store), which then works."""

    def fill(root: Path) -> None:
        PlanDir(root).write(COUNTING_PLAN.format(root=tmp_path))  # it counts outside `root`
        if orch_folder:
            (root / ".orch").mkdir()

    with read_only_folder(tmp_path / "ro", fill) as why:
        root = tmp_path / "ro"
        for args in (["run", "plan.yaml"], ["todo", "add", "plan.yaml", "b"]):
            r = run_orch(*args, cwd=root)
            assert_refused(r, "cannot create the store", why, "--store PATH")
            assert "removed" not in r.stderr, r.stderr
        assert not (tmp_path / "a.count").exists()
        elsewhere = tmp_path / "elsewhere.db"
        r = run_orch("run", "plan.yaml", "--store", elsewhere, cwd=root)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "a.count").read_text() == "ran\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_and_folders_orch_creates_are_private(pdir: PlanDir) -> None:
    pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", "plan.yaml", cwd=pdir.root)
    wait_for((pdir.root / "started").exists, what="task a started")
    store = pdir.store_path()
    live = {p: mode(p) for p in (store.with_name("t.db-wal"), store.with_name("t.db-shm"))}
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert live == dict.fromkeys(live, 0o600)
    runs = store.with_name("t.runs")
    folders = [store.parent, runs, runs / "1"]
    files = [store, store.with_name("t.db.lock"), runs / "1" / "a.log", runs / "1" / "events.jsonl"]
    assert {p.name: mode(p) for p in folders} == {p.name: 0o700 for p in folders}
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_task_processes_keep_the_users_umask(pdir: PlanDir) -> None:
    """orch's umask 077 is for its own files: a task's files (a venv, say) stay as usual."""
    pdir.write(COUNTING_PLAN.format(root=pdir.root))
    old = os.umask(0o022)
    try:
        assert run_orch("run", "plan.yaml", cwd=pdir.root).returncode == 0
    finally:
        os.umask(old)
    assert mode(pdir.root / "a.count") == 0o644


def test_store_in_a_shared_folder_is_private_too(tmp_path: Path) -> None:
    """--store in a folder orch did not make: the folder is left as it is, what orch puts in
    it is private."""
    pdir = PlanDir(tmp_path)
    pdir.write(COUNTING_PLAN.format(root=tmp_path))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    assert run_orch("run", "plan.yaml", "--store", shared / "x.db", cwd=tmp_path).returncode == 0
    assert mode(shared) == 0o755
    assert (mode(shared / "x.db"), mode(shared / "x.runs")) == (0o600, 0o700)
    assert not list(shared.glob(".x.db.*")), "the store's temporary build was left behind"


# --- a completion held open for the next write (one commit for two) ---------------------------


def _committed(path: Path) -> dict[str, str]:
    """Statuses as another connection sees them: what is committed."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return dict(conn.execute("SELECT id, status FROM todos").fetchall())


def _two_tasks(path: Path) -> Store:
    store = Store.open(path)
    spec = [TodoSpec(t, i, t, "medium", "shell", (), "h", "{}") for i, t in enumerate("ab")]
    store.sync_plan(spec, None)
    store.transition("a", Status.IN_PROGRESS, None, None)
    return store


def test_a_held_completion_commits_with_the_next_write_or_at_close(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = _two_tasks(path)
    store.transition("a", Status.COMPLETED, None, None, hold=True)
    assert store.todo("a")["status"] == "completed"  # this connection reads its own writes
    assert _committed(path) == {"a": "in_progress", "b": "pending"}
    store.transition("b", Status.IN_PROGRESS, None, None)
    assert _committed(path) == {"a": "completed", "b": "in_progress"}
    store.transition("b", Status.COMPLETED, None, None, hold=True)
    store.close()  # an error ended the run before another write: close() commits it
    assert _committed(path) == {"a": "completed", "b": "completed"}


def test_a_failed_write_after_a_held_completion_undoes_itself_alone(tmp_path: Path) -> None:
    """The joining write fails halfway (its status change made, then a finding SQLite cannot
    store): the held completion still commits, the failed write leaves nothing, and the store
    takes writes again."""
    path = tmp_path / "s.db"
    store = _two_tasks(path)
    store.transition("a", Status.COMPLETED, None, None, hold=True)
    unstorable = Finding("k", object())  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        store.transition("b", Status.IN_PROGRESS, None, None, findings=[unstorable])
    assert _committed(path) == {"a": "completed", "b": "pending"}
    assert store.todo("b")["status"] == "pending" and store.findings() == {}
    store.transition("b", Status.IN_PROGRESS, None, None)
    assert _committed(path) == {"a": "completed", "b": "in_progress"}
    store.close()


def test_what_is_said_of_a_held_completion_is_said_only_if_it_commits(tmp_path: Path) -> None:
    """A held completion, then a joining write on a full disk: SQLite rolls back the whole
    transaction (SQLITE_FULL), the held part with it. The completion is then not said (its
    `after_commit` never runs), nothing stays held (a later commit would fail on a transaction
    that is gone: "no transaction is active"), and once there is room the store takes writes."""
    told: list[str] = []
    with tmpfs(tmp_path / "small", "1m") as root:
        path = root / "s.db"
        store = _two_tasks(path)
        try:
            store.transition("a", Status.COMPLETED, None, None, hold=True)
            store.after_commit(lambda: told.append("a"))
            with open(root / "fill", "wb") as fill, contextlib.suppress(OSError):
                while True:
                    fill.write(b"\0" * 65536)
                    fill.flush()
            # More than SQLite's page cache holds: it spills to the WAL mid-transaction, where
            # the full disk fails it and SQLite rolls everything back, the held part too.
            many = [Finding(f"k{i}", i) for i in range(40_000)]
            with pytest.raises(StoreError, match="the disk is full"):
                store.transition("b", Status.IN_PROGRESS, None, None, findings=many)
            committed = _committed(path)["a"]
            assert told == (["a"] if committed == "completed" else []), (committed, told)
            (root / "fill").unlink()
            store.transition("b", Status.IN_PROGRESS, None, None)  # commits, nothing stale held
            assert _committed(path)["b"] == "in_progress"
        finally:
            store.close()


def test_a_second_store_open_in_one_process_keeps_the_first_ones_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it
    (fcntl's rule), SQLite's included: another process could then checkpoint and remove the
    WAL under a live connection. A second open (a live board, the event feed, a peek) must
    leave the first connection's locks as they were."""
    path = tmp_path / "t.db"
    first = Store.open(path, create=True)
    inode = os.stat(path).st_ino

    def held() -> list[str]:
        # Each line less its ordinal ("7: POSIX ..."): a lock another process takes or drops
        # meanwhile renumbers ours (seen with a second suite running beside this one).
        with open("/proc/locks") as f:
            return [
                line.partition(": ")[2]
                for line in f
                if f":{inode} " in line and f" {os.getpid()} " in line
            ]

    before = held()
    assert before, "SQLite holds a lock on the store while a connection is open"
    try:
        Store.open(path, create=False).close()
        Store.peek(path).close()
        assert held() == before
    finally:
        first.close()


def test_a_commit_the_full_disk_refuses_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    """SQLite writes a transaction's pages to the WAL at COMMIT: that is where a full disk
    shows. The write must fail as a StoreError (never be taken as done), leave nothing, and
    the same connection take writes again once there is room."""
    with tmpfs(tmp_path / "small", "1m") as root:
        store = Store.open(root / "s.db")
        try:
            with open(root / "fill", "wb") as fill, contextlib.suppress(OSError):
                while True:
                    fill.write(b"\0" * 65536)
                    fill.flush()
            with pytest.raises(StoreError, match="full"):
                store.set_meta("big", "x" * 200_000)
            (root / "fill").unlink()
            assert store.meta("big") is None
            store.set_meta("small", "y")
            assert store.meta("small") == "y"
        finally:
            store.close()
