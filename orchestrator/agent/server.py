"""`orch mcp`: the todo store served to an agent over the Model Context Protocol (stdio).

Built on the official SDK (`mcp`, its MCPServer); imported only by `orch mcp`. The server holds
no state of its own: every tool opens the store, does one thing and closes it, so any number
of servers, `orch status` and a live `orch run` share one store (WAL: readers never wait; a
write is one short IMMEDIATE transaction, queued behind another for up to the busy timeout).
Writes that could race (adding a task, a todowrite list) are checked inside their transaction.

`run` starts `orch run` as a child process, as a person would: the run keeps its own lock,
signals, containment and logs, and the server's stdin/stdout stay the protocol's. While it
runs, each transition and finding becomes a progress notification; a cancelled call stops the
run as Ctrl-C does (its tasks' processes are ended, the store records `interrupted`).

Bad arguments are tool errors with the reason (`ToolError`): never a dead server.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from pydantic import BaseModel, Field

from orchestrator.core.errors import OrchError, PlanError, did_you_mean
from orchestrator.core.findings import FindingValue
from orchestrator.core.status import Status
from orchestrator.plan.model import Plan, load_plan
from orchestrator.proc.procfs import tail
from orchestrator.run import todos as todo_board
from orchestrator.store.db import Store
from orchestrator.store.lock import RunLock
from orchestrator.views.events import Cursor, read
from orchestrator.views.snapshot import take

R = TypeVar("R")
AUTHOR = "agent"
LOG_LIMIT = 256 * 1024  # bytes of a log a resource returns: the end, where the failure is
POLL_S = 0.5

INSTRUCTIONS = """\
orch runs an ML-infrastructure runbook (a plan of dependency-ordered tasks) and keeps a durable
todo board in SQLite: every status change and finding is recorded, and a run resumes after what
completed. Start with `board` (what is done, running, failed, and why). `run` runs the plan or a
selection and reports progress. Put what you decide to investigate on the board with `add_task`
(with a kind it runs like a plan task; without one it is a todo whose status you set with
`set_todo_status`), or hand over your whole list with `todowrite`. Record what you find with
`record`. A task's log and report are resources (orch://tasks/{id}/log, .../report).
"""


class TodoItem(BaseModel):
    """One item of an agent's todo list (the todowrite schema)."""

    content: str = Field(description="What to do, as the agent words it.")
    status: Literal["pending", "in_progress", "completed", "cancelled"] = "pending"
    priority: Literal["high", "medium", "low"] = "medium"
    id: str | None = Field(None, description="A board task's id, to name it exactly.")


def serve(
    plan: Plan | None, store_path: Path, plan_file: Path | None, var_args: tuple[str, ...]
) -> None:
    """Serve on stdin/stdout until the client closes the connection."""
    build(plan, store_path.absolute(), plan_file, var_args).run()


