"""The fleet board: hosts by tasks, from the controller's record (`orch fleet status`).

One row per host: its state in the roll, a mark per task of its plan as the host's orch last
reported it (the single-host board's marks), and its detail: why it stopped, or its headline
findings. The task columns are numbered; a legend under the board names them, so twenty
tasks still fit a terminal.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.status import Status
from orchestrator.core.terminal import clean, plural, terminal_width
from orchestrator.fleet.answer import progress_of
from orchestrator.fleet.record import FleetRecord, Roll
from orchestrator.views.board import MARKS, Painter, iso

FLEET_SCHEMA = "orch.fleet/v1"
STATE_COLOR = {
    "completed": "32",
    "failed": "31",
    "error": "31",
    "refused": "31",
    "unreachable": "35",
    "running": "36",
    "waiting": "33;1",
    "pending": "2",
    "removed": "2",
    "unreadable": "31",
}


def fleet_status(record: FleetRecord, roll: Roll) -> dict[str, Any]:
    """The documented `orch fleet status --json` object (schema orch.fleet/v1)."""
    return {
        "schema": FLEET_SCHEMA,
        "plan": roll.plan,
        "record": str(record.path),
        "roll": {
            "id": roll.id,
            "rollback_of": roll.rollback_of,  # the roll it puts back; null: a roll forward
            "state": roll.state,
            "detail": roll.detail,
            "started_at": iso(roll.started_at),
            "ended_at": iso(roll.ended_at),
            "canary": roll.canary,
            "serial": roll.serial,
            "max_fail": roll.options.get("max_fail", "0"),  # a roll from before --max-fail: 0
            "inventory": roll.inventory,
            "build": roll.build,
            "approved_by": roll.approved_by,
            "approved_at": iso(roll.approved_at),
            "note": roll.note,
        },
        "hosts": [
            {
                "host": h.host,
                "batch": h.batch,
                "canary": roll.canary > 0 and h.batch == 0,
                "state": h.state,
                "detail": h.detail,
                "sent": h.sent,
                "started_at": iso(h.started_at),
                "ended_at": iso(h.ended_at),
                "tasks": [t.model_dump(mode="json") for t in h.board],
                # while it runs: as its store said at the last poll (fleet/progress.py)
                "progress": progress_of(h.board) if h.state == "running" and h.board else None,
            }
            for h in record.hosts(roll.id)
        ],
    }


def render_fleet(doc: dict[str, Any], color: bool = False, width: int | None = None) -> str:
    paint = Painter(color)
    width = width or terminal_width()
    roll, hosts = doc["roll"], doc["hosts"]
    tasks: dict[str, None] = {}
    for h in hosts:
        for t in h["tasks"]:
            tasks.setdefault(t["id"])
    ids = list(tasks)
    done = sum(h["state"] == "completed" for h in hosts)
    head = (
        f"{doc['plan']} · {_roll_name(roll)} {roll['state']} · {done}/{plural(len(hosts), 'host')}"
        f" completed · canary {roll['canary']}, serial {roll['serial']}"
        f", max-fail {roll.get('max_fail', '0')}"
    )
    lines = [paint(clean(head, multiline=False), "1")]
    if roll["detail"]:
        lines.append(clean(roll["detail"], multiline=False)[:width])
    host_w = min(max([4, *(len(h["host"]) for h in hosts)]), 24)
    marks_w = max(len(ids) * 2, 5)
    lines.append(f" {'host':<{host_w}}  {'state':<11} {'batch':<6} {'tasks':<{marks_w}} detail")
    for h in hosts:
        by_id = {t["id"]: t["status"] for t in h["tasks"]}
        cells = " ".join(_mark(by_id.get(i), paint) for i in ids)
        pad = " " * (marks_w - 2 * len(ids) + 1) if ids else " " * marks_w
        batch = "canary" if h["canary"] else str(h["batch"])
        state = paint(f"{h['state']:<11}", STATE_COLOR.get(h["state"], "0"))
        head_w = 1 + host_w + 2 + 12 + 7 + marks_w + 1
        detail = clean(h["detail"] or "", multiline=False)[: max(width - head_w, 10)]
        name = clean(h["host"], multiline=False)[:host_w]
        lines.append(f" {name:<{host_w}}  {state} {batch:<6} {cells}{pad}{detail}")
    if ids:
        legend = "  ".join(f"{n}:{i}" for n, i in enumerate(ids, 1))
        lines.append(paint(f"tasks, left to right: {clean(legend, multiline=False)}", "2"))
    return "\n".join(lines)


def _roll_name(roll: dict[str, Any]) -> str:
    undoes = roll.get("rollback_of")
    return f"rollback #{roll['id']} of roll #{undoes}" if undoes else f"roll #{roll['id']}"


def _mark(status: str | None, paint: Painter) -> str:
    if status is None:
        return paint("·", "2")
    mark, code = MARKS.get(Status(status), ("?", "0"))
    return paint(mark, code)
