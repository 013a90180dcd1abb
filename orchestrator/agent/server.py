"""`orch mcp`: the todo store served to an agent over the Model Context Protocol (stdio).

Built on the official SDK (`mcp`, its MCPServer); imported only by `orch mcp`. The server holds
no state of its own: every tool opens the store, does one thing and closes it, so any number
of servers, `orch status` and a live `orch run` share one store (WAL: readers never wait; a
write is one short IMMEDIATE transaction, queued behind another for up to the busy timeout).
Writes that could race (adding a task, a todowrite list) are checked inside their transaction.

Every tool goes through the engine API (orchestrator/api.py, a Runbook), as `orch` does.
`run` makes the API's run call in a child process (agent/child.py says why): the run keeps its
own lock, signals, containment and logs, and the server's stdin/stdout stay the protocol's.
The child streams the run's events; each becomes a progress notification; a cancelled call
stops the run as Ctrl-C does (its tasks' processes are ended, the store records `interrupted`).

Bad arguments are tool errors with the reason (`ToolError`), an argument a tool does not take
included (a misspelt `only` must not run the whole plan): never a dead server.
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

from orchestrator.api import Runbook
from orchestrator.core.errors import OrchError, PlanError, did_you_mean
from orchestrator.core.findings import FindingValue
from orchestrator.core.status import Status
from orchestrator.core.terminal import clean
from orchestrator.plan.model import load_plan
from orchestrator.proc.procfs import tail

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


def serve(runbook: Runbook) -> None:
    """Serve on stdin/stdout until the client closes the connection."""
    build(runbook).run()


class _StrictServer(MCPServer[Any]):
    """Refuses an argument a tool does not take, naming it and the ones it takes: the SDK
    would drop it silently, and a misspelt `only` would run the whole plan."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        schema = self._tool_input_schema(name)
        if schema is not None:
            known = sorted(schema.get("properties", {}))
            for arg in sorted(set(arguments) - set(known)):
                raise ToolError(
                    f"{name} takes no argument {arg!r}{did_you_mean(arg, known)}; "
                    f"its arguments: {', '.join(known) or 'none'}"
                )
        return await super().call_tool(name, arguments, context)


def build(runbook: Runbook) -> MCPServer[Any]:
    """The server: one closure per tool, sharing the served runbook."""
    app = _StrictServer("orch", instructions=INSTRUCTIONS)
    store_path = runbook.store_path.absolute()
    runbook = Runbook(runbook.plan_file, store_path, runbook.var_args)  # the cwd may change
    plan_file = runbook.plan_file

    def served() -> Runbook:
        if plan_file is None:
            raise ToolError("serving a store without its plan: start the server as `orch mcp PLAN`")
        return runbook

    def board_now() -> dict[str, Any]:
        if not store_path.exists():
            name = runbook.load().name if plan_file else None
            return {"plan": name, "store": str(store_path), "tasks": []}
        return guarded(lambda: runbook.status().as_json())

    if plan_file is not None:  # the declared tasks on the board from the start: a list handed
        try:  # over before the first run meets them
            runbook.ensure_board()
        except OrchError as exc:  # a damaged store, say: every tool will say so too
            print(clean(f"orch mcp: {exc}"), file=sys.stderr)  # the host's log: a person's

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
        transitions = [
            {
                "from": t["from_status"],
                "to": t["to_status"],
                "reason": t["reason"],
                "run": t["run_id"],
                "attempt": t["attempt"],
                "at": t["at"],
            }
            for t in guarded(lambda: runbook.transitions(id, limit=500))
        ]
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
        served()
        if holder := runbook.holder():
            raise ToolError(
                f"the store is in use by {holder}: wait for it (follow it with `board`), "
                "or stop it first"
            )
        request: dict[str, Any] = {"only": only or [], "rerun": rerun or []}
        request |= {"from_task": from_task}
        request |= {"keep_going": keep_going, "jobs": jobs}
        argv = ["orch", "run", str(plan_file), "--store", str(store_path)]
        argv += [f"--var={v}" for v in runbook.var_args]
        ask: dict[str, Any] = {"plan": str(plan_file), "store": str(store_path)}
        ask |= {"vars": runbook.var_args}
        ask |= {"request": request, "argv": argv}
        # -P: the working directory is not put first on sys.path, where a tasks.py of the
        # user's would hide orch's own package (kinds/registry.py finds the user's modules).
        child = [sys.executable, "-P", "-m", "orchestrator.agent.child", json.dumps(ask)]
        return await _run_with_progress(child, board_now(), ctx)

    @app.tool()
    def todowrite(todos: list[TodoItem]) -> dict[str, Any]:
        """Hand over your todo list (content, status, priority; optionally a board task's id).
        Items that name board tasks (by id, title, or the content `todowrite` output gives
        them) are matched: a task that runs keeps the status its runs gave it, and a
        difference is reported under `differs`; a todo with no kind takes your status. Every
        other item becomes a new todo on the board (`added`). Returns the merge and the board
        as a todo list: there is one list, the board."""
        items = [i.model_dump() for i in todos]
        merge = guarded(lambda: runbook.todowrite(items, AUTHOR))
        from orchestrator.views.board import todowrite as as_todowrite

        snap = guarded(runbook.status)
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
        guarded(lambda: served().add_task(definition, AUTHOR))
        return entry_of(id)

    @app.tool()
    def set_todo_status(
        id: str,
        status: Literal["pending", "in_progress", "completed", "cancelled", "failed", "blocked"],
        note: str | None = None,
    ) -> dict[str, Any]:
        """Set the status of a todo with no kind (one added by `add_task` or `todowrite`),
        with an optional note saying why. A task with a kind gets its status from its runs."""
        from orchestrator.run.todos import status_of

        guarded(lambda: runbook.set_todo(id, status_of(status), note, AUTHOR))
        return entry_of(id)

    @app.tool()
    def remove_task(id: str) -> str:
        """Remove a task that was added (by an agent or a person) from the board; its history
        stays in the store. Tasks the plan file declares are removed by editing the file."""
        guarded(lambda: runbook.remove_task(id, AUTHOR))
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
        finding = guarded(lambda: runbook.record(task, AUTHOR, note, key, value, unit))
        return {"task": task, **finding._asdict()}

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
        from orchestrator.views.sectionfaults import sections_or_failure

        entry = entry_of(task_id, ResourceNotFoundError)
        lines = [f"# {entry['title']} ({task_id}, {entry['kind'] or 'todo'}): {entry['status']}"]
        found = [Finding(**f) for f in entry["findings"]]
        lines += [f"- {summarize([f])}" for f in found]  # as the board writes them
        # A kind whose report() fails gets a section saying so, as on `orch report`'s page.
        sections, _ = (
            sections_or_failure(kind_sections, task_id, entry["kind"], {f.key: f for f in found})
            if entry["kind"]
            else ([], None)
        )
        for section in sections:
            lines += ["", f"## {section.title}", *(f"- **{h}**" for h in section.headline)]
            lines += [f"- {n}" for n in section.notes]
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
    """orch's own errors as tool errors: the reason, for the agent to act on. Through `clean`,
    as on orch's terminal: a host shows tool errors to its person, and what they quote (a
    path, a store's text) may hold characters that act or read as others. Results stay
    exact: they are data."""
    try:
        return call()
    except PlanError as exc:
        raise ToolError(clean("\n".join(str(i) for i in exc.issues))) from None
    except OrchError as exc:
        raise ToolError(clean(str(exc))) from None


