"""The todo store: one SQLite file per plan; the only module that speaks SQL.

Tables: `todos` (one row per task, its current state), `transitions` (append-only log of every
status change), `findings` (append-only, per attempt), `runs` (one per `orch run`),
`resources` (what a task left running for later tasks, e.g. a server, or leased while it runs,
a GPU; see run/leases.py), `approvals` (who let a gate pass, append-only), `meta`.
WAL mode. A commit survives a crash or SIGKILL of the process at any moment. Against a power
cut or a host reset, every commit that records an outcome (a task completed, skipped, failed,
a run ended, a person's note or change) is synced (`synchronous=FULL` for that commit: one
fsync of the WAL) before orch goes on or says it; a commit that only starts a task, or records
its process group, is not (`synchronous=NORMAL`): lost to a power cut, it only makes that
step run again, as any crash can (docs/design.md, "Crashes"). A task's
completion and its successor's start share one commit when run alone, so a step costs one
fsync (bench/bench_engine.py); tests/crashharness.py cuts power at every write and fsync.

Reads and writes use the stdlib sqlite3 connection directly; sqlite-utils upgrades an older
store's schema, a new store's is plain DDL made from the same tables (`schema_ddl`). Why:
importing sqlite_utils costs ~70-100 ms, more than the whole start-up budget of `orch status`.

Storage faults are outcomes (StoreError, exit 2), never tracebacks: an existing file that is
empty, not SQLite, or fails `PRAGMA quick_check` is refused, never taken as new (a new store is
built under a temporary name and linked into place, so a crash cannot leave a half-made one);
every public method turns sqlite3 errors into a StoreError naming the file; each commit first
checks that the path still names the file opened, so a store removed or replaced mid-run stops
the run instead of recording into an unlinked inode. Where the file or its folder cannot be
written, the store opens read-only (`mode=ro`, else `immutable=1`: see `_connect`) for the
commands that only read. The store, its -wal/-shm (SQLite gives them the file's mode), the
folder made for it and the runs folder are private: 0600/0700; none of them is opened through
a link (core/safeopen.py).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

from orchestrator.core.errors import StoreError, UsageError, did_you_mean
from orchestrator.core.files import not_a_file
from orchestrator.core.findings import Finding, FindingValue
from orchestrator.core.guards import undone_by
from orchestrator.core.redact import mask, mask_value
from orchestrator.core.safeopen import ensure_private_dir, ensure_store_folder, open_fd
from orchestrator.core.status import ALLOWED, MANUAL, RunOutcome, Status
from orchestrator.core.terminal import clean
from orchestrator.store.records import (  # the records of its API, imported from here too
    PLAN_ORIGIN as PLAN_ORIGIN,
)
from orchestrator.store.records import DoneMark as DoneMark
from orchestrator.store.records import GuardChange as GuardChange
from orchestrator.store.records import RunIdentity as RunIdentity
from orchestrator.store.records import TodoSpec as TodoSpec
from orchestrator.store.schema import (
    BOARD_COLUMNS,
    COLUMNS,
    COLUMNS_SINCE,
    INDEXES,
    SCHEMA_VERSION,
    STATUS_COLUMNS,
    TABLE_OPTIONS,
    TABLES_SINCE,
    invariant_queries,
    schema_ddl,
)

if TYPE_CHECKING:  # the rows it returns: for annotations only (`orch status` imports no more)
    from orchestrator.store.rows import (
        ApprovalRow,
        BoardRow,
        FindingRow,
        HeldResourceRow,
        ListedTodoRow,
        ResourceRow,
        RunRow,
        TodoRow,
        TransitionRow,
    )

BUSY_TIMEOUT_MS = 10_000
PAGE_SIZE = 1024  # bytes, for a new store: see _connect
SQLITE_MAGIC = b"SQLite format 3\x00"
PRIVATE_FILE = 0o600  # the folders: core/safeopen.py
# OSErrors that are the storage's fault, not a bug: reported as StoreError by the CLI.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
# sqlite3 decodes its error messages as UTF-8: a damaged schema's bytes in one raise this.
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)
_RESTORE = "move it aside to start over (every task runs again), or restore a backup"
DAMAGE_SHOWN = 120  # characters of a damaged value quoted in a message
# sqlite3's words for a text value that is not UTF-8 (read through a connection that decodes).
UNDECODABLE = "Could not decode to UTF-8"


def _damage(text: str) -> str:
    """What a damaged store holds, or sqlite3 says of it, as a message quotes it: anyone may
    have written it (escaped through `clean`, on one line) and it may be long (cut)."""
    cut = text[:DAMAGE_SHOWN]
    return clean(cut, multiline=False) + ("…" if len(text) > DAMAGE_SHOWN else "")


P = ParamSpec("P")
R = TypeVar("R")


# What a task made pending again (forgotten, undone) no longer claims about its last attempt.
_FRESH: dict[str, Any] = dict.fromkeys(
    ("last_error", "output_tail", "started_at", "ended_at", "pgid", "pgid_started_at")
)


# A status column's stored text -> the Status a read gives (None: a first transition's from).
_STATUSES: dict[str | None, Status | None] = {None: None, **{s.value: s for s in Status}}


def runs_dir(store_path: Path) -> Path:
    """Logs live beside the store: `.orch/<plan>.runs/<run id>/`."""
    return store_path.with_name(store_path.stem + ".runs")


def fault_message(path: Path, exc: sqlite3.Error | UnicodeDecodeError) -> str:
    """What an sqlite3 error on the store at `path` means to the user, and what to do."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{path} is damaged ({_damage(exc.object.decode('utf-8', 'replace'))}): {_RESTORE}"
    if str(exc).startswith(UNDECODABLE):  # orch writes UTF-8 only: that text is damage
        return f"{path} is damaged ({_damage(str(exc))}): {_RESTORE}"
    name = getattr(exc, "sqlite_errorname", "")
    device = _device_state(path)  # what the file system says, whatever SQLite's code was
    if name.startswith("SQLITE_FULL") or device == "full":
        return (
            f"{path}: the disk is full; what was recorded before is intact: free space, "
            "then run again"
        )
    if name.startswith("SQLITE_READONLY") or device == "read-only":
        return f"{path} is read-only: `orch run` must write it (use another --store)"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return f"{path} stayed locked by another process for {BUSY_TIMEOUT_MS // 1000} s: {exc}"
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN")):
        return f"{path} cannot be read or written ({exc}): check the disk and its permissions"
    # "Damaged" is said only where the file's own checks say so: a message that sends the
    # operator to throw the store away must be true (an error that ended a transaction, say,
    # leaves it intact).
    try:
        problem = damage_of(path)
    except SQLITE_ERRORS as unchecked:  # the disk that failed the operation fails the check
        return (
            f"{path}: SQLite failed ({_damage(str(exc))}), and the store could not be checked "
            f"({_damage(str(unchecked))}): check the disk, then run again (`orch status` "
            "checks the store)"
        )
    if problem is None:
        return (
            f"{path}: SQLite refused the operation ({_damage(str(exc))}); the store itself is "
            "intact (integrity_check and orch's checks pass): run again"
        )
    # sqlite3 quotes the damaged text: "Could not decode to UTF-8 column 'x' with text '...'".
    return f"{path} is damaged ({_damage(str(exc))}; {problem}): {_RESTORE}"


