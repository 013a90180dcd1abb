"""The SQLite store (store/db.py) through its API on real files: schema versions, the
allowed transitions, attempts, findings, plan sync, runs and resources."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import StoreError
from orchestrator.core.findings import Finding
from orchestrator.core.status import ALLOWED, Status
from orchestrator.store.db import Store, fault_message
from orchestrator.store.liveness import current_identity
from orchestrator.store.schema import COLUMNS_SINCE, SCHEMA_VERSION, TABLES_SINCE

from conftest import PlanDir, run_orch
from store_rows import todo_spec

# --- store/db.py ----------------------------------------------------------------------------


def test_store_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match=rf"written by a newer orch \(schema {SCHEMA_VERSION + 1}"):
        Store.open(path)
    store = Store.open(path.with_name("same.db"))  # the current version itself is fine
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()
    Store.open(path.with_name("same.db")).close()


def test_cli_on_a_newer_schema_store_exits_2_without_traceback(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        tasks: [{id: a, kind: shell, params: {command: "true"}}]
    """)
    assert run_orch("run", plan).returncode == 0
    with pdir.db() as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        conn.commit()
    for cmd in ("status", "run"):
        r = run_orch(cmd, plan)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "written by a newer orch" in r.stderr and "Traceback" not in r.stderr


