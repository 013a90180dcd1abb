"""The controller's record of its rolls: which host is at which step of which roll.

A SQLite file beside the plan's own store (`.orch/<plan>.fleet.db`). Each change is one
transaction, committed before the side effect it announces: a batch's hosts are `running`
before Ansible is asked to reach them, so a controller killed mid-batch knows exactly which
hosts may have work in flight (their own stores on the hosts say how far each got). `moves`
keeps every host state change, oldest first: the roll's history, the next morning too.

What is kept of a host's plan is its board as the host's orch reported it (ids, statuses,
times, findings), already masked there: no output tail, no log text, no secret.

Every row is read back through a schema (the board through its answer's, answer.py): a value
the file should not hold (an unknown state, a wrong type, a board that is not JSON) makes that
row `unreadable`, saying why, instead of a traceback in `orch fleet status`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Json, ValidationError

from orchestrator.core.errors import StoreError
from orchestrator.core.safeopen import ensure_store_folder
from orchestrator.fleet.answer import BOARD, BoardTask, Timestamp, explain

SCHEMA = """
CREATE TABLE IF NOT EXISTS rolls (
    id INTEGER PRIMARY KEY,
    plan TEXT NOT NULL,
    plan_file TEXT NOT NULL,
    inventory TEXT NOT NULL,
    build TEXT NOT NULL,
    canary INTEGER NOT NULL,
    serial TEXT NOT NULL,
    options TEXT NOT NULL,
    state TEXT NOT NULL,
    detail TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    approved_by TEXT,
    approved_at REAL,
    note TEXT
);
CREATE TABLE IF NOT EXISTS hosts (
    roll_id INTEGER NOT NULL REFERENCES rolls(id),
    host TEXT NOT NULL,
    position INTEGER NOT NULL,
    batch INTEGER NOT NULL,
    state TEXT NOT NULL,
    detail TEXT,
    sent INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    ended_at REAL,
    board TEXT,
    PRIMARY KEY (roll_id, host)
);
CREATE TABLE IF NOT EXISTS held_files (
    host TEXT NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (host, name)
);
CREATE TABLE IF NOT EXISTS moves (
    id INTEGER PRIMARY KEY,
    roll_id INTEGER NOT NULL REFERENCES rolls(id),
    at REAL NOT NULL,
    host TEXT,
    state TEXT NOT NULL,
    detail TEXT
);
"""

# A roll is open until every host completed; `abandoned` when a new roll replaced it.
ROLL_STATES = ("running", "awaiting_approval", "stopped", "interrupted", "completed", "abandoned")
# running: sent, no answer yet; the rest are what the host's answer (or Ansible) said.
HOST_STATES = (
    "pending",
    "running",
    "completed",
    "failed",
    "waiting",
    "unreachable",
    "refused",
    "error",
    "removed",
)
DONE = "completed"
# Never written: what a read says of a row that does not fit the schema below (its detail
# says why). A roll or host in it is open: the next roll sends the plan again, which rewrites
# the row, or refuses to resume a roll it cannot read.
UNREADABLE = "unreadable"


def _one_of(states: tuple[str, ...]) -> AfterValidator:
    def check(value: str) -> str:
        if value not in states:
            raise ValueError("should be " + ", ".join(map(repr, states)))
        return value

    return AfterValidator(check)


class _Row(BaseModel):
    """A row as read: every column through its type, strict (SQLite keeps whatever it was
    given), each with a default that a column which does not fit falls back to (`_read`)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


class Roll(_Row):
    id: int = 0
    plan: str = "?"
    plan_file: str = "?"
    inventory: str = "?"
    build: str = "?"
    canary: int = Field(0, ge=0)
    serial: str = "?"
    options: Json[dict[str, Any]] = {}
    state: Annotated[str, _one_of(ROLL_STATES)] = UNREADABLE
    detail: str | None = None
    started_at: Timestamp = 0.0
    ended_at: Timestamp | None = None
    approved_by: str | None = None
    approved_at: Timestamp | None = None
    note: str | None = None

    @property
    def open(self) -> bool:
        return self.state not in ("completed", "abandoned")

    @property
    def rollback_of(self) -> int | None:
        """The roll this one puts back (`orch fleet rollback`); None for a roll forward."""
        target = self.options.get("rollback_of")
        return target if isinstance(target, int) and not isinstance(target, bool) else None

    @property
    def command(self) -> str:
        """What resumes it: `orch fleet run` or `orch fleet rollback`."""
        return "orch fleet run" if self.rollback_of is None else "orch fleet rollback"


