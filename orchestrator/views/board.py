"""The todo board and its machine-readable forms (--json, --format todowrite).

Reads plain rows; imports nothing heavy, so `orch status` starts fast.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator.core.durations import format_duration
from orchestrator.core.findings import Finding, summarize
from orchestrator.core.guards import note as guard_text
from orchestrator.core.status import TODOWRITE, Status
from orchestrator.core.terminal import clean, plural, terminal_width

if TYPE_CHECKING:
    from orchestrator.store.rows import BoardRow, RunRow

STATUS_SCHEMA = "orch.status/v1"

MARKS = {
    Status.COMPLETED: ("✓", "32"),
    Status.FAILED: ("✗", "31"),
    Status.IN_PROGRESS: ("▶", "36"),
    Status.PENDING: ("○", "2"),
    Status.SKIPPED: ("–", "2"),
    Status.BLOCKED: ("⊘", "33"),
    Status.INTERRUPTED: ("!", "35"),
    Status.WAITING: ("?", "33;1"),  # an approval gate: a person's turn
}
PRIORITY = {"high": "high", "medium": "med", "low": "low"}
_DONE = frozenset(s for s in Status if s.done)


class Painter:
    """ANSI colour when wanted; plain text under NO_COLOR or when not a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text


def iso(ts: float | None) -> str | None:
    return (
        None
        if ts is None
        else datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
    )


def duration_of(row: BoardRow) -> float | None:
    """Seconds the latest attempt took; None while it runs or if it never ran."""
    if row["started_at"] is None or row["ended_at"] is None:
        return None
    return max(0.0, float(row["ended_at"] - row["started_at"]))


# The summary line's order: what is done, then what needs attention, then what waits.
SUMMARY_ORDER = (
    Status.COMPLETED,
    Status.SKIPPED,
    Status.IN_PROGRESS,
    Status.FAILED,
    Status.BLOCKED,
    Status.INTERRUPTED,
    Status.WAITING,
    Status.PENDING,
)


def counts(rows: Sequence[BoardRow]) -> dict[str, int]:
    out = {str(s): 0 for s in SUMMARY_ORDER}
    for r in rows:
        out[r["status"]] += 1
    return out


class Snapshot(NamedTuple):
    """What a board shows: a store's tasks, their findings, its latest run and what is stale
    (None: not computed). views/snapshot.py takes one from a store."""

    name: str
    path: Path
    rows: Sequence[BoardRow]
    findings: Mapping[str, list[Finding]]
    run: RunRow | None
    stale: Mapping[str, Sequence[str]] | None

    @property
    def going(self) -> bool:
        """A run is going now."""
        return self.run is not None and self.run["ended_at"] is None

    def as_json(self) -> dict[str, Any]:
        """The documented `orch status --json` object."""
        return status_json(self)


def render_board(snap: Snapshot, color: bool = False, width: int | None = None) -> str:
    plan_name, store_path, rows = snap.name, str(snap.path), snap.rows
    findings, run, stale = snap.findings, snap.run, snap.stale or {}
    paint = Painter(color)
    width = width or terminal_width()
    # Each value drawn goes through `clean` before it is painted (cells through _fit): a
    # store's text is anyone's, and the paint's own escapes must stay escapes.
    lines = [paint(clean(_headline(plan_name, store_path, run, rows), multiline=False), "1")]
    id_w = min(max((len(r["id"]) for r in rows), default=4), 24)
    # Each row's title as drawn: `+` marks a task added at run time, `↺` a guard (a
    # compensation or a `finally` task: not part of the plan's flow).
    titles = [
        f"↺ {r['title']}" if role(r) else f"+ {r['title']}" if added(r) else r["title"]
        for r in rows
    ]
    title_w = min(max(map(len, titles), default=5), 36)
    for r, title in zip(rows, titles, strict=True):
        status, task_id = r["status"], r["id"]
        mark, code = MARKS[status]
        took = format_duration(duration_of(r))
        if status is Status.IN_PROGRESS and r["started_at"]:  # how long it has been running
            took = format_duration(time.time() - r["started_at"]) + "…"
        tries = f"{r['run_attempts']}×" if r["run_attempts"] > 1 else ""  # in its latest run
        found = findings.get(task_id)
        if status in _DONE and task_id in stale:  # a skip's `when` reason may no longer hold
            extra = "stale: " + "; ".join(stale[task_id])
        elif status is Status.COMPLETED or status is Status.IN_PROGRESS:
            extra = (summarize(found) if found else "") or (
                r["reason"] or "" if not r["kind"] else ""
            )
        else:  # why it is not done; else what someone noted on it
            extra = r["reason"] or (summarize(found) if found else "")
        if status is Status.PENDING and role(r):  # what a guard waits to do
            extra = guard_text(r["role"], r["protects"], r["armed_run"])
        head = (
            f" {mark} {_fit(task_id, id_w).ljust(id_w)}  "
            f"{PRIORITY.get(r['priority'], '?').ljust(4)} "
            f"{_fit(title, title_w).ljust(title_w)}  {took.rjust(6)} {tries.rjust(3)}  "
        )
        line = head + _fit(extra, max(width - len(head), 10))
        lines.append(paint(line[:3], code) + line[3:] if color else line)
    total = counts(rows)
    parts = [f"{n} {s.replace('_', ' ')}" for s, n in total.items() if n]
    lines.append(f"{plural(len(rows), 'task')}: " + " · ".join(parts) if rows else "no tasks")
    if by := sorted({r["origin"] for r in rows if added(r)}):
        lines.append(clean(f"+ added by {' or '.join(by)}, not in the plan file (orch todo)"))
    for r in rows:
        if r["status"] in (Status.FAILED, Status.INTERRUPTED, Status.BLOCKED) and r["last_error"]:
            error = clean(f"{r['id']} {r['status']}: {r['last_error']}", multiline=False)
            lines.append(paint(error, "31"))
            lines += [
                f"    | {ln}"[:width] for ln in clean(r["output_tail"] or "").splitlines()[-8:]
            ]
            if r["log_path"]:  # a path: right from any folder
                lines.append(clean(f"    full log: {r['log_path']}", multiline=False))
    ran = (run["plan_file"], run["argv"]) if run is not None else (None, None)
    for r in rows:  # what to type, whole: the gate's reason above is cut to the width
        if r["status"] == Status.WAITING:
            from orchestrator.run.approvals import approve_command  # a waiting gate only

            command = approve_command(r["id"], *ran)
            waits = clean(f"{r['id']} waits for approval: {command}", multiline=False)
            lines.append(paint(waits, "33"))
    return "\n".join(lines)


