"""orch's side of a fleet batch, on each host: `python -P -m orchestrator.fleet.host`.

Ansible runs this once per host and batch, with a payload on stdin (base64 of JSON):
{"build", "plan": {"name", "file", "files": {name: {"sha256", "executable", "data"?}}},
"vars": ["K=V", ...], "home", "approve": [...], "wait_s", "argv"}. It

1. refuses to run when this host's orch is not the controller's build (said in the answer);
2. places the plan's folder (the plan, its modules, its `files:`; folder.py) in
   `<home>/<plan name>/` (only what changed), so the host's store is
   `<home>/<plan name>/.orch/<plan name>.db`, and `orch status` there reads it; a file sent
   by digest alone that is not there is asked for: {"missing": [names], "build"};
3. waits while an earlier run of that store is still alive (a controller killed mid-roll
   leaves its batch's runs going; the next roll waits for them instead of running twice);
4. runs the plan through the engine API as `orch run` would (resuming from its own store; on
   a failure its compensations run here, on this host), or, for `orch fleet rollback`, runs
   its compensations as `orch rollback --completed` would;
5. answers on stdout with one JSON object: {"result": {...}, "board": [...], "build": ...,
   "files": {name: sha256}}, or {"refused": ..., "build": ...}, or {"error": ...,
   "exit_code": ...}.

The answer holds the board as the host's store has it (masked there: secrets never leave the
host), without output tails. Log lines go to stderr, which the controller does not keep.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel, Field, ValidationError

from orchestrator.core.errors import OrchError
from orchestrator.core.umask import private_files
from orchestrator.fleet.answer import BoardTask, Finding
from orchestrator.fleet.build import build_id
from orchestrator.fleet.folder import MAX_FILES, FileEntry, held, place

if TYPE_CHECKING:
    from orchestrator.api import Runbook

# What the controller reads of each task (answer.py's schema): the host writes those keys only.
TASK_FIELDS = tuple(k for k in BoardTask.model_fields if k != "findings")
FINDING_FIELDS = tuple(Finding.model_fields)


def board_of(status: dict[str, Any]) -> list[dict[str, Any]]:
    """What the controller keeps of a host's `orch status --json`: each task's status, times
    and findings (not its output tail or log path)."""
    return [
        {
            **{k: t.get(k) for k in TASK_FIELDS},
            "findings": [{k: f.get(k) for k in FINDING_FIELDS} for f in t.get("findings", [])],
        }
        for t in status.get("tasks", [])
    ]


def place_plan(home: Path, plan: PlanFiles) -> tuple[Path, list[str]]:
    """The plan's folder placed (fleet/folder.py): its plan file, and the names sent by
    digest alone that this host does not hold."""
    folder = home / _plain(plan.name)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if plan.file not in plan.files:
        raise ValueError(f"the plan file {plan.file[:80]!r} is not among the files sent")
    return folder / _plain(plan.file), place(folder, plan.files)


def _plain(name: str) -> str:
    """A file name, never a path: the payload comes over the network."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")
    return name


def wait_for_holder(runbook: Runbook, wait_s: float, say: TextIO) -> str | None:
    """Wait while a live run holds the store; the holder's description if it still does."""
    end = time.monotonic() + wait_s
    holder = runbook.holder()
    if holder:
        say.write(f"waiting for {holder} to end\n")
    while holder and time.monotonic() < end:
        time.sleep(0.5)
        holder = runbook.holder()
    return holder


class PlanFiles(BaseModel, extra="forbid"):
    name: str
    file: str  # one of `files`
    files: dict[str, FileEntry] = Field(max_length=MAX_FILES)


class Payload(BaseModel, extra="forbid"):
    """What the controller sends (see the module's docstring); validated after the build
    check, so a controller of another build is refused, not misread."""

    build: str
    plan: PlanFiles
    home: str
    vars: list[str] = []
    approve: list[str] = []
    wait_s: float = Field(3600.0, ge=0)
    argv: list[str] = []
    rollback: bool = False  # undo the plan (`orch rollback --completed`), nothing else


def read_payload(text: str) -> dict[str, Any]:
    """The payload's JSON object (base64 on stdin); ValueError for anything else."""
    doc = json.loads(base64.b64decode(text, validate=True))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def main() -> int:
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # a `python` task's print() must not land inside the answer
    sys.stdout = sys.stderr
    private_files()

    def emit(doc: dict[str, Any]) -> None:
        answer.write(json.dumps(doc) + "\n")
        answer.flush()

    try:
        doc = read_payload(sys.stdin.read().strip())
    except ValueError as exc:
        emit({"error": f"unreadable payload: {exc}", "exit_code": 2})
        return 2
    here = build_id()
    if doc.get("build") != here:
        emit(
            {
                "refused": f"orch here is {here}, the controller's is {doc.get('build')}",
                "build": here,
            }
        )
        return 0
    try:
        payload = Payload.model_validate(doc)
    except ValidationError as exc:
        emit({"error": f"malformed payload: {exc.errors()[0]['msg']}", "exit_code": 2})
        return 2
    from orchestrator.api import Runbook, RunRequest, stoppable

    stoppable()
    try:
        plan_file, missing = place_plan(Path(payload.home), payload.plan)
        if missing:
            emit({"missing": missing, "build": here})
            return 0
        os.chdir(plan_file.parent)
        runbook = Runbook(plan_file, None, payload.vars)
        holder = wait_for_holder(runbook, payload.wait_s, sys.stderr)
        if holder:
            emit({"error": f"still in use by {holder}", "exit_code": 3})
            return 3
        argv = payload.argv or ["orch", "fleet", "run", plan_file.name]
        if payload.rollback:
            summary = runbook.rollback(console="warning", argv=argv, completed=True)
        else:
            request = RunRequest(approve=tuple(payload.approve))
            summary = runbook.run(request, console="warning", argv=argv)
        board = board_of(runbook.status().as_json())
    except OrchError as exc:  # a PlanError's text: its problems, one a line
        emit({"error": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except (OSError, ValueError) as exc:
        emit({"error": f"cannot place the plan: {exc}", "exit_code": 2})
        return 2
    result = {
        "exit_code": summary.exit_code,
        "outcome": str(summary.outcome),
        "run": summary.run_id,
        "store": str(summary.store.resolve()),
    }
    files = held(plan_file.parent, list(payload.plan.files))
    emit({"result": result, "board": board, "build": here, "files": files})
    return 0


if __name__ == "__main__":
    sys.exit(main())