def test_missing_store_is_not_created_when_reading(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        Store.open(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "s.db")
    s.sync_plan([todo_spec("a")], None)
    try:
        yield s
    finally:
        s.close()


def test_only_allowed_transitions_are_accepted(store: Store) -> None:
    """Every pair of statuses: the store takes exactly those in ALLOWED, and a refused one
    changes nothing (no row, no log entry)."""
    for current in Status:
        for to in Status:
            store.conn.execute("UPDATE todos SET status=? WHERE id='a'", (str(current),))
            logged = len(store.transitions("a"))
            if to in ALLOWED[current]:
                store.transition("a", to, None, None)
                assert store.todo("a")["status"] == to
            else:
                with pytest.raises(StoreError, match=f"{current} -> {to} is not a valid"):
                    store.transition("a", to, None, None, [Finding("k", 1)])
                assert store.todo("a")["status"] == current
                assert len(store.transitions("a")) == logged
                assert store.findings() == {}
    with pytest.raises(StoreError, match="unknown task 'zz'"):
        store.transition("zz", Status.IN_PROGRESS, None, None)


def test_attempts_count_starts_only(store: Store) -> None:
    assert store.transition("a", Status.IN_PROGRESS, None, 1) == 1
    assert store.transition("a", Status.FAILED, "x", 1) == 1
    assert store.transition("a", Status.IN_PROGRESS, None, 2) == 2
    assert store.todo("a")["attempts"] == 2 and store.todo("a")["run_id"] == 2
    store.transition("a", Status.COMPLETED, None, None)
    assert store.todo("a")["run_id"] == 2, "no run given: the row keeps its run"
    assert [(t["from_status"], t["to_status"], t["attempt"]) for t in store.transitions("a")] == [
        (None, "pending", 0),
        ("pending", "in_progress", 1),
        ("in_progress", "failed", 1),
        ("failed", "in_progress", 2),
        ("in_progress", "completed", 2),
    ]
    assert [t["to_status"] for t in store.transitions("a", limit=2)] == ["in_progress", "completed"]


def test_findings_kept_on_completion_and_only_the_latest_attempt_shown(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 1)
    store.transition(
        "a",
        Status.COMPLETED,
        None,
        1,
        [Finding("v", 1), Finding("v", 2, "ms", "n"), Finding("ok", True)],
    )
    assert store.findings() == {
        "a": [Finding("v", 1), Finding("v", 2, "ms", "n"), Finding("ok", True)]
    }
    assert store.finding("a", "v") == Finding("v", 2, "ms", "n")
    assert store.finding("a", "ok") == Finding("ok", True)
    assert store.finding("a", "nope") is None
    store.transition("a", Status.IN_PROGRESS, None, 2)  # a new attempt: old findings hidden
    assert store.findings() == {} and store.finding("a", "v") is None


def test_sync_plan_keeps_status_and_marks_removed_tasks(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 1)
    store.transition("a", Status.COMPLETED, None, 1)
    store.sync_plan([todo_spec("a", 0, "renamed"), todo_spec("b", 1)], 2)
    assert [(r["id"], r["status"], r["title"]) for r in store.todos()] == [
        ("a", "completed", "renamed"),
        ("b", "pending", "b"),
    ]
    before = store.conn.total_changes
    store.sync_plan([todo_spec("a", 0, "renamed"), todo_spec("b", 1)], 3)
    assert store.conn.total_changes == before, "an unchanged plan writes nothing"
    store.sync_plan([todo_spec("b", 0)], 4)
    assert [r["id"] for r in store.todos()] == ["b"]
    assert store.todo("a")["in_plan"] == 0 and store.todo("a")["status"] == "completed"
    store.sync_plan([todo_spec("a", 0, "renamed"), todo_spec("b", 1)], 5)
    assert [r["id"] for r in store.todos()] == ["a", "b"]


def test_all_done_and_plan_binding(store: Store) -> None:
    assert store.all_done() is False
    store.transition("a", Status.SKIPPED, "when false", None)
    assert store.all_done() is True
    run_id = store.begin_run(current_identity(), "p", "orch run", Path("."))
    assert store.all_done() is False, "an open run is not done"
    store.end_run(run_id, "completed")
    assert store.all_done() is True
    empty = Store.open(store.path.with_name("e.db"))
    assert empty.all_done() is False, "a plan with no task recorded is not done"
    empty.close()
    store.bind_plan("p1")
    store.bind_plan("p1")
    assert store.plan_name() == "p1"
    with pytest.raises(StoreError, match="holds plan 'p1', not 'p2'"):
        store.bind_plan("p2")


def test_close_run_touches_only_its_own_tasks(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    store.sync_plan([todo_spec("a"), todo_spec("b", 1)], None)
    me = current_identity()
    r1 = store.begin_run(me, "p", "x", tmp_path)
    r2 = store.begin_run(me, "p", "x", tmp_path)
    assert store.next_run_id() == 3
    store.transition("a", Status.IN_PROGRESS, None, r1)
    store.transition("b", Status.IN_PROGRESS, None, r2)
    store.set_process("a", 4242, 12.5)
    assert store.close_run(r1, "interrupted", "stopped by Ctrl-C") == ["a"]
    assert store.todo("b")["status"] == "in_progress"
    a = store.todo("a")
    assert (a["status"], a["reason"], a["pgid"], a["pgid_started_at"]) == (
        "interrupted",
        "stopped by Ctrl-C",
        4242,
        12.5,
    )
    assert a["ended_at"] is not None
    assert store.close_run(r1, "crashed", "again") == []
    assert [(r["id"], r["outcome"]) for r in store.runs()] == [(r2, None), (r1, "interrupted")]
    assert [r["id"] for r in store.runs(limit=1)] == [r2]


def test_stray_whose_run_row_is_missing_is_interrupted(store: Store) -> None:
    store.transition("a", Status.IN_PROGRESS, None, 77)  # run 77 was never recorded
    assert store.interrupt_strays() == ["a"]
    assert store.todo("a")["status"] == "interrupted"
    assert store.interrupt_strays() == []


def test_resources_hold_replace_release(store: Store) -> None:
    store.hold("srv", "a", "server.launch", 1, {"pid": 1})
    store.hold("srv", "a", "server.launch", 1, {"pid": 2})
    store.hold("other", "a", "server.launch", 1, {})
    assert [r["name"] for r in store.held()] == ["srv", "other"]

    assert json.loads(store.held("srv")[0]["data"]) == {"pid": 2}
    store.release("srv", "a", "by task a")
    assert store.held("srv") == [] and [r["name"] for r in store.held()] == ["other"]
    row = {r["name"]: r for r in store.resources()}["srv"]
    assert (row["released_by"], row["how"]) == ("a", "by task a")
    assert row["released_at"] is not None


def test_why_a_task_did_not_start_is_noted_on_pending_plan_tasks_only(store: Store) -> None:
    """As a run ends, its pending tasks say why they did not start; a done task and a pending
    compensation keep what they said."""
    store.sync_plan([todo_spec("a"), todo_spec("b", 1), todo_spec("c", 2)], None)
    store.transition("a", Status.IN_PROGRESS, None, 1)
    store.transition("a", Status.COMPLETED, "done", 1)
    store.conn.execute("UPDATE todos SET role='compensation', reason='armed' WHERE id='c'")
    store.note_not_started(["a", "b", "c"], "the run stopped after a failure")
    reasons = {r["id"]: r["reason"] for r in store.todos()}
    assert reasons["b"] == "the run stopped after a failure"
    assert reasons["a"] == store.todo("a")["reason"] != "the run stopped after a failure"
    assert store.todo("c")["reason"] == "armed"


# --- what an SQLite error on the store tells the user (fault_message), from real errors ------


def _error_of(action: Callable[[], object]) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        action()
    return caught.value


def test_each_kind_of_sqlite_error_is_told_as_what_to_do(tmp_path: Path) -> None:
    """Each error SQLite raises on a store names the file and what to do about it: provoked
    for real (a read-only connection written, a write lock held, a folder that is not there,
    a file that is not a database), and a text column that is not UTF-8."""
    path = tmp_path / "s.db"
    Store.open(path).close()
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    writer = sqlite3.connect(path, timeout=0)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        told = {
            "readonly": _error_of(lambda: readonly.execute("DELETE FROM meta")),
            "busy": _error_of(
                lambda: (holder.execute("BEGIN EXCLUSIVE"), writer.execute("DELETE FROM meta"))
            ),
            "cantopen": _error_of(
                lambda: sqlite3.connect(f"file:{tmp_path}/no/s.db?mode=rw", uri=True)
            ),
        }
    finally:
        for conn in (readonly, writer, holder):
            conn.close()
    (tmp_path / "junk.db").write_bytes(b"x" * 4096)
    junk = sqlite3.connect(tmp_path / "junk.db")
    notadb = _error_of(lambda: junk.execute("SELECT * FROM sqlite_master"))
    junk.close()
    # An error that ended nothing but itself (a COMMIT with no transaction, as after SQLite
    # rolled one back on a full disk): the store is checked, and found intact, not "damaged".
    stray = sqlite3.connect(path, isolation_level=None)
    told["no_tx"] = _error_of(lambda: stray.execute("COMMIT"))
    stray.close()
    messages = {kind: fault_message(path, exc) for kind, exc in told.items()}
    messages["notadb"] = fault_message(tmp_path / "junk.db", notadb)
    assert (
        messages["readonly"]
        == f"{path} is read-only: `orch run` must write it (use another --store)"
    )
    assert messages["busy"].startswith(f"{path} stayed locked by another process for 10 s: ")
    assert messages["cantopen"].startswith(f"{path} cannot be read or written (")
    assert messages["cantopen"].endswith("): check the disk and its permissions")
    assert messages["notadb"].startswith(
        f"{tmp_path / 'junk.db'} is damaged (file is not a database; the file is malformed: "
    ), messages["notadb"]
    assert "restore a backup" in messages["notadb"]
    assert messages["no_tx"] == (
        f"{path}: SQLite refused the operation (cannot commit - no transaction is active); the "
        "store itself is intact (integrity_check and orch's checks pass): run again"
    )
    undecodable = UnicodeDecodeError("utf-8", b"ok \xff", 3, 4, "invalid start byte")
    assert fault_message(path, undecodable) == (
        f"{path} is damaged (ok \ufffd): move it aside to start over (every task runs again), "
        "or restore a backup"
    )


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_what_cannot_be_a_store_is_refused_before_it_is_opened(tmp_path: Path, kind: str) -> None:
    """A FIFO would block the open forever, and a folder is no file: each is named."""
    import os

    path = tmp_path / "s.db"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    what = r"a FIFO \(named pipe\)" if kind == "fifo" else "a folder"
    with pytest.raises(StoreError, match=rf"^{path} is {what}, not an orch store"):
        Store.open(path, create=False)


def test_a_store_gone_before_its_header_is_read_is_a_clear_error(tmp_path: Path) -> None:
    """A peek finds nothing there (a store removed since the caller looked): a StoreError that
    says so, which the callers of a peek take as "cannot tell"."""
    with pytest.raises(StoreError, match=r"s\.db cannot be read: No such file or directory$"):
        Store.peek(tmp_path / "s.db")


def test_a_new_store_has_pages_of_a_kibibyte(tmp_path: Path) -> None:
    """Every commit appends the pages it changed to the WAL: a new store's pages are 1 KiB, a
    quarter of SQLite's default, for commits ~30% cheaper (bench/bench_engine.py). SQLite
    ignores a size that is no power of two, silently: the size is read back."""
    store = Store.open(tmp_path / "s.db")
    try:
        assert store.conn.execute("PRAGMA page_size").fetchone()[0] == 1024
    finally:
        store.close()


def test_a_file_shorter_than_a_database_header_is_not_taken_for_one(tmp_path: Path) -> None:
    """SQLite's header is 100 bytes: 99 that start like one are another file, refused as such
    before SQLite reads them."""
    path = tmp_path / "s.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 83)
    with pytest.raises(StoreError, match=r"is not an SQLite database \(damaged or another file\)"):
        Store.open(path, create=False)


def test_a_store_of_64_kib_pages_is_measured_as_such(tmp_path: Path) -> None:
    """The header writes a page size of 65536 as 1: a whole store of such pages opens, and one
    cut short is refused with its true length in bytes."""
    path = tmp_path / "s.db"
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("PRAGMA page_size=65536")
    conn.execute("VACUUM")
    conn.close()
    header = path.read_bytes()[:100]
    assert header[16:18] == b"\x00\x01"  # 65536, as the format writes it
    pages = int.from_bytes(header[28:32], "big")
    Store.open(path, create=False).close()
    assert not path.with_name("s.db-wal").exists()
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size - 4096)
    with pytest.raises(
        StoreError, match=rf"is truncated \({size - 4096} of {65536 * pages} bytes\)"
    ):
        Store.open(path, create=False)


def test_a_store_this_process_made_is_checked_again_once_closed(tmp_path: Path) -> None:
    """A file this process has open is not read again (store/db.py, _OPEN); once the store
    made here is closed, its next open reads its header again and finds it cut. (Its making
    left it counted as open: every later open in the process skipped the check.)"""
    path = tmp_path / "s.db"
    Store.open(path).close()
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 1024)
    with pytest.raises(StoreError, match="is truncated"):
        Store.open(path, create=False)


