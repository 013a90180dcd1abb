"""The store's schema: its tables and columns (COLUMNS, TABLE_OPTIONS), what each schema
version added, the DDL of a new store, and the invariant queries an open runs on every table
(a required value missing, a number stored as text, a status orch does not know, JSON that
does not parse). Data, and the SQL made from it; db.py opens, checks and upgrades stores with
it.
"""

from __future__ import annotations

import functools
from typing import Any

from orchestrator.core.status import Status

SCHEMA_VERSION = 4  # 2: resources; 3: tasks added at run time (origin, definition), authors;
# 4: compensations and `finally` tasks (role, protects, armed_run, armed_at), approvals

# The schema: created from these, and checked against them at open (a damaged schema text can
# pass quick_check and still lose a column).
COLUMNS: dict[str, dict[str, type]] = {
    "meta": {"key": str, "value": str},
    "runs": {
        "id": int,
        "plan_file": str,
        "started_at": float,
        "ended_at": float,
        "outcome": str,
        "pid": int,
        "pid_started_at": float,
        "host": str,
        "boot_id": str,
        "argv": str,
        "log_dir": str,
    },
    "todos": {
        "id": str,
        "position": int,
        "title": str,
        "priority": str,
        "kind": str,
        "needs": str,
        "in_plan": int,  # 0: gone from the plan, or an added task removed (kept for history)
        "origin": str,  # who declared it: plan (the plan file), agent, person (orch todo)
        "definition": str,  # an added task's mapping (JSON), as a plan file would hold it
        "status": str,
        "reason": str,
        "attempts": int,
        "spec_hash": str,
        "spec": str,
        "started_at": float,
        "ended_at": float,
        "last_error": str,
        "output_tail": str,
        "run_id": int,
        "log_path": str,
        "pgid": int,
        "pgid_started_at": float,
        "updated_at": float,
        # A compensation (`on_failure` of the task it `protects`) or a `finally` task; None for
        # the plan's own flow. Armed: due to run if the plan fails (armed_run: the run that armed
        # it, committed with the protected task's completion), until it runs or the plan ends.
        "role": str,
        "protects": str,
        "armed_run": int,
        "armed_at": float,
    },
    "transitions": {
        "seq": int,
        "task_id": str,
        "from_status": str,
        "to_status": str,
        "at": float,
        "reason": str,
        "run_id": int,
        "attempt": int,
    },
    "findings": {
        # bytes -> BLOB: no type affinity, so 42 stays an int and "42%" text.
        "seq": int,
        "task_id": str,
        "attempt": int,
        "key": str,
        "value": bytes,
        "unit": str,
        "note": str,
        "at": float,
        "run_id": int,
        "author": str,  # None: the task's own attempt; else who recorded it (agent, person)
    },
    "resources": {
        # data: JSON the holding kind needs to end it (pid, unit, log path ...).
        "name": str,
        "task_id": str,
        "kind": str,
        "data": str,
        "run_id": int,
        "held_at": float,
        "released_at": float,
        "released_by": str,
        "how": str,
    },
    "approvals": {
        # Who let an approval gate pass, for which plan and which upstream findings (hashes).
        "seq": int,
        "task_id": str,
        "by": str,
        "at": float,
        "note": str,
        "plan_hash": str,
        "findings_hash": str,
        "how": str,  # `orch approve`, or `orch run --approve`
        "run_id": int,
    },
}

TABLE_OPTIONS: dict[str, dict[str, Any]] = {
    "meta": {"pk": "key"},
    "runs": {"pk": "id"},
    "todos": {
        "pk": "id",
        "not_null": {"status", "title"},
        "defaults": {"attempts": 0, "in_plan": 1, "origin": "plan"},
    },
    "transitions": {"pk": "seq", "foreign_keys": [("task_id", "todos", "id")]},
    "findings": {"pk": "seq", "foreign_keys": [("task_id", "todos", "id")]},
    "resources": {"pk": "name"},
    "approvals": {"pk": "seq", "foreign_keys": [("task_id", "todos", "id")]},
}

TABLES_SINCE = {"resources": 2, "approvals": 4}  # tables added by a later schema version

# Columns added to an existing table by a later schema version: (table, column) -> version.
COLUMNS_SINCE = {
    ("todos", "origin"): 3,
    ("todos", "definition"): 3,
    ("findings", "author"): 3,
    **{("todos", c): 4 for c in ("role", "protects", "armed_run", "armed_at")},
}

INDEXES = {"transitions": ("task_id", "seq"), "findings": ("task_id", "attempt")}

_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL", bytes: "BLOB"}

# Columns orch always writes: NULL there is damage or a hand edit, and would fail orch later
# (an attempts count of NULL, say) with a traceback instead of a message.
_REQUIRED = {
    "runs": ("id", "started_at"),
    "todos": ("id", "title", "status", "attempts", "position", "in_plan"),
    "transitions": ("seq", "task_id", "to_status", "at"),
    "findings": ("seq", "task_id", "key", "at"),
    "resources": ("name", "task_id", "kind"),
    "approvals": ("seq", "task_id", "at"),
}

# Numbers are what orch computes with (attempts > 1, ended_at - started_at): in the tables of
# one row a run or a task, a number column holding text is refused. Text columns are not
# checked, nor the log tables' numbers: every column of every row cost ~5.8 ms a 1000-task
# store at every open, these ~1.8 ms (bench/bench_integrity.py).
_STORED_AS = {int: ("integer",), float: ("real", "integer")}