def _device_state(path: Path) -> str | None:
    """ "full" or "read-only" where the store's file system is, else None."""
    try:
        sv = os.statvfs(path.parent)
    except OSError:
        return None
    if sv.f_flag & os.ST_RDONLY:
        return "read-only"
    return "full" if sv.f_bavail == 0 else None


def damage_of(path: Path) -> str | None:
    """What `integrity_check` or orch's invariants find wrong with the store, through a
    connection of its own (read-only); None where both pass. Raises the sqlite3 error of a
    check that cannot run (a disk that fails reads too): that says nothing of the file."""
    conn = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return _integrity_problem(conn) or (_invariant_problem(conn, version) if version else None)
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            return f"the file is malformed: {_damage(str(exc))}"
        raise
    finally:
        conn.close()


def _integrity_problem(conn: sqlite3.Connection) -> str | None:
    # integrity_check, not quick_check: it also holds every index against its table (one
    # that disagrees passes quick_check, and a finding read through it can be silently
    # gone), for ~0.9 ms more at each open of a 1000-task store (bench/bench_integrity.py).
    problem = conn.execute("PRAGMA integrity_check(1)").fetchone()[0]
    return None if problem == "ok" else f"integrity_check: {_damage(problem)}"


def _invariant_problem(conn: sqlite3.Connection, version: int) -> str | None:
    """The first row that breaks what orch writes (schema.invariant_queries), described."""
    for table, query in invariant_queries(version):
        if (bad := conn.execute(query).fetchone()) is not None:
            return f"{table} row {_damage(repr(bad[0]))}: {_damage(bad[1])}"
    return None


def _cannot_create(path: Path, exc: OSError, tmp: Path | None = None) -> str:
    """The store (or its folder) could not be made: where, why, and the way out (--store)."""
    named = exc.filename and exc.filename not in (str(path), str(tmp))
    where = f" ({exc.filename})" if named else ""
    if exc.errno == errno.ENOSPC:
        return (
            f"cannot create the store {path}: the disk is full{where}: free space, then run again"
        )
    if exc.errno == errno.EIO:
        return f"cannot create the store {path}: {exc.strerror}{where}: check the disk"
    return (
        f"cannot create the store {path}: {exc.strerror}{where}; "
        "give a writable place with --store PATH (or ORCH_STORE)"
    )