PRAGMAS = ("journal_mode", "synchronous", "foreign_keys")


def test_a_writing_connection_has_the_durability_and_checks_orch_promises(store: Store) -> None:
    """WAL; a commit that records an outcome with synchronous=FULL (synced: it survives a
    power cut), one that only starts a task with NORMAL (a crash of the process loses
    nothing; a power cut makes the step run again); foreign keys enforced; one connection
    usable from the threads of a run's tasks (--jobs), under the store's own lock."""

    def pragma() -> dict[str, object]:
        return {p: store.conn.execute(f"PRAGMA {p}").fetchone()[0] for p in PRAGMAS}

    store.transition("a", Status.IN_PROGRESS, None, None)
    assert pragma() == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1}
    store.transition("a", Status.COMPLETED, None, None)
    assert pragma() == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1}
    store.transition("a", Status.PENDING, None, None)
    store.transition("a", Status.IN_PROGRESS, None, None)
    assert pragma()["synchronous"] == 1
    store.transition("a", Status.COMPLETED, None, None, hold=True)  # held: FULL when it commits
    store.note_reason("a", "a write that joins it")
    assert pragma()["synchronous"] == 2 and not store.conn.in_transaction
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        store.conn.execute(
            "INSERT INTO transitions(task_id, from_status, to_status, at, attempt)"
            " VALUES ('nobody', NULL, 'pending', 0, 0)"
        )
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(store.todo("a")))
    thread.start()
    thread.join()
    assert isinstance(seen[0], dict) and seen[0]["id"] == "a"