# Text that orch reads back as JSON, and the JSON type it wrote there: a damaged byte inside one
# passes SQLite's checks and would end the reading command in a JSONDecodeError.
_JSON_COLUMNS = {
    ("todos", "needs"): "array",
    ("todos", "spec"): "object",
    ("todos", "definition"): "object",
    ("resources", "data"): "object",
}

_TYPED = ("runs", "todos")  # one row a run or a task; the log tables: required values only

# A time orch writes is the Unix time it happened: a real number from 0 until long before year
# 9999, past which every view that shows it as a date ends in "year is out of range" (a damaged
# byte in a REAL made one year 3,709,552). Checked in every table: the times are what `orch
# status`, `history` and `report` format, ~0.1 ms a 1000-task store (bench/bench_integrity.py).
LATEST_TIME = 1e11  # year 5138: past any clock orch runs under, short of datetime's limit

STATUS_COLUMNS = {"todos": ("status",), "transitions": ("from_status", "to_status")}
# What `orch status` draws of a task (Store.board): `todos` less what only a run reads (its spec,
# its needs, its process), a third of a 1000-task board's read time.
BOARD_COLUMNS = (
    "id", "title", "priority", "kind", "origin", "status", "reason", "attempts", "started_at",
    "ended_at", "updated_at", "last_error", "output_tail", "log_path", "role", "protects",
    "armed_run",
)  # fmt: skip


@functools.cache
def invariant_queries(version: int) -> tuple[tuple[str, str], ...]:
    """Per table, a query for the first row that breaks what orch writes: a required value
    missing, a value of another type than its column's, a time out of range, a status orch
    does not know. Each gives (the row's key, what is wrong). One pass over each table."""
    statuses = ", ".join(f"'{s}'" for s in Status)
    out = []
    for table, columns in COLUMNS.items():
        if version < TABLES_SINCE.get(table, 1):
            continue
        checks = []
        for column, kind in columns.items():
            if version < COLUMNS_SINCE.get((table, column), 1):
                continue
            quoted = f'"{column}"'
            if column in _REQUIRED.get(table, ()):
                checks.append((f"{quoted} IS NULL", f"'{column} is NULL'"))
            if table in _TYPED and (types := _STORED_AS.get(kind)) is not None:
                allowed = ", ".join(f"'{t}'" for t in (*types, "null"))
                checks.append(
                    (
                        f"typeof({quoted}) NOT IN ({allowed})",
                        f"'{column} is ' || typeof({quoted}) || ', not {types[0]}'",
                    )
                )
            if (shape := _JSON_COLUMNS.get((table, column))) is not None:
                # json_type raises on malformed JSON: only asked once json_valid said yes.
                checks.append(
                    (
                        f"{quoted} IS NOT NULL AND CASE WHEN json_valid({quoted}) "
                        f"THEN json_type({quoted}) != '{shape}' ELSE 1 END",
                        f"'{column} is not a JSON {shape}'",
                    )
                )
            if kind is float and (column == "at" or column.endswith("_at")):
                checks.append(
                    (
                        f"{quoted} NOT BETWEEN 0 AND {LATEST_TIME:.0f}",
                        f"'{column} ' || quote({quoted}) || ' is no time orch wrote'",
                    )
                )
            if column in STATUS_COLUMNS.get(table, ()):
                checks.append(
                    (
                        f"{quoted} NOT IN ({statuses})",
                        f"'{column} ' || quote({quoted}) || ' is no status'",
                    )
                )
        if not checks:
            continue
        key = f'"{TABLE_OPTIONS[table]["pk"]}"'
        problem = "CASE " + " ".join(f"WHEN {c} THEN {m}" for c, m in checks) + " END"
        where = " OR ".join(f"({c})" for c, _ in checks)
        out.append((table, f'SELECT {key}, {problem} FROM "{table}" WHERE {where} LIMIT 1'))
    return tuple(out)


def _sql_default(value: Any) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else str(value)


@functools.cache
def schema_ddl() -> tuple[str, ...]:
    """CREATE statements of the current schema, from COLUMNS and TABLE_OPTIONS, in the text
    sqlite-utils writes for them (a test holds the two equal); indexes as _upgrade_schema's."""
    statements = []
    for table, columns in COLUMNS.items():
        options = TABLE_OPTIONS[table]
        refs = {column: (other, key) for column, other, key in options.get("foreign_keys", [])}
        lines = []
        for column, kind in columns.items():
            line = f'   "{column}" {_SQL_TYPES[kind]}'
            if column == options["pk"]:
                line += " PRIMARY KEY"
            if column in options.get("not_null", ()):
                line += " NOT NULL"
            if column in options.get("defaults", {}):
                line += f" DEFAULT {_sql_default(options['defaults'][column])}"
            if column in refs:
                line += f' REFERENCES "{refs[column][0]}"("{refs[column][1]}")'
            lines.append(line)
        statements.append(f'CREATE TABLE "{table}" (\n' + ",\n".join(lines) + "\n)")
    for table, index in INDEXES.items():
        quoted = ", ".join(f'"{c}"' for c in index)
        statements.append(
            f'CREATE INDEX "idx_{table}_{"_".join(index)}"\n    ON "{table}" ({quoted})'
        )
    return tuple(statements)