class HostRow(_Row):
    host: str = "?"
    position: int = 0
    batch: int = 0
    state: Annotated[str, _one_of(HOST_STATES)] = UNREADABLE
    detail: str | None = None
    sent: int = Field(0, ge=0)  # how many times the controller sent it the plan
    started_at: Timestamp | None = None
    ended_at: Timestamp | None = None
    # The host's tasks as its orch last reported them, through the schema of its answer.
    board: Json[list[BoardTask]] = []


R = TypeVar("R", bound=_Row)


def _read(model: type[R], row: sqlite3.Row) -> R:
    """A row through its model; one that does not fit it is still read, `unreadable` with the
    first problem in its detail, the columns at fault at their defaults: a board is always
    drawn, whatever the file holds."""
    columns = {k: v for k, v in dict(row).items() if v is not None}  # NULL: the default
    try:
        return model.model_validate(columns)
    except ValidationError as exc:
        bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
        kept = model.model_validate({k: v for k, v in columns.items() if k not in bad})
        why = f"this row of the record cannot be read: {explain(exc)}"
        return kept.model_copy(update={"state": UNREADABLE, "detail": why})


class FleetRecord:
    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._db = conn

    @classmethod
    def open(cls, path: Path, create: bool = False) -> FleetRecord:
        if not path.exists() and not create:
            raise StoreError(f"no fleet record at {path}: no `orch fleet run` of this plan yet")
        try:  # as the plan's store: no link in its place or its folder's (core/safeopen.py)
            ensure_store_folder(path, create=create)
            conn = sqlite3.connect(path, isolation_level=None, timeout=10)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # a committed batch start survives power loss
            conn.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a readable fleet record: {exc}") from None
        return cls(path, conn)

    def close(self) -> None:
        self._db.close()

    def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """One transaction: every statement or none."""
        with closing(self._db.cursor()) as cur:
            cur.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    cur.execute(sql, args)
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    # --- rolls ---------------------------------------------------------------------------

    def rolls(self) -> list[Roll]:
        """Newest first. A record holds one plan's rolls (it lives beside that plan's store)."""
        return [_read(Roll, r) for r in self._select("SELECT * FROM rolls ORDER BY id DESC")]

    def roll(self, roll_id: int) -> Roll:
        rows = self._select("SELECT * FROM rolls WHERE id=?", (roll_id,))
        if not rows:
            raise StoreError(f"{self.path} has no roll #{roll_id}")
        return _read(Roll, rows[0])

    def new_roll(
        self,
        *,
        plan: str,
        plan_file: str,
        inventory: str,
        build: str,
        canary: int,
        serial: str,
        options: dict[str, Any],
        batches: Sequence[Sequence[str]],
    ) -> int:
        now = time.time()
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute(
                "UPDATE rolls SET state='abandoned', ended_at=? WHERE state NOT IN "
                "('completed', 'abandoned')",
                (now,),
            )
            cur.execute(
                "INSERT INTO rolls (plan, plan_file, inventory, build, canary, serial, options,"
                " state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                (plan, plan_file, inventory, build, canary, serial, json.dumps(options), now),
            )
            roll_id = int(cur.lastrowid or 0)
            self._insert_hosts(cur, roll_id, 0, 0, batches)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        return roll_id

    def add_hosts(self, roll_id: int, batches: Sequence[Sequence[str]]) -> None:
        """Hosts the inventory gained since the roll began: new batches at its end."""
        cur = self._db.cursor()
        row = cur.execute(
            "SELECT COALESCE(MAX(position), -1) + 1, COALESCE(MAX(batch), -1) + 1 FROM hosts"
            " WHERE roll_id=?",
            (roll_id,),
        ).fetchone()
        cur.execute("BEGIN IMMEDIATE")
        self._insert_hosts(cur, roll_id, row[0], row[1], batches)
        cur.execute("COMMIT")

    @staticmethod
    def _insert_hosts(
        cur: sqlite3.Cursor,
        roll_id: int,
        position: int,
        first: int,
        batches: Sequence[Sequence[str]],
    ) -> None:
        for number, batch in enumerate(batches, first):
            for host in batch:
                cur.execute(
                    "INSERT INTO hosts (roll_id, host, position, batch, state) "
                    "VALUES (?, ?, ?, ?, 'pending')",
                    (roll_id, host, position, number),
                )
                position += 1

    def set_roll(self, roll_id: int, state: str, detail: str | None = None) -> None:
        ended = time.time() if state not in ("running",) else None
        self._write(
            [
                (
                    "UPDATE rolls SET state=?, detail=?, ended_at=? WHERE id=?",
                    (state, detail, ended, roll_id),
                ),
                _move(roll_id, None, state, detail),
            ]
        )

    def approve(self, roll_id: int, by: str, note: str | None) -> None:
        self._write(
            [
                (
                    "UPDATE rolls SET approved_by=?, approved_at=?, note=? WHERE id=?",
                    (by, time.time(), note, roll_id),
                ),
                _move(roll_id, None, "approved", f"by {by}" + (f": {note}" if note else "")),
            ]
        )

    # --- hosts ---------------------------------------------------------------------------

    def hosts(self, roll_id: int) -> list[HostRow]:
        sql = "SELECT * FROM hosts WHERE roll_id=? ORDER BY position"
        return [_read(HostRow, r) for r in self._select(sql, (roll_id,))]

    def start_hosts(self, roll_id: int, hosts: Sequence[str]) -> None:
        """Committed before Ansible is asked: these hosts may now have work in flight."""
        now = time.time()
        statements: list[tuple[str, Sequence[Any]]] = [
            ("UPDATE rolls SET state='running', detail=NULL, ended_at=NULL WHERE id=?", (roll_id,))
        ]
        for host in hosts:
            statements += [
                (
                    "UPDATE hosts SET state='running', detail=NULL, sent=sent+1, started_at=?,"
                    " ended_at=NULL WHERE roll_id=? AND host=?",
                    (now, roll_id, host),
                ),
                _move(roll_id, host, "running", None),
            ]
        self._write(statements)

    def finish_host(
        self,
        roll_id: int,
        host: str,
        state: str,
        detail: str | None,
        board: Sequence[BoardTask] | None = None,
        files: Mapping[str, str] | None = None,
    ) -> None:
        """`files`: the plan's files the host said it holds (name -> sha256), replacing what
        was known of it; None: unknown, kept."""
        assert state in HOST_STATES, state
        now = time.time()
        keep = "board" if board is None else "?"
        args: list[Any] = [state, detail, now] + (
            [] if board is None else [BOARD.dump_json(list(board)).decode()]
        )
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                f"UPDATE hosts SET state=?, detail=?, ended_at=?, board={keep}"
                " WHERE roll_id=? AND host=?",
                (*args, roll_id, host),
            ),
            _move(roll_id, host, state, detail),
        ]
        if files is not None:
            statements.append(("DELETE FROM held_files WHERE host=?", (host,)))
            statements += [
                ("INSERT INTO held_files (host, name, sha256) VALUES (?, ?, ?)", (host, n, d))
                for n, d in files.items()
            ]
        self._write(statements)

    def note_progress(
        self, roll_id: int, host: str, board: Sequence[BoardTask], detail: str
    ) -> None:
        """A running host's board and detail as its progress says (no move: its state is the
        same); nothing written once the host is no longer running (its answer came first, and
        has the last word)."""
        self._db.execute(
            "UPDATE hosts SET board=?, detail=? WHERE roll_id=? AND host=? AND state='running'",
            (BOARD.dump_json(list(board)).decode(), detail, roll_id, host),
        )

    def held_files(self, hosts: Sequence[str]) -> dict[str, dict[str, str]]:
        """host -> {name: sha256} of the plan's files each held at its last answer. Read as
        a hint only: a row that is not two strings is left out (that file is sent whole)."""
        found: dict[str, dict[str, str]] = {}
        wanted = set(hosts)
        for row in self._select("SELECT host, name, sha256 FROM held_files"):
            host, name, digest = row["host"], row["name"], row["sha256"]
            if host in wanted and isinstance(name, str) and isinstance(digest, str):
                found.setdefault(host, {})[name] = digest
        return found

    def moves(self, roll_id: int) -> list[dict[str, Any]]:
        rows = self._select("SELECT * FROM moves WHERE roll_id=? ORDER BY id", (roll_id,))
        return [dict(r) for r in rows]

    def _select(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """A read; a file that is not a fleet record (tables of another shape, damage) is said
        in a line, as `open` says it."""
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a readable fleet record: {exc}") from None


def _move(
    roll_id: int, host: str | None, state: str, detail: str | None
) -> tuple[str, Sequence[Any]]:
    sql = "INSERT INTO moves (roll_id, at, host, state, detail) VALUES (?, ?, ?, ?, ?)"
    return sql, (roll_id, time.time(), host, state, detail)


def record_path(store: Path) -> Path:
    """Beside the plan's own store: `.orch/<plan name>.fleet.db` for `.orch/<plan name>.db`."""
    return store.with_suffix(".fleet.db")