def build(
    plan: Plan | None, store_path: Path, plan_file: Path | None, var_args: tuple[str, ...]
) -> MCPServer[Any]:
    """The server: one closure per tool, sharing the served plan and store."""
    app: MCPServer[Any] = MCPServer("orch", instructions=INSTRUCTIONS)

    def current_plan() -> Plan:
        if plan is None:
            raise ToolError("serving a store without its plan: start the server as `orch mcp PLAN`")
        return plan

    def open_store(create: bool = False) -> Store:
        try:
            return Store.open(store_path, create=create)
        except OrchError as exc:
            raise ToolError(str(exc)) from None

    def board_now() -> dict[str, Any]:
        if not store_path.exists():
            return {"plan": plan.name if plan else None, "store": str(store_path), "tasks": []}
        return guarded(lambda: take(store_path, plan).as_json())

    if plan is not None:  # the declared tasks on the board from the start: a list handed over
        try:  # before the first run meets them
            store = Store.open(store_path, create=True)
            try:
                todo_board.ensure_plan(plan, store)
            finally:
                store.close()
        except OrchError as exc:  # a damaged store, say: every tool will say so too
            print(f"orch mcp: {exc}", file=sys.stderr)

    @app.tool()
    def board() -> dict[str, Any]:
        """The todo board: every task with its status, reason, attempts, findings (with their
        units and who recorded them), stale marks, and the latest run. Call it first, and
        after a run, to see what is done, what failed and why, and what is next."""
        return board_now()

    @app.tool()
    def task(
        id: str,
        log_lines: Annotated[int, Field(ge=0, le=2000)] = 40,
    ) -> dict[str, Any]:
        """One task in full: its board entry, every status transition (the attempts and their
        reasons), and the last `log_lines` lines of its latest log."""
        entry = entry_of(id)
        store = open_store()
        try:
            transitions = [
                {
                    "from": t["from_status"],
                    "to": t["to_status"],
                    "reason": t["reason"],
                    "run": t["run_id"],
                    "attempt": t["attempt"],
                    "at": t["at"],
                }
                for t in guarded(lambda: store.transitions(id, limit=500))
            ]
        finally:
            store.close()
        log = entry["log_path"]
        return {
            **entry,
            "transitions": transitions,
            "log_tail": tail(Path(log), log_lines) if log and log_lines else [],
        }

    @app.tool()
    async def run(
        ctx: Context,
        only: list[str] | None = None,
        from_task: str | None = None,
        rerun: list[str] | None = None,
        keep_going: bool = False,
        jobs: Annotated[int, Field(ge=1, le=64)] | None = None,
    ) -> dict[str, Any]:
        """Run the plan: every task not yet completed, in dependency order, resuming after
        what completed. `only`: just these tasks (their needs must be completed); `rerun`:
        these and what depends on them, even if completed; `from_task`: that task and every
        later one; `jobs`: up to that many ready tasks at once (default: the plan's). Progress
        is reported as tasks start and finish; returns the exit code, the outcome and the
        board. Refused while another run holds the store."""
        current_plan()
        lock = RunLock(store_path)
        if store_path.exists() and not lock.try_probe():
            raise ToolError(
                f"the store is in use by {lock.describe_holder()}: wait for it "
                "(follow it with `board`), or stop it first"
            )
        argv = [sys.executable, "-m", "orchestrator", "run", str(plan_file), "--json", "--quiet"]
        argv += ["--store", str(store_path), *(f"--var={v}" for v in var_args)]
        argv += [f"--only={t}" for t in only or ()] + [f"--rerun={t}" for t in rerun or ()]
        argv += [f"--from={from_task}"] if from_task else []
        argv += ["--keep-going"] if keep_going else []
        argv += [f"--jobs={jobs}"] if jobs else []
        return await _run_with_progress(argv, store_path, ctx)

    @app.tool()
    def todowrite(todos: list[TodoItem]) -> dict[str, Any]:
        """Hand over your todo list (content, status, priority; optionally a board task's id).
        Items that name board tasks (by id, title, or the content `todowrite` output gives
        them) are matched: a task that runs keeps the status its runs gave it, and a
        difference is reported under `differs`; a todo with no kind takes your status. Every
        other item becomes a new todo on the board (`added`). Returns the merge and the board
        as a todo list: there is one list, the board."""
        store = open_store(create=plan is not None)
        try:
            if plan is not None:
                guarded(lambda: todo_board.ensure_plan(plan, store))
            items = [i.model_dump() for i in todos]
            merge = guarded(lambda: todo_board.todowrite(store, items, AUTHOR))
        finally:
            store.close()
        from orchestrator.views.board import todowrite as as_todowrite

        snap = guarded(lambda: take(store_path, plan))
        return {**merge.as_dict(), **as_todowrite(snap.rows, snap.findings)}

    @app.tool()
    def add_task(
        id: str,
        title: str | None = None,
        kind: str | None = None,
        params: dict[str, Any] | None = None,
        needs: list[str] | None = None,
        priority: Literal["high", "medium", "low"] = "medium",
        when: str | None = None,
        timeout: str | None = None,
        preconditions: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Add a task to the board. With a `kind` (e.g. `shell` with params {command: ...},
        `bench.serve`, `server.launch`) it is validated like a plan task (params, needs,
        ${...} references) and runs at the next `run`; without one it is a todo that nothing
        runs (an investigation, a question): set its status with `set_todo_status`. `needs`:
        ids of tasks it must wait for. It stays on the board across runs and plan edits until
        `remove_task`."""
        definition: dict[str, Any] = {"id": id, "priority": priority}
        fields: dict[str, Any] = {"title": title, "kind": kind, "params": params, "needs": needs}
        fields |= {"when": when, "timeout": timeout, "preconditions": preconditions}
        definition |= {k: v for k, v in fields.items() if v is not None}
        if kind is None and set(definition) - {"id", "title", "priority"}:
            raise ToolError("params, needs, when, timeout and preconditions need a kind")
        served = current_plan()
        store = open_store(create=True)
        try:
            guarded(lambda: todo_board.add(served, store, definition, AUTHOR))
        finally:
            store.close()
        return entry_of(id)

    @app.tool()
    def set_todo_status(
        id: str,
        status: Literal["pending", "in_progress", "completed", "cancelled", "failed", "blocked"],
        note: str | None = None,
    ) -> dict[str, Any]:
        """Set the status of a todo with no kind (one added by `add_task` or `todowrite`),
        with an optional note saying why. A task with a kind gets its status from its runs."""
        store = open_store()
        try:
            guarded(lambda: store.set_todo(id, todo_board.status_of(status), note, AUTHOR))
        finally:
            store.close()
        return entry_of(id)

    @app.tool()
    def remove_task(id: str) -> str:
        """Remove a task that was added (by an agent or a person) from the board; its history
        stays in the store. Tasks the plan file declares are removed by editing the file."""
        store = open_store()
        try:
            guarded(lambda: todo_board.remove(store, id, AUTHOR))
        finally:
            store.close()
        return f"removed {id}"

    @app.tool()
    def record(
        task: str,
        note: str | None = None,
        key: str | None = None,
        value: FindingValue | None = None,
        unit: str | None = None,
    ) -> dict[str, Any]:
        """Record on a task what you found: a finding (`key`, `value`, optional `unit`, and
        `note` as its comment: key=accept_rate value=0.42 note="no speedup") or a note alone
        (`note`). Kept with you as its author, shown on the board with the task's own."""
        store = open_store()
        try:
            finding = guarded(lambda: todo_board.note(store, task, AUTHOR, note, key, value, unit))
        finally:
            store.close()
        return {"task": task, **vars(finding)}

    @app.tool()
    def validate_plan(text: str) -> dict[str, Any]:
        """Check a plan's YAML text (an edited version of the served plan, say) without
        running or saving anything: returns `ok` and each problem with its line."""
        where = plan_file or Path("plan.yaml")
        try:
            checked = load_plan(where, {}, text=text)
        except PlanError as exc:
            return exc.as_json()
        return {"ok": True, "problems": [], "tasks": [t.id for t in checked.tasks]}

    @app.resource("orch://board", mime_type="application/json")
    def board_resource() -> str:
        """The todo board (as the `board` tool returns it)."""
        return json.dumps(board_now(), indent=2)

    @app.resource("orch://tasks/{task_id}/log", mime_type="text/plain")
    def log_resource(task_id: str) -> str:
        """The latest log of a task (its end, up to 256 KiB)."""
        entry = entry_of(task_id, ResourceNotFoundError)
        if not entry["log_path"]:
            return f"{task_id} has not run yet: no log"
        with open(entry["log_path"], "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_LIMIT))
            return f.read().decode("utf-8", "replace")

    @app.resource("orch://tasks/{task_id}/report", mime_type="text/markdown")
    def report_resource(task_id: str) -> str:
        """A task's report: its findings and what its kind says of them (the sections of
        `orch report`, as text; the figures are in `orch report`'s page)."""
        from orchestrator.core.findings import Finding, summarize
        from orchestrator.views.report import kind_sections

        entry = entry_of(task_id, ResourceNotFoundError)
        lines = [f"# {entry['title']} ({task_id}, {entry['kind'] or 'todo'}): {entry['status']}"]
        found = [Finding(**f) for f in entry["findings"]]
        lines += [f"- {summarize([f])}" for f in found]  # as the board writes them
        for section in (
            kind_sections(entry["kind"], {f.key: f for f in found}) if entry["kind"] else ()
        ):
            lines += ["", f"## {section.title}", *(f"- {n}" for n in section.notes)]
            lines += [section.text] if section.text else []
            lines += [f"(figure: {fig.title})" for fig in section.figures]
        return "\n".join(lines)

    def entry_of(task_id: str, missing: type[Exception] = ToolError) -> dict[str, Any]:
        """The task's board entry; `missing` (with a did-you-mean) if it is not on the board."""
        tasks = board_now()["tasks"]
        entry: dict[str, Any] | None = next((t for t in tasks if t["id"] == task_id), None)
        if entry is None:
            known = [t["id"] for t in tasks]
            raise missing(f"no task {task_id!r} on the board{did_you_mean(task_id, known)}")
        return entry

    return app


def guarded(call: Callable[[], R]) -> R:
    """orch's own errors as tool errors: the reason, for the agent to act on."""
    try:
        return call()
    except PlanError as exc:
        raise ToolError("\n".join(str(i) for i in exc.issues)) from None
    except OrchError as exc:
        raise ToolError(str(exc)) from None


async def _run_with_progress(argv: list[str], store_path: Path, ctx: Any) -> dict[str, Any]:
    """Run `orch run` as a child; report each event as progress; stop it if cancelled."""
    import subprocess

    import anyio

    progress = _Progress(store_path)
    outputs: dict[str, bytes] = {}

    async def drain(name: str, stream: Any) -> None:
        chunks = [chunk async for chunk in stream]
        outputs[name] = b"".join(chunks)

    async def report() -> None:
        while True:
            await anyio.sleep(POLL_S)
            for line, total, done in await anyio.to_thread.run_sync(progress.read):
                await ctx.report_progress(done, total, line)

    process = await anyio.open_process(argv, stdin=subprocess.DEVNULL, start_new_session=False)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(drain, "stdout", process.stdout)
            group.start_soon(drain, "stderr", process.stderr)
            group.start_soon(report)
            await process.wait()
            group.cancel_scope.cancel()
        for line, total, done in progress.read():
            await ctx.report_progress(done, total, line)
    except BaseException:
        with anyio.CancelScope(shield=True):  # as Ctrl-C: the run ends its tasks and records it
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                with anyio.move_on_after(30):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        raise
    finally:
        progress.close()
    code = process.returncode
    stderr = outputs.get("stderr", b"").decode("utf-8", "replace").strip()
    if code in (2, 3):  # a bad plan or selection, the store in use: nothing ran
        raise ToolError(stderr or f"orch run exited {code}")
    try:
        board = json.loads(outputs.get("stdout", b"") or b"null")
    except ValueError:
        board = None
    outcome = {0: "completed", 1: "failed", 4: "waiting for an approval", 130: "interrupted"}.get(
        code or 0, f"exit {code}"
    )
    return {
        "exit_code": code,
        "outcome": outcome,
        "messages": stderr.splitlines()[-20:],
        "board": board,
    }


class _Progress:
    """A run's events as progress: (line, tasks the run has to settle, tasks it settled). One
    read connection for the whole run, opened once the store exists (the run may create it).

    Progress only grows (MCP asks it to): it counts the tasks this run brought to an end
    (done, failed, blocked...); the total is what was not done as the run began, plus each
    done task it starts again (a `--rerun`), so the total may grow, never the count shrink."""

    def __init__(self, store_path: Path) -> None:
        self.store_path, self.cursor = store_path, Cursor()
        self.todo, self.settled = set[str](), set[str]()
        self.store: Store | None = None
        self._look(first=True)  # what came before the run is not its progress

    def read(self) -> list[tuple[str, int, int]]:
        return self._look(first=False)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def _look(self, first: bool) -> list[tuple[str, int, int]]:
        from orchestrator.views.events import format_event

        if self.store is None:
            if not self.store_path.exists():
                return []
            self.store = Store.open(self.store_path, create=False)
        events = read(self.store, self.cursor)
        rows = self.store.todos()
        self.todo |= {r["id"] for r in rows if r["kind"] and not Status(r["status"]).done}
        if first:
            return []
        lines = []
        for e in events:
            if e["type"] == "transition" and e["to"]:
                if e["to"] == Status.IN_PROGRESS:
                    self.todo.add(e["task"])  # a retry of a settled task stays counted
                elif e["to"] != Status.PENDING:
                    self.settled.add(e["task"])
            lines.append((format_event(e), len(self.todo), len(self.settled & self.todo)))
        return lines