# The options of the run that `orch approve` needs as well: the same vars make the same plan
# (the approval is of its hash), the same store is where the approval goes.
def role(row: BoardRow) -> str | None:
    """A compensation's or `finally` task's role; None for a step of the plan. (An older store
    has the column too: opening it upgrades it, and a read-only one is refused.)"""
    return row["role"]


def added(row: BoardRow) -> bool:
    """Put on the board by an agent or `orch todo add`, not declared by the plan file."""
    return bool(row["origin"] and row["origin"] != "plan")


def _headline(plan_name: str, store_path: str, run: RunRow | None, rows: Sequence[BoardRow]) -> str:
    if run is None:
        return f"{plan_name} · never run · {store_path}"
    started = datetime.fromtimestamp(run["started_at"]).strftime("%Y-%m-%d %H:%M")
    if run["ended_at"] is None:
        state = f"running since {started} (pid {run['pid']})"
    else:
        took = format_duration(run["ended_at"] - run["started_at"])
        state = f"{run['outcome']} {started} ({took})"
        # `orch reset` / `orch forget` since: the run's outcome no longer describes the board.
        forgotten = sum(
            1
            for r in rows
            if r["status"] == Status.PENDING
            and r["attempts"]  # it ran once: pending again is forgotten, not new
            and (r["updated_at"] or 0) > run["ended_at"]
        )
        if forgotten:
            state += f", then {plural(forgotten, 'task')} forgotten"
    return f"{plan_name} · run #{run['id']} {state} · {store_path}"


def _fit(text: str, width: int) -> str:
    if not text:
        return ""
    text = str(text)
    # Values from processes: no escape sequences, one line. Plain text (the common case: ids,
    # titles) is already that; skipping the work keeps a 1000-task board fast.
    plain = text.isascii() and text.isprintable() and "  " not in text and text == text.strip()
    if not plain:
        text = " ".join(clean(text).split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def status_json(snap: Snapshot) -> dict[str, Any]:
    """The documented `orch status --json` object (schema orch.status/v1, see docs/design.md)."""
    rows, findings, run, stale = snap.rows, snap.findings, snap.run, snap.stale or {}
    return {
        "schema": STATUS_SCHEMA,
        "plan": snap.name,
        "store": str(snap.path),
        "run": None
        if run is None
        else {
            "id": run["id"],
            "started_at": iso(run["started_at"]),
            "ended_at": iso(run["ended_at"]),
            "outcome": run["outcome"],
            "pid": run["pid"],
            "host": run["host"],
        },
        "summary": {"total": len(rows), **counts(rows)},
        "tasks": [
            {
                "id": r["id"],
                "title": r["title"],
                "priority": r["priority"],
                "kind": r["kind"],
                "origin": r["origin"],
                "status": r["status"],
                "reason": r["reason"],
                "attempts": r["attempts"],
                "run_attempts": r["run_attempts"],
                "started_at": iso(r["started_at"]),
                "ended_at": iso(r["ended_at"]),
                "duration_s": duration_of(r),
                "last_error": r["last_error"],
                "output_tail": r["output_tail"],
                "log_path": r["log_path"],
                "stale": list(stale[r["id"]]) if r["id"] in stale else None,
                # A compensation (`on_failure`) or `finally` task: what it undoes, whether armed.
                "role": role(r),
                "protects": r["protects"] if role(r) else None,
                "armed_run": r["armed_run"] if role(r) else None,
                "findings": [
                    {
                        "key": f.key,
                        "value": f.value,
                        "unit": f.unit,
                        "note": f.note,
                        "author": f.author,
                    }
                    for f in findings.get(r["id"], [])
                ],
            }
            for r in rows
        ],
    }


def todowrite(rows: Sequence[BoardRow], findings: Mapping[str, list[Finding]]) -> dict[str, Any]:
    """The todowrite tool's input: {"todos": [{"content", "status", "priority"}]}; a task
    that no plan file declares also has "added_by" (agent or person)."""
    todos = []
    for r in rows:
        status = r["status"]
        note = summarize(findings.get(r["id"], []))
        if status in (Status.FAILED, Status.BLOCKED, Status.INTERRUPTED):
            note = f"{status}: {r['reason'] or r['last_error'] or ''}".rstrip(": ")
        content = f"{r['title']} ({note})" if note else r["title"]
        item = {"content": content, "status": TODOWRITE[status], "priority": r["priority"]}
        if added(r):
            item["added_by"] = r["origin"]
        todos.append(item)
    return {"todos": todos}