def _made_beside(tmp: Path) -> tuple[Path, Path, Path]:
    """A store being built and what SQLite makes beside it."""
    return (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm"))


def lost_message(path: Path, replaced: bool = False) -> str:
    what = "replaced by another file" if replaced else "removed"
    return (
        f"{path} was {what} during the run: nothing more can be recorded, so the run "
        "stopped; restore the store from a backup, or run again to start over (every task "
        "runs again)"
    )


@functools.cache
def _update_todo_sql(columns: tuple[str, ...]) -> str:
    """A transition's UPDATE for these columns: the same few texts every time, made once."""
    return f"UPDATE todos SET {', '.join(f'{k}=?' for k in columns)} WHERE id=?"


def _guarded(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """Turn the sqlite3 errors of a Store method into a StoreError that names the file."""

    @functools.wraps(method)
    def wrapper(store: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with store._lock:
                return method(store, *args, **kwargs)
        except SQLITE_ERRORS as exc:
            raise StoreError(fault_message(store.path, exc)) from None

    return wrapper


# The files this process has a connection open to, by (device, inode): closing any other
# descriptor of such a file drops every POSIX lock the process holds on it (fcntl's rule),
# SQLite's own included; another process could then take the store as unused and checkpoint
# and remove its WAL under a live connection. So a file open here is not read again.
_OPEN: Counter[tuple[int, int]] = Counter()
_OPEN_LOCK = threading.Lock()


def _check_file(path: Path) -> None:
    """Refuse what is there but cannot be a store: a folder, a FIFO or a device (opening a
    FIFO would wait forever), an empty file, not SQLite, cut. A file this process has open
    already was checked then, and its header is not read again (see _OPEN)."""
    if (what := not_a_file(path)) is not None:
        raise StoreError(f"{path} is {what}, not an orch store: use another --store")
    try:
        st = path.stat()
        size = st.st_size
        with _OPEN_LOCK:  # held while the header is read: no connection opens meanwhile
            if _OPEN[st.st_dev, st.st_ino]:
                return
            with path.open("rb") as f:
                header = f.read(100)
    except OSError as exc:  # gone, or turned into a folder, since not_a_file looked
        raise StoreError(f"{path} cannot be read: {exc.strerror}") from None
    if size == 0:
        raise StoreError(f"{path} is empty (0 bytes), not a new store: " + _RESTORE)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path} is not an SQLite database (damaged or another file): " + _RESTORE)
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count is kept up to date by checkpoints only: with a -wal beside, the
    # file may lawfully be shorter than it says until then (quick_check still judges it).
    wal = path.with_name(path.name + "-wal")
    if size < page_size * pages and not wal.exists():
        raise StoreError(f"{path} is truncated ({size} of {page_size * pages} bytes): " + _RESTORE)


def _writable(path: Path) -> bool:
    """Can a writer use it: the file and its folder (for the -wal and -shm) writable."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _connect(path: Path, readonly: bool, whole: bool = False) -> sqlite3.Connection:
    """A connection that has read the schema version (so that a bad file fails here).

    Read-only: `mode=ro` first, which still sees what a live run has in its WAL; where that
    cannot work (no -shm and a folder no one may write, a full disk), `immutable=1`, which
    reads the main file alone and takes no lock: the last commits of a run killed before its
    checkpoint may then be missing from what is shown. `whole`: never that; `immutable=1`
    only where there is no WAL, whose commits it would miss.
    """
    at = quote(str(path.absolute()))
    partial_ok = not whole or not path.with_name(path.name + "-wal").exists()
    uris = (
        [f"file:{at}?mode=ro", *([f"file:{at}?immutable=1"] if partial_ok else [])]
        if readonly
        else [str(path)]
    )
    for i, uri in enumerate(uris):
        conn = sqlite3.connect(  # shared by a run's task threads (--jobs), under Store._lock
            uri,
            uri=readonly,
            isolation_level=None,
            timeout=BUSY_TIMEOUT_MS / 1000,  # SQLite's busy timeout (PRAGMA busy_timeout)
            check_same_thread=False,
        )
        try:
            if not readonly:
                # A new store's pages are 1 KiB (SQLite's default is 4): every commit appends
                # the pages it changed to the WAL, about three per transition; a quarter of
                # the bytes makes a commit ~30% cheaper. Ignored by an existing store.
                conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA user_version").fetchone()
            return conn
        except SQLITE_ERRORS:
            conn.close()
            if i == len(uris) - 1:
                raise
    raise AssertionError("unreachable")


def _rows(cursor: sqlite3.Cursor, statuses: tuple[str, ...] = ()) -> list[Any]:
    """A query's rows as they leave the store (rows.py): a plain dict each, column -> value,
    its `statuses` columns as Status. A dict costs ~1 us a row more to build than an
    sqlite3.Row, and each `row["key"]` after is a hash lookup, not a search of the column
    names: a 1000-task board is drawn ~1 ms sooner for it."""
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, r, strict=False)) for r in cursor.fetchall()]  # same lengths
    try:
        for column in statuses:
            for row in rows:
                row[column] = _STATUSES[row[column]]
    except KeyError as exc:  # written since the store's open (checked there), not by orch
        raise sqlite3.DatabaseError(f"{column} {exc} is no status") from None
    return rows


def _row(cursor: sqlite3.Cursor, statuses: tuple[str, ...] = ()) -> Any:
    """The query's one row (`_rows`), or None."""
    rows = _rows(cursor, statuses)
    return rows[0] if rows else None


_TODO, _TRANSITION = STATUS_COLUMNS["todos"], STATUS_COLUMNS["transitions"]
# The plan's tasks in plan order, with the attempts of their latest run: counted only where
# there can be more than one (CASE is lazy in SQLite): a 1000-task board reads ~1 ms sooner.
_LISTED = (
    "SELECT {columns}, CASE WHEN attempts > 1 THEN (SELECT count(*) FROM transitions t"
    " WHERE t.task_id = todos.id AND t.run_id = todos.run_id"
    " AND t.to_status = 'in_progress') ELSE attempts END AS run_attempts"
    " FROM todos WHERE in_plan=1 ORDER BY position, rowid"
)


class Store:
    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool = False) -> None:
        self.path = path
        self.conn = conn
        self.readonly = readonly  # opened for reading only: the file or its folder is not ours
        self._lock = threading.RLock()  # one caller at a time: tasks run in threads (--jobs)
        self._held = False  # a write transaction left open for the next write to commit
        self._synced = False  # the open transaction commits with an fsync (synchronous=FULL)
        self._after: list[Callable[[], None]] = []  # told once the held transaction commits
        self._path_text = str(path)
        st = os.stat(self._path_text)
        self._identity = (st.st_dev, st.st_ino)
        with _OPEN_LOCK:
            _OPEN[self._identity] += 1
            self._counted = True

    # --- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, create: bool = True) -> Store:
        """Open (and with `create`, make) the store at `path`; `create` also means "to write":
        a store that cannot be written is then refused, else opened read-only."""
        try:  # SQLite follows links itself: its folder and its four names are looked at first
            ensure_store_folder(path, create=create)
        except OSError as exc:
            raise StoreError(_cannot_create(path, exc)) from None
        if not path.exists():
            if not create:
                raise StoreError(
                    f"no store at {path} (has this plan been run? try `orch run PLAN`)"
                )
            cls._make(path)
        _check_file(path)
        readonly = not _writable(path)
        if readonly and create:
            raise StoreError(
                f"{path} is read-only: `orch run` must write it "
                "(make it writable, or copy it and use --store)"
            )
        try:
            conn = _connect(path, readonly)
        except SQLITE_ERRORS as exc:
            if readonly or create:
                raise StoreError(fault_message(path, exc)) from None
            readonly = True  # e.g. a full disk: no room for the -shm, but reading still works
            try:
                conn = _connect(path, readonly)
            except SQLITE_ERRORS as exc2:
                raise StoreError(fault_message(path, exc2)) from None
        store = cls(path, conn, readonly)
        try:
            store._check(create)
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def peek(cls, path: Path) -> Store:
        """Read-only and unchecked, for a quick look (is this plan finished?) that a full
        `open` follows where it matters; an sqlite3 error means "cannot tell". It sees every
        commit or fails: never a main file without its WAL."""
        ensure_store_folder(path, create=False)
        _check_file(path)  # before a connection, which may leave a -wal beside a cut file
        return cls(path, _connect(path, readonly=True, whole=True), readonly=True)

    @classmethod
    def _make(cls, path: Path) -> None:
        """Build a new store under a temporary name, then link it into place: the path names
        a complete store or nothing, whatever moment a crash hits."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
        try:
            for leftover in _made_beside(tmp):  # a killed orch's, of the same pid: ours to clear
                if os.path.lexists(leftover):
                    leftover.unlink()
            os.close(open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
            # Closed as a Store: its count in _OPEN goes too (the inode becomes the store's).
            with closing(cls(tmp, _connect(tmp, readonly=False))) as made:
                made._create_schema()
            try:
                os.link(tmp, path)
            except FileExistsError:
                # Made in the moment since open() found nothing: by another orch (complete: it
                # links too), or by a reader's sqlite3.connect(), which creates an empty file.
                # Only that one is replaced; an empty file that was there before is refused.
                if path.stat().st_size == 0:
                    os.replace(tmp, path)
        except SQLITE_ERRORS as exc:
            raise StoreError(fault_message(path, exc)) from None
        except OSError as exc:  # a read-only or private folder, say: --store goes elsewhere
            raise StoreError(_cannot_create(path, exc, tmp)) from None
        finally:
            for leftover in _made_beside(tmp):
                # not unlink(missing_ok): EROFS before ENOENT. A failure here (the disk that
                # failed the build) must not hide why: the next build of this pid clears it.
                if os.path.lexists(leftover):
                    with contextlib.suppress(OSError):
                        leftover.unlink()

    @_guarded
    def _check(self, create: bool) -> None:
        if (problem := _integrity_problem(self.conn)) is not None:
            raise StoreError(f"{self.path} is damaged ({problem}): {_RESTORE}")
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer orch (schema {version}, this "
                f"orch knows {SCHEMA_VERSION}): upgrade orch to use it"
            )
        if version == 0:
            raise StoreError(
                f"{self.path} is an SQLite database but not an orch store: use another --store"
            )
        for table, columns in COLUMNS.items():
            if version < TABLES_SINCE.get(table, 1):
                continue
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            wanted = {c for c in columns if version >= COLUMNS_SINCE.get((table, c), 1)}
            if not have >= wanted:
                raise StoreError(
                    f"{self.path} is damaged (table {table} lacks "
                    f"{', '.join(sorted(wanted - have))}): {_RESTORE}"
                )
        if (problem := _invariant_problem(self.conn, version)) is not None:
            raise StoreError(f"{self.path} is damaged ({problem}): {_RESTORE}")
        if version < SCHEMA_VERSION:
            if self.readonly:
                raise StoreError(
                    f"{self.path} has an older schema ({version}) and is "
                    "read-only: run `orch run` on it once where it is writable"
                )
            self._upgrade_schema()
        if create:  # the runs folder holds the logs: private like the store
            ensure_private_dir(runs_dir(self.path))

    def close(self) -> None:
        try:
            self.flush()  # a completion held for the next start that never came (an error)
        finally:
            self.conn.close()
            with _OPEN_LOCK:
                if self._counted:
                    _OPEN[self._identity] -= 1
                    self._counted = False

    @_guarded
    def flush(self) -> None:
        """Commit a transition held open (`transition(hold=True)`), if there is one."""
        if self._held:
            self._held = False
            try:
                self._check_same_file()
            except StoreError:
                self.conn.execute("ROLLBACK")
                raise
            self._commit()

    def _check_same_file(self) -> None:
        """Stop before a commit that would land in a file the path no longer names."""
        try:
            st = os.stat(self._path_text)  # Path.stat costs twice as much, at every commit
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._identity:
            raise StoreError(lost_message(self.path, replaced=st is not None))

    def _create_schema(self) -> None:
        """A new store: plain DDL (importing sqlite_utils costs ~100 ms of a 1000-task run)."""
        with self._tx():
            for statement in schema_ddl():
                self.conn.execute(statement)
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _upgrade_schema(self) -> None:
        """An older store: sqlite-utils adds what a later schema version has."""
        import sqlite_utils  # lazily: see the module docstring

        db = sqlite_utils.Database(self.conn)
        with self._tx():
            for table, columns in COLUMNS.items():
                db.table(table).create(columns, if_not_exists=True, **TABLE_OPTIONS[table])
            for (table, column), _ in COLUMNS_SINCE.items():  # upgrading an older store
                have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    default = TABLE_OPTIONS[table].get("defaults", {}).get(column)
                    db.table(table).add_column(
                        column, COLUMNS[table][column], not_null_default=default
                    )
            for table, index in INDEXES.items():
                db.table(table).create_index(list(index), if_not_exists=True)
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def _tx(self, hold: bool = False, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE so a concurrent writer waits instead of failing.

        With `hold` it is left open: the next write joins it and commits both (a task's
        completion and its successor's start, one commit for two: see Runner.attempt); what
        fails in the joining write is undone alone (a savepoint), the held part still commits.
        `synced`: its commit is made durable (see the module's docstring); SQLite takes the
        setting only between transactions, so a held transaction that is not is committed
        first (none is: only a completion is held).
        """
        if self._held and synced and not self._synced:
            self.flush()
        joined = self._held
        if not joined and synced != self._synced:
            self.conn.execute(f"PRAGMA synchronous={'FULL' if synced else 'NORMAL'}")
            self._synced = synced
        self.conn.execute("SAVEPOINT joined" if joined else "BEGIN IMMEDIATE")
        try:
            yield self.conn
            if not hold:
                self._check_same_file()
        except BaseException:
            if joined and self.conn.in_transaction:
                self.conn.execute("ROLLBACK TO joined")
                self.conn.execute("RELEASE joined")
                self.flush()  # the held part still commits
            elif self.conn.in_transaction:  # a failed COMMIT (a full disk) may have ended it
                self.conn.execute("ROLLBACK")
            if not self.conn.in_transaction:  # SQLite may have rolled back a held part too
                self._held, self._after = False, []
            raise
        if joined:
            self.conn.execute("RELEASE joined")
        self._held = hold
        if not hold:
            self._commit()

    def _commit(self) -> None:
        try:
            self.conn.execute("COMMIT")
        except SQLITE_ERRORS:
            self._after = []
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        told, self._after = self._after, []
        for tell in told:
            tell()

    def after_commit(self, tell: Callable[[], None]) -> None:
        """Call `tell` once what was written is committed (synced, if it records an outcome):
        at once, or when a held transaction commits; never if it is rolled back. What orch
        says of a step (`task.completed`) waits for this: nothing is reported that a power
        cut could take back."""
        if self._held:
            self._after.append(tell)
        else:
            tell()

    # --- plan ----------------------------------------------------------------------------------

    def bind_plan(self, name: str) -> None:
        """Tie the store to one plan; a store of another plan is refused, not mixed."""
        row = self.conn.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
        if row is None:
            with self._tx() as c:
                c.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('plan', ?)", (name,))
        elif row[0] != name:
            raise StoreError(
                f"{self.path} holds plan {row[0]!r}, not {name!r}; use another --store"
            )

    def plan_name(self) -> str | None:
        return self.meta("plan")

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str | None) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def all_done(self) -> bool:
        """Every task of the plan completed or skipped, and no run open."""
        row = self.conn.execute(
            "SELECT count(*), sum(status IN ('completed', 'skipped')) FROM todos"
            # A todo with no kind runs nothing; compensations run only when the plan fails.
            " WHERE in_plan=1 AND kind IS NOT NULL AND role IS NULL"
        ).fetchone()
        return bool(row[0]) and row[0] == row[1] and not self.open_runs()

    def sync_plan(self, specs: Sequence[TodoSpec], run_id: int | None) -> None:
        """Insert new tasks as pending, refresh what changed in titles, order and needs, and
        mark tasks gone from the plan; never touch status. Writes only what differs, so
        re-running a finished plan costs no write here."""
        now = time.time()
        current = {
            r[0]: tuple(r[1:])
            for r in self.conn.execute(
                "SELECT id, position, title, priority, kind, needs, origin, role, protects,"
                " in_plan FROM todos"
            )
        }
        added: list[tuple[Any, ...]] = []  # new tasks' rows, and their first transitions
        logged: list[tuple[Any, ...]] = []
        with self._tx() as c:
            for s in specs:
                needs = json.dumps(list(s.needs))
                fields = (
                    s.position,
                    s.title,
                    s.priority,
                    s.kind,
                    needs,
                    s.origin,
                    s.role,
                    s.protects,
                )
                row = current.pop(s.id, None)
                if row == (*fields, 1):
                    continue
                if row is not None:  # a todo added by hand that the plan file now declares:
                    c.execute(  # the file's (definition: only an added task has one)
                        "UPDATE todos SET position=?, title=?, priority=?, kind=?, needs=?,"
                        " origin=?, role=?, protects=?, in_plan=1,"
                        " definition=CASE WHEN ?='plan' THEN NULL ELSE definition END WHERE id=?",
                        (*fields, s.origin, s.id),
                    )
                    continue
                added.append((*fields, s.id, s.spec_hash, s.spec, now))
                logged.append((s.id, now, run_id))
            # New tasks in two statements, not two per task (a new 1000-task plan)
            c.executemany(
                "INSERT INTO todos(position, title, priority, kind, needs, origin, role,"
                " protects, id, status, spec_hash, spec, updated_at, attempts, in_plan)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, 0, 1)",
                added,
            )
            c.executemany(
                "INSERT INTO transitions(task_id, from_status, to_status, at, reason, run_id,"
                " attempt) VALUES (?, NULL, 'pending', ?, 'added to the plan', ?, 0)",
                logged,
            )
            gone = [task_id for task_id, row in current.items() if row[-1]]
            # Only the plan file's own tasks leave with it: added ones stay until removed.
            c.executemany(
                f"UPDATE todos SET in_plan=0 WHERE id=? AND origin='{PLAN_ORIGIN}'",
                [(g,) for g in gone],
            )

    # --- runs ----------------------------------------------------------------------------------

    def begin_run(self, who: RunIdentity, plan_file: str, argv: str, log_dir: Path) -> int:
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO runs(plan_file, started_at, pid, pid_started_at, host, boot_id,"
                " argv, log_dir) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    plan_file,
                    time.time(),
                    who.pid,
                    who.started_at,
                    who.host,
                    who.boot_id,
                    mask(argv),
                    str(log_dir),
                ),
            )
            return int(cur.lastrowid or 0)

    def next_run_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM runs").fetchone()[0])

    def end_run(self, run_id: int, outcome: RunOutcome) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET ended_at=?, outcome=? WHERE id=?", (time.time(), outcome, run_id)
            )

    def open_runs(self) -> list[RunRow]:
        """Runs with no recorded end: alive now, or died without a word."""
        return _rows(self.conn.execute("SELECT * FROM runs WHERE ended_at IS NULL"))

    def mark_dead_run(self, run: RunRow, why: str) -> list[str]:
        """Close a run whose orchestrator died (outcome `crashed`); see close_run."""
        return self.close_run(run["id"], RunOutcome.CRASHED, why)

    def close_run(self, run_id: int, outcome: RunOutcome, why: str) -> list[str]:
        """End a run and mark its in-progress tasks interrupted, in one transaction.

        Returns the ids of those tasks. Their recorded process group stays in the row so that
        the next run can end what was left behind before retrying.
        """
        now = time.time()
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT id FROM todos WHERE status='in_progress' AND run_id=?", (run_id,)
                )
            ]
            for task_id in ids:
                self._transition(c, task_id, Status.INTERRUPTED, why, run_id, now, ended_at=now)
            c.execute(
                "UPDATE runs SET ended_at=?, outcome=? WHERE id=? AND ended_at IS NULL",
                (now, outcome, run_id),
            )
        return ids

    def interrupt_strays(self) -> list[str]:
        """Tasks still in progress under a run that has ended (only the lock holder may ask:
        then nothing is really running). They become interrupted."""
        now = time.time()
        with self._tx() as c:
            rows = c.execute(
                "SELECT t.id, t.run_id FROM todos t LEFT JOIN runs r ON r.id = t.run_id"
                " WHERE t.status='in_progress' AND t.kind IS NOT NULL"
                " AND (r.ended_at IS NOT NULL OR r.id IS NULL)"
            ).fetchall()
            for task_id, run_id in rows:
                self._transition(
                    c,
                    task_id,
                    Status.INTERRUPTED,
                    f"left in progress by run #{run_id}, which has ended",
                    run_id,
                    now,
                    ended_at=now,
                )
        return [r[0] for r in rows]

    # --- transitions ---------------------------------------------------------------------------

    def transition(
        self,
        task_id: str,
        to: Status,
        reason: str | None,
        run_id: int | None,
        findings: Sequence[Finding] = (),
        guards: GuardChange | None = None,
        hold: bool = False,
        **fields: Any,
    ) -> int:
        """Move a task to `to`, log it and store findings (and what `guards` says): one
        transaction, committed on return (with `hold`: by the next write, or `flush`).

        Callers do this before the side effect that follows (start a process, start a
        dependent), so the store never claims less than what happened. Returns the attempt.
        """
        now = time.time()
        # Errors, output tails and findings may quote a secret var's value: never stored.
        reason, fields = mask_value(reason), mask_value(fields)
        # A start need not survive a power cut (the step runs again); an outcome must.
        with self._tx(hold, synced=to is not Status.IN_PROGRESS) as c:
            attempt = self._transition(c, task_id, to, reason, run_id, now, **fields)
            if findings:
                c.executemany(
                    "INSERT INTO findings(task_id, attempt, key, value, unit, note, at, run_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            task_id,
                            attempt,
                            f.key,
                            mask_value(_encode(f.value)),
                            f.unit,
                            mask_value(f.note),
                            now,
                            run_id,
                        )
                        for f in findings
                    ],
                )
            if guards is not None:
                self._guard_change(c, guards, task_id, run_id, now)
        return attempt

    def _guard_change(
        self, c: sqlite3.Connection, g: GuardChange, by: str, run_id: int | None, now: float
    ) -> None:
        for guard in g.arm:
            armed = c.execute("SELECT armed_run FROM todos WHERE id=?", (guard,)).fetchone()
            if armed is None or armed[0] is not None:
                continue  # armed already: by an earlier run whose failure it still has to mend
            self._transition(c, guard, Status.PENDING, g.arm_reason, run_id, now, **_FRESH)
            c.execute("UPDATE todos SET armed_run=?, armed_at=? WHERE id=?", (run_id, now, guard))
        if g.disarm is not None:
            c.execute("UPDATE todos SET armed_run=NULL, armed_at=NULL WHERE id=?", (g.disarm,))
        if g.undo is not None:
            row = c.execute("SELECT status FROM todos WHERE id=?", (g.undo,)).fetchone()
            if row is not None and Status(row[0]).done:
                self._transition(c, g.undo, Status.PENDING, undone_by(by), run_id, now, **_FRESH)

    def armed(self) -> list[TodoRow]:
        """Compensations and `finally` tasks armed now, the latest armed first (the order in
        which they undo: the last step done is the first undone)."""
        return _rows(
            self.conn.execute(
                "SELECT * FROM todos WHERE armed_run IS NOT NULL AND in_plan=1"
                " ORDER BY armed_at DESC, position DESC"
            ),
            _TODO,
        )

    def due(self, unended_crashed: bool = False) -> list[TodoRow]:
        """Armed tasks that a run since their arming has not lived up to: it failed, was
        interrupted or crashed, so they run before anything else (a run stopped at an
        approval gate failed nothing). `unended_crashed`: count a run with no recorded end as
        crashed, as the next run does once it holds the lock (`orch plan`, which writes
        nothing, when no run holds it)."""
        return [
            r
            for r in self.armed()
            if self.conn.execute(
                "SELECT 1 FROM runs WHERE id >= ? AND (ended_at IS NULL AND ?"
                " OR ended_at IS NOT NULL AND outcome NOT IN"
                f" ('{RunOutcome.COMPLETED}', '{RunOutcome.WAITING}')) LIMIT 1",
                (r["armed_run"], unended_crashed),
            ).fetchone()
        ]

    def arm(self, guard_ids: Sequence[str], reason: str, run_id: int) -> None:
        """Arm these compensations again, each pending with `reason` (`orch rollback
        --completed`: a completed plan's steps to be undone); one armed already is left."""
        with self._tx() as c:
            change = GuardChange(arm=tuple(guard_ids), arm_reason=reason)
            self._guard_change(c, change, "", run_id, time.time())

    def disarm(self, task_ids: Sequence[str], reason: str, run_id: int) -> None:
        """The plan completed: nothing to undo. Each becomes skipped with `reason`."""
        now = time.time()
        with self._tx() as c:
            for task_id in task_ids:
                self._transition(c, task_id, Status.SKIPPED, reason, run_id, now)
                c.execute("UPDATE todos SET armed_run=NULL, armed_at=NULL WHERE id=?", (task_id,))

    # --- approval gates ------------------------------------------------------------------------

    def approve(
        self,
        task_id: str,
        by: str,
        note: str | None,
        plan_hash: str,
        findings_hash: str,
        how: str,
        run_id: int | None = None,
    ) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO approvals(task_id, by, at, note, plan_hash, findings_hash, how,"
                " run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, by, time.time(), mask_value(note), plan_hash, findings_hash, how, run_id),
            )

    def latest_approval(self, task_id: str) -> ApprovalRow | None:
        """A gate's latest approval (the only one that can hold: approvals.judge), or None."""
        row: ApprovalRow | None = _row(
            self.conn.execute(
                "SELECT * FROM approvals WHERE task_id=? ORDER BY seq DESC LIMIT 1", (task_id,)
            )
        )
        return row

    def _transition(
        self,
        c: sqlite3.Connection,
        task_id: str,
        to: Status,
        reason: str | None,
        run_id: int | None,
        now: float,
        manual: bool = False,
        **fields: Any,
    ) -> int:
        row = c.execute("SELECT status, attempts FROM todos WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise StoreError(f"unknown task {task_id!r} in {self.path}")
        current = Status(row[0])
        if to not in (MANUAL if manual else ALLOWED)[current]:
            raise StoreError(f"task {task_id!r}: {current} -> {to} is not a valid transition")
        attempt = int(row[1]) + (1 if to is Status.IN_PROGRESS else 0)
        values = {
            "status": str(to),
            "reason": reason,
            "updated_at": now,
            "attempts": attempt,
            **fields,
        }
        if run_id is not None:
            values["run_id"] = run_id
        c.execute(_update_todo_sql(tuple(values)), (*values.values(), task_id))
        c.execute(
            "INSERT INTO transitions(task_id, from_status, to_status, at, reason, run_id, attempt)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (task_id, str(current), str(to), now, reason, run_id, attempt),
        )
        return attempt

    def forget(self, task_ids: Sequence[str], why: str) -> list[str]:
        """Make these tasks pending again, as if they had never run (one transaction, logged
        in transitions); their past attempts and findings stay in the history. A task in
        progress is refused: the caller holds the run lock, so none is."""
        now, done = time.time(), []
        with self._tx() as c:
            for task_id in task_ids:
                row = c.execute("SELECT status FROM todos WHERE id=?", (task_id,)).fetchone()
                if row is not None and row[0] != Status.PENDING:
                    self._transition(
                        c,
                        task_id,
                        Status.PENDING,
                        why,
                        None,
                        now,
                        **_FRESH,
                    )
                    done.append(task_id)
        return done

    # --- tasks added at run time (run/todos.py) ------------------------------------------------

    def add_todo(self, spec: TodoSpec, origin: str, definition: str | None) -> None:
        """Put a task no plan file declares on the board, pending (one transaction, logged):
        a new row, or one removed earlier brought back. Refused if the id is on the board:
        checked inside the transaction, so two clients adding it at once cannot both win."""
        now = time.time()
        with self._tx() as c:
            row = c.execute("SELECT in_plan, status FROM todos WHERE id=?", (spec.id,)).fetchone()
            if row is not None and row[0]:
                raise UsageError(f"task {spec.id!r} is already on the board")
            # A todo with no kind goes after what is on the board now; a task the plan's
            # loader placed (spec.position) keeps that place.
            position = spec.position
            if not spec.kind:
                position = int(
                    c.execute("SELECT coalesce(max(position), -1) + 1 FROM todos").fetchone()[0]
                )
            fields = {
                "position": position,
                "title": spec.title,
                "priority": spec.priority,
                "kind": spec.kind or None,
                "needs": json.dumps(list(spec.needs)),
                "spec_hash": spec.spec_hash,
                "spec": spec.spec,
                "origin": origin,
                "definition": definition,
                "in_plan": 1,
                "updated_at": now,
            }
            if row is None:
                c.execute(
                    f"INSERT INTO todos({', '.join(fields)}, id, status, attempts)"
                    f" VALUES ({', '.join('?' * len(fields))}, ?, 'pending', 0)",
                    (*fields.values(), spec.id),
                )
                self._log_change(c, spec.id, None, Status.PENDING, f"added by {origin}", now)
            else:
                assignments = ", ".join(f"{k}=?" for k in fields)
                c.execute(f"UPDATE todos SET {assignments} WHERE id=?", (*fields.values(), spec.id))
                self._transition(
                    c,
                    spec.id,
                    Status.PENDING,
                    f"added again by {origin}",
                    None,
                    now,
                    manual=True,
                    last_error=None,
                    output_tail=None,
                    started_at=None,
                    ended_at=None,
                )

    def remove_todo(self, task_id: str, by: str) -> None:
        """Take an added task off the board (its row and history stay, hidden); a task the
        plan file declares, one running, or one that a task on the board needs is refused."""
        with self._tx() as c:
            row = self._visible(c, task_id)
            if row["origin"] == PLAN_ORIGIN:
                raise UsageError(f"task {task_id!r} is declared in the plan file: remove it there")
            if row["kind"] is not None and row["status"] == Status.IN_PROGRESS:
                raise UsageError(f"task {task_id!r} is running: wait for it, or stop the run")
            needed_by = [
                r[0]
                for r in c.execute(
                    "SELECT id, needs FROM todos WHERE in_plan=1 AND id != ?", (task_id,)
                )
                if task_id in json.loads(r[1] or "[]")
            ]
            if needed_by:
                raise UsageError(
                    f"task {task_id!r} is needed by {', '.join(needed_by)}: remove those first"
                )
            c.execute("UPDATE todos SET in_plan=0, updated_at=? WHERE id=?", (time.time(), task_id))
            self._log_change(
                c, task_id, row["status"], row["status"], f"removed by {by}", time.time()
            )

    def set_todo(self, task_id: str, to: Status, reason: str | None, by: str) -> None:
        """Set the status of a todo with no kind (nothing runs it: whoever keeps it does)."""
        now = time.time()
        with self._tx() as c:
            row = self._visible(c, task_id)
            if row["kind"] is not None:
                raise UsageError(
                    f"task {task_id!r} has a kind: its status is what its runs make it "
                    "(run it, or `orch forget` it to make it pending)"
                )
            times: dict[str, Any] = {}
            if to is Status.IN_PROGRESS:
                times = {"started_at": now, "ended_at": None}
            elif to is not Status.PENDING:
                times = {"ended_at": now}
            self._transition(
                c,
                task_id,
                to,
                mask_value(reason) or f"set by {by}",
                None,
                now,
                manual=True,
                **times,
            )

    def note(self, task_id: str, finding: Finding, author: str) -> None:
        """Record a finding or a note on a task from outside its runs, with its author; it
        belongs to the task's latest attempt (a re-run starts a fresh set)."""
        with self._tx() as c:
            row = self._visible(c, task_id)
            c.execute(
                "INSERT INTO findings(task_id, attempt, key, value, unit, note, at, run_id, author)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                (
                    task_id,
                    row["attempts"],
                    finding.key,
                    mask_value(_encode(finding.value)),
                    finding.unit,
                    mask_value(finding.note),
                    time.time(),
                    author,
                ),
            )

    def finding_now(self, task_id: str, finding: Finding, run_id: int) -> None:
        """A finding of the running attempt committed at once, not with its end: a stall's
        evidence must be on record while the task still waits (or the run is killed)."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO findings(task_id, attempt, key, value, unit, note, at, run_id)"
                " SELECT id, attempts, ?, ?, ?, ?, ?, ? FROM todos WHERE id=?",
                (
                    finding.key,
                    mask_value(_encode(finding.value)),
                    finding.unit,
                    mask_value(finding.note),
                    time.time(),
                    run_id,
                    task_id,
                ),
            )

    def added(self) -> list[TodoRow]:
        """The tasks on the board that no plan file declares, in board order."""
        return _rows(
            self.conn.execute(
                f"SELECT * FROM todos WHERE in_plan=1 AND origin != '{PLAN_ORIGIN}'"
                " ORDER BY position, rowid"
            ),
            _TODO,
        )

    def _visible(self, c: sqlite3.Connection, task_id: str) -> TodoRow:
        row: TodoRow | None = _row(
            c.execute("SELECT * FROM todos WHERE id=? AND in_plan=1", (task_id,)), _TODO
        )
        if row is None:
            ids = [r[0] for r in c.execute("SELECT id FROM todos WHERE in_plan=1")]
            raise UsageError(f"no task {task_id!r} on the board{did_you_mean(task_id, ids)}")
        return row

    def _log_change(
        self,
        c: sqlite3.Connection,
        task_id: str,
        frm: Status | None,
        to: Status,
        why: str,
        now: float,
    ) -> None:
        """A transitions row that is not a status change of a run (from == to: an edit)."""
        c.execute(
            "INSERT INTO transitions(task_id, from_status, to_status, at, reason, run_id, attempt)"
            " VALUES (?, ?, ?, ?, ?, NULL, (SELECT attempts FROM todos WHERE id=?))",
            (task_id, None if frm is None else str(frm), str(to), now, why, task_id),
        )

    def note_reason(self, task_id: str, reason: str | None) -> None:
        """Say why a task that has not started waits (no status change, no transition); None:
        it waits no more."""
        with self._tx() as c:
            c.execute("UPDATE todos SET reason=? WHERE id=?", (reason, task_id))

    def note_not_started(self, task_ids: Sequence[str], reason: str) -> None:
        """As a run ends: why these tasks, if still pending, did not start in it (no status
        change, no transition). What they said before (a wait that ended, an earlier run's
        reset) is no longer why they are pending."""
        if not task_ids:
            return
        with self._tx() as c:
            c.executemany(
                "UPDATE todos SET reason=? WHERE id=? AND status='pending' AND role IS NULL",
                [(reason, task_id) for task_id in task_ids],
            )

    def set_process(self, task_id: str, pgid: int | None, started_at: float | None) -> None:
        """Record the process group a task started, so a later run can end it if we die
        (not synced: a power cut ends the group with us)."""
        with self._tx(synced=False) as c:
            c.execute(
                "UPDATE todos SET pgid=?, pgid_started_at=? WHERE id=?",
                (pgid, started_at, task_id),
            )

    # --- resources -----------------------------------------------------------------------------

    def hold(self, name: str, task_id: str, kind: str, run_id: int, data: dict[str, Any]) -> None:
        """Record that `task_id` holds `name` now (committed at once: a crash a moment later
        must still leave the next run able to end it). Holding a name again replaces it."""
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO resources(name, task_id, kind, data, run_id,"
                " held_at) VALUES (?, ?, ?, ?, ?, ?)",
                (name, task_id, kind, json.dumps(data), run_id, time.time()),
            )

    def held(self, name: str | None = None) -> list[HeldResourceRow]:
        """Resources not released (all, or the one called `name`)."""
        where, args = ("AND name=?", (name,)) if name else ("", ())
        return _rows(
            self.conn.execute(
                f"SELECT * FROM resources WHERE released_at IS NULL {where} ORDER BY held_at", args
            )
        )

    def release(self, name: str, by_task: str | None, how: str) -> None:
        """Mark `name` released: by a task (`by_task`), or by the engine (None)."""
        with self._tx() as c:
            c.execute(
                "UPDATE resources SET released_at=?, released_by=?, how=? WHERE name=?",
                (time.time(), by_task, how, name),
            )

    def resources(self) -> list[ResourceRow]:
        """Every resource, held or let go (one row per name: its latest holder): `name`,
        `task_id` (the holder), `released_at` (None while held), `released_by` (the releasing
        task, None where the engine ended it) and `how`."""
        return _rows(
            self.conn.execute(
                "SELECT name, task_id, kind, run_id, held_at, released_at, released_by, how"
                " FROM resources ORDER BY held_at"
            )
        )

    # --- reads ---------------------------------------------------------------------------------

    def todos(self) -> list[ListedTodoRow]:
        """The plan's tasks, in plan order (tasks since removed from the plan are kept, unshown),
        with `run_attempts`: the attempts of its latest run (the board's N×; `attempts` counts
        every run's, and numbers the findings)."""
        return _rows(self.conn.execute(_LISTED.format(columns="*")), _TODO)

    def board(self) -> list[BoardRow]:
        """`todos()` with only the columns a board draws (BOARD_COLUMNS)."""
        return _rows(self.conn.execute(_LISTED.format(columns=", ".join(BOARD_COLUMNS))), _TODO)

    def todo(self, task_id: str) -> TodoRow | None:
        row: TodoRow | None = _row(
            self.conn.execute("SELECT * FROM todos WHERE id=?", (task_id,)), _TODO
        )
        return row

    def findings(self) -> dict[str, list[Finding]]:
        """The findings of each task's latest attempt, in the order they were recorded (none
        for a pending task: one that was forgotten has no current findings)."""
        out: dict[str, list[Finding]] = {}
        for r in self.conn.execute(
            "SELECT f.task_id, f.key, f.value, f.unit, f.note, f.author FROM findings f"
            " JOIN todos t ON t.id = f.task_id AND f.attempt = t.attempts"
            # A forgotten task has none of its runs' now; notes written since are kept.
            " WHERE t.status != 'pending' OR f.author IS NOT NULL ORDER BY f.seq"
        ):
            out.setdefault(r[0], []).append(Finding(r[1], decode(r[2]), r[3], r[4], r[5]))
        return out

    def finding(self, task_id: str, key: str) -> Finding | None:
        """The latest value of one finding of a task's latest attempt."""
        r = self.conn.execute(
            "SELECT f.key, f.value, f.unit, f.note FROM findings f JOIN todos t ON t.id=f.task_id"
            " AND f.attempt=t.attempts WHERE f.task_id=? AND f.key=? ORDER BY f.seq DESC LIMIT 1",
            (task_id, key),
        ).fetchone()
        return None if r is None else Finding(r[0], decode(r[1]), r[2], r[3])

    def runs(self, limit: int = 20) -> list[RunRow]:
        return _rows(self.conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,)))

    def events_after(
        self, transition_seq: int, finding_seq: int, limit: int = 1000
    ) -> tuple[list[TransitionRow], list[FindingRow]]:
        """Transitions and findings recorded after these sequence numbers, oldest first: what
        `orch events --follow` prints as it happens."""
        transitions: list[TransitionRow] = _rows(
            self.conn.execute(
                "SELECT * FROM transitions WHERE seq > ? ORDER BY seq LIMIT ?",
                (transition_seq, limit),
            ),
            _TRANSITION,
        )
        findings: list[FindingRow] = _rows(
            self.conn.execute(
                "SELECT * FROM findings WHERE seq > ? ORDER BY seq LIMIT ?", (finding_seq, limit)
            )
        )
        return transitions, findings

    def last_transition(self) -> int:
        """The sequence number of the latest transition (0 if none)."""
        return int(self.conn.execute("SELECT coalesce(max(seq), 0) FROM transitions").fetchone()[0])

    def done_marks(self) -> dict[str, DoneMark]:
        """Each task's latest move to completed or skipped: which result is newer than which
        (selection.Freshness). The transition's seq orders them, whatever the clock did."""
        return {
            r[0]: DoneMark(r[1], r[2], r[3])
            for r in self.conn.execute(
                # SQLite gives a bare column of the row that max() chose.
                "SELECT task_id, max(seq), run_id, to_status FROM transitions"
                " WHERE to_status IN ('completed', 'skipped') GROUP BY task_id"
            )
        }

    def findings_as_of(self, task_id: str, seq: int | None) -> list[tuple[str, Any, str | None]]:
        """(key, value, unit) the task's own attempt recorded, of its latest done attempt as
        of transition `seq` (None: now): what a task done at `seq` was built on."""
        attempt = self.conn.execute(
            "SELECT attempt FROM transitions WHERE task_id=? AND seq <= ?"
            " AND to_status IN ('completed', 'skipped') ORDER BY seq DESC LIMIT 1",
            (task_id, seq if seq is not None else 2**62),
        ).fetchone()
        if attempt is None:
            return []
        return [
            (r[0], r[1], r[2])
            for r in self.conn.execute(
                "SELECT key, value, unit FROM findings WHERE task_id=? AND attempt=?"
                " AND author IS NULL ORDER BY seq",
                (task_id, attempt[0]),
            )
        ]

    def runs_after(self, run_id: int, open_ids: set[int]) -> list[RunRow]:
        """Runs begun after `run_id`, and those of `open_ids` (to see them end), by id."""
        marks = ", ".join("?" * len(open_ids))
        return _rows(
            self.conn.execute(
                f"SELECT * FROM runs WHERE id > ? OR id IN ({marks}) ORDER BY id",
                (run_id, *open_ids),
            )
        )

    def transitions(
        self, task_id: str | None = None, limit: int = 200, run_id: int | None = None
    ) -> list[TransitionRow]:
        """The latest `limit` transitions, oldest first: of one task, of one run, or all."""
        terms = [("task_id=?", task_id), ("run_id=?", run_id)]
        chosen = [(term, arg) for term, arg in terms if arg is not None]
        where = " AND ".join(term for term, _ in chosen)
        rows: list[TransitionRow] = _rows(
            self.conn.execute(
                f"SELECT * FROM transitions {'WHERE ' + where if where else ''}"
                " ORDER BY seq DESC LIMIT ?",
                (*(arg for _, arg in chosen), limit),
            ),
            _TRANSITION,
        )
        return rows[::-1]


# Every public method, so that no caller (CLI, run loop, a task's sink) sees a raw sqlite3 error.
for _name, _method in list(vars(Store).items()):
    if not _name.startswith("_") and callable(_method) and _name != "open":
        setattr(Store, _name, _guarded(_method))


# SQLite has no boolean: true/false are kept as text, so they do not come back as 1/0.
def _encode(value: FindingValue) -> FindingValue:
    return ("true" if value else "false") if isinstance(value, bool) else value


def decode(value: FindingValue) -> FindingValue:
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value