def test_a_status_written_since_the_open_by_another_hand_is_a_clear_error(store: Store) -> None:
    """The open checks every status; one written after it (not by orch) is found as a row is
    read, and named, rather than shown as a status orch does not have."""
    with sqlite3.connect(store.path) as other:
        other.execute("UPDATE todos SET status='finished' WHERE id='a'")
    other.close()
    with pytest.raises(StoreError, match="status 'finished' is no status"):
        store.todos()


def test_a_store_held_by_a_writer_is_waited_for(tmp_path: Path) -> None:
    """Another process's write lock is waited for (SQLite's busy timeout, set at the connect),
    not failed at once (a lock never given up: fault_message's "stayed locked", above)."""
    path = tmp_path / "s.db"
    Store.open(path).close()
    store = Store.open(path)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
        store.set_meta("k", "v")  # waits the half second, then writes
        assert store.meta("k") == "v"
    finally:
        holder.close()
        store.close()


def test_a_store_that_cannot_be_made_names_what_stood_in_the_way(tmp_path: Path) -> None:
    """Its folder cannot be made (a file has the folder's name): the error names that file and
    says where else to put the store; nothing is left behind."""
    blocker = tmp_path / "state"
    blocker.write_text("not a folder")
    path = blocker / ".orch" / "s.db"
    with pytest.raises(StoreError) as caught:
        Store.open(path)
    assert str(caught.value) == (
        f"cannot create the store {path}: Not a directory ({blocker / '.orch'}); "
        "give a writable place with --store PATH (or ORCH_STORE)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def _older_store(path: Path, version: int) -> None:
    """A store as schema `version` made it: today's, less what later versions added."""
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    for (table, column), since in COLUMNS_SINCE.items():
        if since > version:
            conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
    for table, since in TABLES_SINCE.items():
        if since > version:
            conn.execute(f'DROP TABLE "{table}"')
    conn.execute(f"PRAGMA user_version={version}")
    conn.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_an_older_store_is_held_to_its_own_version_then_upgraded(
    tmp_path: Path, version: int
) -> None:
    """A store of an older schema lacks what later versions added, and is upgraded; one that
    lacks a column its own version had is damaged, and refused before anything is added."""
    whole, cut = tmp_path / "whole.db", tmp_path / "cut.db"
    _older_store(whole, version)
    store = Store.open(whole)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()
    _older_store(cut, version)
    with sqlite3.connect(cut) as conn:
        conn.execute('ALTER TABLE "todos" DROP COLUMN "priority"')
    conn.close()
    with pytest.raises(StoreError, match=r"damaged \(table todos lacks priority\)"):
        Store.open(cut)
    with sqlite3.connect(cut) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    conn.close()


def test_opening_a_store_to_write_makes_its_private_logs_folder(tmp_path: Path) -> None:
    """The runs' logs live beside the store, as private as it is (0700), made at the open."""
    import stat

    path = tmp_path / "s.db"
    Store.open(path).close()
    logs = path.with_name("s.runs")
    assert logs.is_dir() and stat.S_IMODE(logs.stat().st_mode) == 0o700


def test_a_store_is_made_with_every_folder_above_it(tmp_path: Path) -> None:
    """`--store deep/er/s.db`: the folders that are not there yet are made, private."""
    import stat

    path = tmp_path / "deep" / "er" / "s.db"
    Store.open(path).close()
    assert path.is_file()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
