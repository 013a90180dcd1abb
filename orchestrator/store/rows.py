"""The rows that leave the store, typed: one TypedDict per kind of row a `Store` read returns.

Why TypedDicts: a caller keeps reading `row["status"]` as it did from an sqlite3.Row, and mypy
now checks the key and the type of what it gets; no sqlite3.Row crosses the seam. The store
builds each row as a plain dict (`dict(zip(columns, values))`): ~1 us a row more to build
than an sqlite3.Row, and read by name with a hash lookup instead of a search of the column
names, so a 1000-task board is drawn sooner than before, not later.

Each column is typed as orch writes it: `X | None` where NULL means something (a run not
ended, a task never started, a todo with no kind), the plain type where every writer fills it
(`Store._check` holds the ones orch computes with at every open). A task status
(`todos.status`, `transitions.from_status`/`to_status`) comes back as a `Status`, converted on
read: the store refuses at open a status it does not know. A run's outcome and a guard's role
are the text stored: compare them with `RunOutcome` and `GuardRole`, StrEnums equal to it.

Imports the standard library and orchestrator.core only; the fast path of `orch status` imports
it for annotations alone (under TYPE_CHECKING).
"""

from __future__ import annotations

from typing import TypedDict

from orchestrator.core.findings import FindingValue
from orchestrator.core.status import Status


class RunRow(TypedDict):
    """One `orch run` (Store.runs, open_runs, runs_after)."""

    id: int
    plan_file: str
    started_at: float
    ended_at: float | None  # None: going on, or its orchestrator died unrecorded
    outcome: str | None  # a RunOutcome; None while it has not ended
    pid: int
    pid_started_at: float
    host: str
    boot_id: str
    argv: str  # its command line, secrets masked
    log_dir: str


class _ShownTodo(TypedDict):
    """The columns of a task that a board shows (schema.BOARD_COLUMNS)."""

    id: str
    title: str
    priority: str
    kind: str | None  # None: a todo with no kind, which nothing runs
    origin: str  # plan, or who added it (agent, person)
    status: Status
    reason: str | None
    attempts: int  # every run's attempts: numbers the findings
    started_at: float | None
    ended_at: float | None
    updated_at: float
    last_error: str | None
    output_tail: str | None
    log_path: str | None
    role: str | None  # a GuardRole: a compensation or a `finally` task; None: the plan's flow
    protects: str | None  # the task a compensation undoes
    armed_run: int | None  # the run that armed it (None: not armed)


class TodoRow(_ShownTodo):
    """A task as the store keeps it: one `todos` row (Store.todo, added, armed, due)."""

    position: int
    needs: str  # JSON array of task ids
    in_plan: int  # 0: gone from the plan, or an added task removed (kept for history)
    definition: str | None  # an added task's mapping (JSON)
    spec_hash: str
    spec: str | None  # JSON of what the hash covers (None in a row older than the column)
    run_id: int | None  # the run that last moved it
    pgid: int | None
    pgid_started_at: float | None
    armed_at: float | None


class BoardRow(_ShownTodo):
    """A task as the board draws it (Store.board): with its latest run's attempts. A
    ListedTodoRow is one too."""

    run_attempts: int


class ListedTodoRow(TodoRow):
    """A task as the board lists it (Store.todos): with its latest run's attempts."""

    run_attempts: int


class TransitionRow(TypedDict):
    """One status change of a task, or an edit (from == to), in the append-only log."""

    seq: int
    task_id: str
    from_status: Status | None  # None: the task's first row (added)
    to_status: Status
    at: float
    reason: str | None
    run_id: int | None  # None: not a run's (orch forget, todo, an edit)
    attempt: int


class FindingRow(TypedDict):
    """One finding or note, as recorded (Store.events_after); `value` as stored: a boolean is
    "true"/"false" until `decode`."""

    seq: int
    task_id: str
    attempt: int
    key: str
    value: FindingValue
    unit: str | None
    note: str | None
    at: float
    run_id: int | None
    author: str | None  # None: the task's own attempt; else who recorded it


class ResourceRow(TypedDict):
    """What a task left running for later tasks, held or let go (Store.resources)."""

    name: str
    task_id: str  # its latest holder
    kind: str  # the holder's kind, which ends it
    run_id: int
    held_at: float
    released_at: float | None  # None: held now
    released_by: str | None  # the releasing task; None where the engine ended it
    how: str | None


class HeldResourceRow(ResourceRow):
    """A resource held now (Store.held), with what its kind needs to end it."""

    data: str  # JSON object


class ApprovalRow(TypedDict):
    """Who let an approval gate pass, for which plan and findings (Store.latest_approval)."""

    seq: int
    task_id: str
    by: str
    at: float
    note: str | None
    plan_hash: str
    findings_hash: str
    how: str  # `orch approve`, or `orch run --approve`
    run_id: int | None