async def _run_with_progress(argv: list[str], before: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Run the child; report each event it streams as progress; stop it if cancelled."""
    import subprocess

    import anyio
    from anyio.streams.text import TextReceiveStream

    progress = _Progress(before)
    outputs: dict[str, Any] = {}

    async def drain_stderr(stream: Any) -> None:
        outputs["stderr"] = b"".join([chunk async for chunk in stream])

    async def follow(stream: Any) -> None:
        async for line in TextReceiveStream(stream):
            outputs["pending"] = outputs.get("pending", "") + line
            *whole, outputs["pending"] = outputs["pending"].split("\n")
            for text in whole:
                try:
                    doc = json.loads(text) if text.strip() else {}
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):  # not the child's: a message, never fatal
                    outputs.setdefault("messages", []).append(text)
                elif "event" in doc:
                    for message, total, done in progress.see(doc["event"]):
                        await ctx.report_progress(done, total, message)
                else:
                    outputs["last"] = doc

    process = await anyio.open_process(argv, stdin=subprocess.DEVNULL, start_new_session=False)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(follow, process.stdout)
            group.start_soon(drain_stderr, process.stderr)
            await process.wait()
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
    code = process.returncode
    last: dict[str, Any] = outputs.get("last") or {}
    stderr = outputs.get("stderr", b"").decode("utf-8", "replace").strip()
    if "error" in last:  # a bad plan or selection, the store in use: nothing ran
        raise ToolError(clean(last["error"]))  # as guarded's
    if "result" not in last:
        raise ToolError(clean(stderr) or f"the run's process exited {code} without a result")
    messages = [*outputs.get("messages", []), *stderr.splitlines()][-20:]
    return {**last["result"], "messages": messages, "board": last.get("board")}


class _Progress:
    """A run's events as progress: (line, tasks the run has to settle, tasks it settled).

    Progress only grows (MCP asks it to): it counts the tasks this run brought to an end
    (done, failed, blocked...); the total is what was not done as the run began, plus each
    done task it starts again (a `--rerun`), so the total may grow, never the count shrink."""

    def __init__(self, board: dict[str, Any]) -> None:
        self.todo = {t["id"] for t in board["tasks"] if t["kind"] and not Status(t["status"]).done}
        self.settled = set[str]()

    def see(self, e: dict[str, Any]) -> list[tuple[str, int, int]]:
        from orchestrator.views.events import format_event

        if e["type"] == "transition" and e["to"]:
            if e["to"] == Status.IN_PROGRESS:
                self.todo.add(e["task"])  # a retry of a settled task stays counted
            elif e["to"] != Status.PENDING:
                self.settled.add(e["task"])
        return [(format_event(e), len(self.todo), len(self.settled & self.todo))]
