"""The todo store: one SQLite file per plan; the only module that speaks SQL.

Tables: `todos` (one row per task, its current state), `transitions` (append-only log of every
status change), `findings` (append-only, per attempt), `runs` (one per `orch run`),
`resources` (what a task left running for later tasks, e.g. a server; see resources.py), `meta`.
WAL mode with synchronous=NORMAL: a commit survives a crash or SIGKILL of the process at any
moment (a power cut may lose the last commits, never consistency); ~20 us per commit.

Reads use the stdlib sqlite3 connection directly; sqlite-utils creates the schema. Why split:
importing sqlite_utils costs ~70 ms, more than the whole start-up budget of `orch status`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StoreError
from .findings import Finding, FindingValue
from .status import ALLOWED, Status

SCHEMA_VERSION = 2  # 2: resources
BUSY_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class TodoSpec:
    """What the plan says about a task, as the store keeps it."""

    id: str
    position: int
    title: str
    priority: str
    kind: str
    needs: Sequence[str]
    spec_hash: str
    spec: str  # JSON of what the hash covers


@dataclass(frozen=True)
class RunIdentity:
    """Who runs: enough to tell later, from another process, whether it is still alive."""

    pid: int
    started_at: float
    host: str
    boot_id: str


def runs_dir(store_path: Path) -> Path:
    """Logs live beside the store: `.orch/<plan>.runs/<run id>/`."""
    return store_path.with_name(store_path.stem + ".runs")


class Store:
    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn

    # --- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, create: bool = True) -> Store:
        """Open (and with `create`, make) the store at `path`."""
        if not create and not path.exists():
            raise StoreError(f"no store at {path} (has this plan been run? try `orch run PLAN`)")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a usable orch store: {exc}") from None
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path} was written by a newer orch (schema {version})")
        store = cls(path, conn)
        if version < SCHEMA_VERSION:
            store._create_schema()
        return store

    def close(self) -> None:
        self.conn.close()

    def _create_schema(self) -> None:
        import sqlite_utils  # lazily: see the module docstring

        db = sqlite_utils.Database(self.conn)
        with self._tx():
            db.table("meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)
            db.table("runs").create(
                {
                    "id": int, "plan_file": str, "started_at": float, "ended_at": float,
                    "outcome": str, "pid": int, "pid_started_at": float, "host": str,
                    "boot_id": str, "argv": str, "log_dir": str,
                },
                pk="id", if_not_exists=True,
            )
            db.table("todos").create(
                {
                    "id": str, "position": int, "title": str, "priority": str, "kind": str,
                    "needs": str, "in_plan": int, "status": str, "reason": str, "attempts": int,
                    "spec_hash": str, "spec": str, "started_at": float, "ended_at": float,
                    "last_error": str, "output_tail": str, "run_id": int, "log_path": str,
                    "pgid": int, "pgid_started_at": float, "updated_at": float,
                },
                pk="id", not_null={"status", "title"}, defaults={"attempts": 0, "in_plan": 1},
                if_not_exists=True,
            )
            db.table("transitions").create(
                {
                    "seq": int, "task_id": str, "from_status": str, "to_status": str,
                    "at": float, "reason": str, "run_id": int, "attempt": int,
                },
                pk="seq", foreign_keys=[("task_id", "todos", "id")], if_not_exists=True,
            )
            db.table("findings").create(
                {
                    # bytes -> BLOB: no type affinity, so 42 stays an int and "42%" text.
                    "seq": int, "task_id": str, "attempt": int, "key": str, "value": bytes,
                    "unit": str, "note": str, "at": float, "run_id": int,
                },
                pk="seq", foreign_keys=[("task_id", "todos", "id")], if_not_exists=True,
            )
            db.table("resources").create(
                {
                    # data: JSON the holding kind needs to end it (pid, unit, log path ...).
                    "name": str, "task_id": str, "kind": str, "data": str, "run_id": int,
                    "held_at": float, "released_at": float, "released_by": str, "how": str,
                },
                pk="name", if_not_exists=True,
            )
            db.table("transitions").create_index(["task_id", "seq"], if_not_exists=True)
            db.table("findings").create_index(["task_id", "attempt"], if_not_exists=True)
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE so a concurrent writer waits instead of failing."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

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
            "SELECT count(*), sum(status IN ('completed', 'skipped')) FROM todos WHERE in_plan=1"
        ).fetchone()
        return bool(row[0]) and row[0] == row[1] and not self.open_runs()

    def sync_plan(self, specs: Sequence[TodoSpec], run_id: int | None) -> None:
        """Insert new tasks as pending, refresh what changed in titles, order and needs, and
        mark tasks gone from the plan; never touch status. Writes only what differs, so
        re-running a finished plan costs no write here."""
        now = time.time()
        current = {
            r[0]: tuple(r[1:]) for r in self.conn.execute(
                "SELECT id, position, title, priority, kind, needs, in_plan FROM todos")
        }
        with self._tx() as c:
            for s in specs:
                fields = (s.position, s.title, s.priority, s.kind, json.dumps(list(s.needs)))
                row = current.pop(s.id, None)
                if row == (*fields, 1):
                    continue
                if row is not None:
                    c.execute("UPDATE todos SET position=?, title=?, priority=?, kind=?, needs=?,"
                              " in_plan=1 WHERE id=?", (*fields, s.id))
                    continue
                c.execute(
                    "INSERT INTO todos(position, title, priority, kind, needs, id, status,"
                    " spec_hash, spec, updated_at, attempts, in_plan)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, 0, 1)",
                    (*fields, s.id, s.spec_hash, s.spec, now),
                )
                c.execute(
                    "INSERT INTO transitions(task_id, from_status, to_status, at, reason, run_id,"
                    " attempt) VALUES (?, NULL, 'pending', ?, 'added to the plan', ?, 0)",
                    (s.id, now, run_id),
                )
            gone = [task_id for task_id, row in current.items() if row[-1]]
            c.executemany("UPDATE todos SET in_plan=0 WHERE id=?", [(g,) for g in gone])

    # --- runs ----------------------------------------------------------------------------------

    def begin_run(self, who: RunIdentity, plan_file: str, argv: str, log_dir: Path) -> int:
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO runs(plan_file, started_at, pid, pid_started_at, host, boot_id,"
                " argv, log_dir) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (plan_file, time.time(), who.pid, who.started_at, who.host, who.boot_id, argv,
                 str(log_dir)),
            )
            return int(cur.lastrowid or 0)

    def next_run_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM runs").fetchone()[0])

    def end_run(self, run_id: int, outcome: str) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET ended_at=?, outcome=? WHERE id=?", (time.time(), outcome, run_id)
            )

    def open_runs(self) -> list[sqlite3.Row]:
        """Runs with no recorded end: alive now, or died without a word."""
        return self.conn.execute("SELECT * FROM runs WHERE ended_at IS NULL").fetchall()

    def mark_dead_run(self, run: sqlite3.Row, why: str) -> list[str]:
        """Close a run whose orchestrator died (outcome `crashed`); see close_run."""
        return self.close_run(run["id"], "crashed", why)

    def close_run(self, run_id: int, outcome: str, why: str) -> list[str]:
        """End a run and mark its in-progress tasks interrupted, in one transaction.

        Returns the ids of those tasks. Their recorded process group stays in the row so that
        the next run can end what was left behind before retrying.
        """
        now = time.time()
        with self._tx() as c:
            ids = [r[0] for r in c.execute(
                "SELECT id FROM todos WHERE status='in_progress' AND run_id=?", (run_id,))]
            for task_id in ids:
                self._transition(c, task_id, Status.INTERRUPTED, why, run_id, now, ended_at=now)
            c.execute("UPDATE runs SET ended_at=?, outcome=? WHERE id=? AND ended_at IS NULL",
                      (now, outcome, run_id))
        return ids

    def interrupt_strays(self) -> list[str]:
        """Tasks still in progress under a run that has ended (only the lock holder may ask:
        then nothing is really running). They become interrupted."""
        now = time.time()
        with self._tx() as c:
            rows = c.execute(
                "SELECT t.id, t.run_id FROM todos t LEFT JOIN runs r ON r.id = t.run_id"
                " WHERE t.status='in_progress' AND (r.ended_at IS NOT NULL OR r.id IS NULL)"
            ).fetchall()
            for task_id, run_id in rows:
                self._transition(c, task_id, Status.INTERRUPTED,
                                 f"left in progress by run #{run_id}, which has ended", run_id,
                                 now, ended_at=now)
        return [r[0] for r in rows]

    # --- transitions ---------------------------------------------------------------------------

    def transition(
        self,
        task_id: str,
        to: Status,
        reason: str | None,
        run_id: int | None,
        findings: Sequence[Finding] = (),
        **fields: Any,
    ) -> int:
        """Move a task to `to`, log it and store findings: one transaction, committed on return.

        Callers do this before the side effect that follows (start a process, start a
        dependent), so the store never claims less than what happened. Returns the attempt.
        """
        now = time.time()
        with self._tx() as c:
            attempt = self._transition(c, task_id, to, reason, run_id, now, **fields)
            if findings:
                c.executemany(
                    "INSERT INTO findings(task_id, attempt, key, value, unit, note, at, run_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(task_id, attempt, f.key, _encode(f.value), f.unit, f.note, now, run_id)
                     for f in findings],
                )
        return attempt

    def _transition(
        self, c: sqlite3.Connection, task_id: str, to: Status, reason: str | None,
        run_id: int | None, now: float, **fields: Any,
    ) -> int:
        row = c.execute("SELECT status, attempts FROM todos WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise StoreError(f"unknown task {task_id!r} in {self.path}")
        current = Status(row[0])
        if to not in ALLOWED[current]:
            raise StoreError(f"task {task_id!r}: {current} -> {to} is not a valid transition")
        attempt = int(row[1]) + (1 if to is Status.IN_PROGRESS else 0)
        values = {"status": str(to), "reason": reason, "updated_at": now, "attempts": attempt,
                  **fields}
        if run_id is not None:
            values["run_id"] = run_id
        assignments = ", ".join(f"{k}=?" for k in values)
        c.execute(f"UPDATE todos SET {assignments} WHERE id=?", (*values.values(), task_id))
        c.execute(
            "INSERT INTO transitions(task_id, from_status, to_status, at, reason, run_id, attempt)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (task_id, str(current), str(to), now, reason, run_id, attempt),
        )
        return attempt

    def set_process(self, task_id: str, pgid: int | None, started_at: float | None) -> None:
        """Record the process group a task started, so a later run can end it if we die."""
        with self._tx() as c:
            c.execute(
                "UPDATE todos SET pgid=?, pgid_started_at=? WHERE id=?",
                (pgid, started_at, task_id),
            )

    # --- resources -----------------------------------------------------------------------------

    def hold(self, name: str, task_id: str, kind: str, run_id: int, data: dict[str, Any]) -> None:
        """Record that `task_id` holds `name` now (committed at once: a crash a moment later
        must still leave the next run able to end it). Holding a name again replaces it."""
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO resources(name, task_id, kind, data, run_id,"
                      " held_at) VALUES (?, ?, ?, ?, ?, ?)",
                      (name, task_id, kind, json.dumps(data), run_id, time.time()))

    def held(self, name: str | None = None) -> list[sqlite3.Row]:
        """Resources not released (all, or the one called `name`)."""
        where, args = ("AND name=?", (name,)) if name else ("", ())
        return self.conn.execute(
            f"SELECT * FROM resources WHERE released_at IS NULL {where} ORDER BY held_at", args
        ).fetchall()

    def release(self, name: str, by_task: str | None, how: str) -> None:
        """Mark `name` released: by a task (`by_task`), or by the engine (None)."""
        with self._tx() as c:
            c.execute("UPDATE resources SET released_at=?, released_by=?, how=? WHERE name=?",
                      (time.time(), by_task, how, name))

    def resources(self) -> list[sqlite3.Row]:
        """Every resource, held or let go (one row per name: its latest holder): `name`,
        `task_id` (the holder), `released_at` (None while held), `released_by` (the releasing
        task, None where the engine ended it) and `how`."""
        return self.conn.execute(
            "SELECT name, task_id, kind, run_id, held_at, released_at, released_by, how"
            " FROM resources ORDER BY held_at").fetchall()

    # --- reads ---------------------------------------------------------------------------------

    def todos(self) -> list[sqlite3.Row]:
        """The plan's tasks, in plan order (tasks since removed from the plan are kept, unshown)."""
        return self.conn.execute(
            "SELECT * FROM todos WHERE in_plan=1 ORDER BY position").fetchall()

    def todo(self, task_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.conn.execute(
            "SELECT * FROM todos WHERE id=?", (task_id,)).fetchone()
        return row

    def findings(self) -> dict[str, list[Finding]]:
        """The findings of each task's latest attempt, in the order they were recorded."""
        out: dict[str, list[Finding]] = {}
        for r in self.conn.execute(
            "SELECT f.task_id, f.key, f.value, f.unit, f.note FROM findings f"
            " JOIN todos t ON t.id = f.task_id AND f.attempt = t.attempts ORDER BY f.seq"
        ):
            out.setdefault(r[0], []).append(Finding(r[1], _decode(r[2]), r[3], r[4]))
        return out

    def finding(self, task_id: str, key: str) -> Finding | None:
        """The latest value of one finding of a task's latest attempt."""
        r = self.conn.execute(
            "SELECT f.key, f.value, f.unit, f.note FROM findings f JOIN todos t ON t.id=f.task_id"
            " AND f.attempt=t.attempts WHERE f.task_id=? AND f.key=? ORDER BY f.seq DESC LIMIT 1",
            (task_id, key),
        ).fetchone()
        return None if r is None else Finding(r[0], _decode(r[1]), r[2], r[3])

    def runs(self, limit: int = 20) -> list[sqlite3.Row]:
        return self.conn.execute(
            "SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()

    def transitions(self, task_id: str | None = None, limit: int = 200) -> list[sqlite3.Row]:
        where, args = ("WHERE task_id=?", (task_id,)) if task_id else ("", ())
        rows = self.conn.execute(
            f"SELECT * FROM transitions {where} ORDER BY seq DESC LIMIT ?", (*args, limit)
        ).fetchall()
        return rows[::-1]



# SQLite has no boolean: true/false are kept as text, so they do not come back as 1/0.
def _encode(value: FindingValue) -> FindingValue:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _decode(value: FindingValue) -> FindingValue:
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value
