"""`orch mcp` driven as an agent drives it: the official SDK's client over stdio."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import ORCH, PlanDir, pid_alive, run_orch, start_orch, wait_for

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def agent(plan: Path, errlog: Path) -> AsyncIterator[ClientSession]:
    """A client session with `orch mcp PLAN`, started as an MCP host starts it."""
    server = StdioServerParameters(command=ORCH, args=["mcp", str(plan)], cwd=str(plan.parent))
    with errlog.open("a") as err:
        async with stdio_client(server, errlog=err) as streams, ClientSession(*streams) as s:
            await s.initialize()
            yield s


async def call(s: ClientSession, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    """A tool's result as data; a tool error as ToolFailed with the text the agent reads."""
    r = await s.call_tool(tool, args or {}, **kw)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    if r.is_error:
        raise ToolFailed(text)
    return json.loads(text) if text[:1] in "[{" else text


class ToolFailed(Exception):
    pass


def drive(session: Callable[[], Coroutine[Any, Any, None]]) -> None:
    anyio.run(session)


def demo(pdir: PlanDir) -> Path:
    shutil.copy(ROOT / "plans" / "demo.yaml", pdir.root / "demo.yaml")
    return pdir.root / "demo.yaml"


def test_an_agent_reads_runs_extends_and_records_and_a_person_sees_it(pdir: PlanDir) -> None:
    plan = demo(pdir)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def session() -> None:
        async with agent(plan, pdir.root / "mcp.err") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) >= {
                "board", "task", "run", "todowrite", "add_task", "set_todo_status",
                "remove_task", "record", "validate_plan",
            }  # fmt: skip
            assert all(t.description and len(t.description) > 60 for t in tools.values())
            assert tools["add_task"].input_schema["properties"]["priority"]["enum"] == [
                "high", "medium", "low",
            ]  # fmt: skip
            first = await call(s, "board")  # never run: the plan's tasks, all pending
            assert first["run"] is None and first["summary"]["pending"] == 5
            # A list handed over before the first run meets the plan's tasks.
            early = await call(
                s, "todowrite", {"todos": [{"content": "Write test data", "status": "pending"}]}
            )
            assert [m["id"] for m in early["matched"]] == ["write_data"] and not early["added"]

            result = await call(s, "run", progress_callback=on_progress)
            assert result["exit_code"] == 0 and result["outcome"] == "completed"
            assert result["board"]["summary"]["completed"] == 5
            finished = [p for p in progress if p[2] and "-> completed" in p[2]]
            assert [p[0] for p in finished] == [1, 2, 3, 4, 5] and finished[-1][1] == 5
            assert any(p[2] and "read_mb_s=" in p[2] for p in progress)  # findings as they come

            # Done tasks run again: progress still only grows, and ends at what the run redid.
            progress.clear()
            await call(s, "run", {"rerun": ["write_data"]}, progress_callback=on_progress)
            counts = [p[0] for p in progress]
            assert counts == sorted(counts) and progress[-1][:2] == (4, 4), progress

            # The investigation it decided on, with a kind: validated, then run alone.
            added = await call(s, "add_task", {
                "id": "recheck", "title": "Re-measure without the page cache",
                "kind": "shell", "needs": ["measure"], "priority": "high",
                "params": {"command": "echo ::finding cold_mb_s=900 unit=MB/s note='cold'"},
            })  # fmt: skip
            assert (added["origin"], added["status"]) == ("agent", "pending")
            ran = await call(s, "run", {"only": ["recheck"], "jobs": 2})
            assert ran["exit_code"] == 0
            task = await call(s, "task", {"id": "recheck", "log_lines": 5})
            assert task["status"] == "completed" and task["findings"][0]["value"] == 900
            assert [t["to"] for t in task["transitions"]] == ["pending", "in_progress", "completed"]
            assert any("cold_mb_s=900" in line for line in task["log_tail"])

            # Its own list: plan tasks matched (a disagreement reported, not applied), new
            # items become todos on the board.
            merged = await call(s, "todowrite", {"todos": [
                {"content": "Prepare a scratch directory", "status": "completed"},
                {"content": "Report", "status": "pending", "priority": "low"},
                {"content": "Diagnose the slow read", "status": "in_progress", "priority": "high"},
            ]})  # fmt: skip
            assert [m["id"] for m in merged["matched"]] == ["prepare", "report"]
            assert merged["differs"] == [
                {"id": "report", "yours": "pending", "board": "completed",
                 "why": merged["differs"][0]["why"]},
            ]  # fmt: skip
            assert merged["added"] == ["diagnose_the_slow_read"]
            assert {"content": "Diagnose the slow read", "status": "in_progress",
                    "priority": "high", "added_by": "agent"} in merged["todos"]  # fmt: skip
            # Handing the board's own list back changes nothing.
            again = await call(s, "todowrite", {"todos": merged["todos"]})
            assert again["added"] == [] and again["differs"] == [] and again["updated"] == []

            await call(s, "record", {
                "task": "measure", "key": "accept_rate", "value": 0.42, "note": "no speedup",
            })  # fmt: skip
            await call(s, "record", {"task": "diagnose_the_slow_read", "note": "page cache"})
            done = await call(
                s, "set_todo_status", {"id": "diagnose_the_slow_read", "status": "completed"}
            )
            assert done["status"] == "completed"

            log = await s.read_resource("orch://tasks/recheck/log")
            assert "cold_mb_s=900" in log.contents[0].text  # type: ignore[union-attr]
            report = await s.read_resource("orch://tasks/measure/report")
            text = report.contents[0].text  # type: ignore[union-attr]
            assert "agent: accept_rate=0.42 (no speedup)" in text  # as the board writes it
            board_text = (await s.read_resource("orch://board")).contents[0].text  # type: ignore[union-attr]
            board = json.loads(board_text)
            assert len(board["tasks"]) == 7

    drive(session)
    # Another process, a person at a terminal: all of it is on the board.
    status = json.loads(run_orch("status", plan, "--json").stdout)
    tasks = {t["id"]: t for t in status["tasks"]}
    assert tasks["recheck"]["origin"] == "agent" and tasks["recheck"]["status"] == "completed"
    assert tasks["diagnose_the_slow_read"]["status"] == "completed"
    assert {"key": "accept_rate", "value": 0.42, "unit": None, "note": "no speedup",
            "author": "agent"} in tasks["measure"]["findings"]  # fmt: skip
    board = run_orch("status", plan).stdout
    assert "+ Diagnose the slow read" in board and "agent: page cache" in board
    plan_steps = json.loads(run_orch("plan", plan, "--json").stdout)["steps"]
    assert {(s["id"], s["origin"]) for s in plan_steps} >= {
        ("recheck", "agent"), ("diagnose_the_slow_read", "agent"), ("prepare", "plan"),
    }  # fmt: skip


def test_bad_arguments_are_tool_errors_and_the_server_lives_on(pdir: PlanDir) -> None:
    plan = demo(pdir)

    async def session() -> None:
        async with agent(plan, pdir.root / "mcp.err") as s:
            bad: list[tuple[str, dict[str, Any], str]] = [
                ("task", {"id": "nope"}, "no task 'nope' on the board"),
                ("add_task", {"id": "x", "kind": "shel"}, "did you mean 'shell'"),
                ("add_task", {"id": "x", "kind": "shell", "params": {"command": "true"},
                              "needs": ["prepar"]}, "needs unknown task 'prepar'"),
                ("add_task", {"id": "bad id"}, "a task's id is"),
                ("add_task", {"id": "x", "needs": ["prepare"]}, "need a kind"),
                ("add_task", {"id": "prepare"}, "already on the board"),
                ("set_todo_status", {"id": "prepare", "status": "completed"}, "has a kind"),
                ("set_todo_status", {"id": "x", "status": "done"}, "status"),
                ("record", {"task": "nope", "note": "x"}, "no task 'nope'"),
                ("record", {"task": "prepare", "value": 3}, "need"),
                ("remove_task", {"id": "prepare"}, "declared in the plan file"),
                ("run", {"only": ["nope"]}, "nope"),
                ("todowrite", {"todos": [{"status": "completed"}]}, "content"),
                ("task", {"id": "prepare", "log_lines": -1}, "log_lines"),
                # A misspelt argument is refused, never dropped: `onyl` must not run it all.
                ("run", {"onyl": ["prepare"]},
                 "run takes no argument 'onyl' (did you mean 'only'?); its arguments: from_task, "
                 "jobs, keep_going, only, rerun"),
                ("board", {"verbose": True}, "board takes no argument 'verbose'"),
            ]  # fmt: skip
            with contextlib.suppress(ToolFailed):
                await call(s, "run", {"onyl": ["prepare"]})
            assert (await call(s, "board"))["run"] is None  # refused before anything ran
            await call(s, "run")
            for tool, args, says in bad:
                try:
                    await call(s, tool, args)
                except ToolFailed as exc:
                    assert says in str(exc), (tool, args, str(exc))
                else:
                    raise AssertionError(f"{tool} {args}: no error")
            assert (await call(s, "board"))["summary"]["completed"] == 5  # still serving
            text = "name: x\ntasks:\n - id: a\n   kind: shel\n"
            problems = await call(s, "validate_plan", {"text": text})
            assert problems["ok"] is False and problems["problems"][0]["line"] == 4
            assert "did you mean 'shell'" in problems["problems"][0]["message"]
            fine = await call(s, "validate_plan", {"text": plan.read_text()})
            assert fine["ok"] and fine["tasks"][0] == "prepare"

    drive(session)


def test_run_is_refused_while_another_run_holds_the_store(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: slow
            kind: shell
            params: {{command: "until [ -e {pdir.root}/go ]; do sleep 0.05; done"}}
    """)
    runner = start_orch("run", plan)

    async def session() -> None:
        async with agent(plan, pdir.root / "mcp.err") as s:
            try:
                await call(s, "run")
            except ToolFailed as exc:
                assert "in use by orch run #1 (pid" in str(exc), str(exc)
            else:
                raise AssertionError("a second run was started")
            board = await call(s, "board")  # reading while the run writes
            assert board["run"]["ended_at"] is None and board["tasks"][0]["status"] == "in_progress"

    try:
        wait_for(lambda: pdir.status_of("slow") == "in_progress", what="slow running")
        drive(session)
    finally:
        (pdir.root / "go").touch()
        runner.communicate(timeout=30)
    assert runner.returncode == 0


def test_a_cancelled_run_stops_as_ctrl_c_does(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: slow, kind: shell, params: {{command: "echo $$ > {pdir.root}/pid; sleep 300"}}}}
    """)

    def started() -> bool:
        pid = pdir.root / "pid"
        return pid.exists() and pid.read_text().strip() != ""

    async def session() -> None:
        async with agent(plan, pdir.root / "mcp.err") as s:
            with anyio.move_on_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(call, s, "run")
                    await anyio.to_thread.run_sync(lambda: wait_for(started))
                    group.cancel_scope.cancel()
            # The server ends the run as Ctrl-C would: the task is recorded interrupted.
            for _ in range(100):
                if (await call(s, "board"))["tasks"][0]["status"] == "interrupted":
                    break
                await anyio.sleep(0.1)
            assert (await call(s, "board"))["tasks"][0]["status"] == "interrupted"

    drive(session)
    pid = int((pdir.root / "pid").read_text())
    wait_for(lambda: not pid_alive(pid), timeout=15, what="the task's process ended")


def test_two_agents_and_a_run_at_once_lose_nothing(pdir: PlanDir) -> None:
    """Two clients add todos and notes while one of them runs the plan: every write lands,
    none sees "database is locked"."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: busy
            kind: shell
            params: {command: "for i in $(seq 300); do echo ::finding i=$i; done; sleep 2"}
    """)

    async def writer(s: ClientSession, name: str) -> None:
        for i in range(20):
            await call(s, "add_task", {"id": f"{name}_{i}", "title": f"{name} {i}"})
            await call(s, "record", {"task": "busy", "note": f"{name}:{i}"})
            await call(s, "board")

    async def session() -> None:
        async with (
            agent(plan, pdir.root / "a.err") as a,
            agent(plan, pdir.root / "b.err") as b,
            anyio.create_task_group() as group,
        ):
            group.start_soon(call, a, "run")
            await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: pdir.status_of("busy") == "in_progress")
            )
            group.start_soon(writer, a, "a")
            group.start_soon(writer, b, "b")

    drive(session)
    with pdir.db() as db:
        added = {r[0] for r in db.execute("SELECT id FROM todos WHERE origin='agent'")}
        notes = db.execute("SELECT count(*) FROM findings WHERE author='agent'").fetchone()[0]
        found = db.execute("SELECT count(*) FROM findings WHERE key='i'").fetchone()[0]
        status = db.execute("SELECT status FROM todos WHERE id='busy'").fetchone()[0]
    assert added == {f"{n}_{i}" for n in "ab" for i in range(20)}
    assert (notes, found, status) == (40, 300, "completed")
    errors = (pdir.root / "a.err").read_text() + (pdir.root / "b.err").read_text()
    assert "locked" not in errors, errors


def test_the_client_snippet_in_docs_agent_md_runs_as_written(tmp_path: Path) -> None:
    """docs/agent.md's client, run from a folder laid out as the repository is."""
    doc = (ROOT / "docs" / "agent.md").read_text()
    snippet = doc.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "plans").mkdir()
    shutil.copy(ROOT / "plans" / "demo.yaml", tmp_path / "plans" / "demo.yaml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "orch").symlink_to(ORCH)
    (tmp_path / "client.py").write_text(snippet)
    r = subprocess.run(
        [sys.executable, "client.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    outcome, statuses = r.stdout.splitlines()
    assert outcome == "completed"
    assert statuses.startswith("{'prepare': 'completed', 'write_data': 'pending'")


def test_a_python_task_that_prints_does_not_break_the_run_tools_stream(pdir: PlanDir) -> None:
    """A `python` task runs inside the run's process: what it prints must not land among the
    JSON lines the agent server reads its progress from; it goes to the task's log."""
    (pdir.root / "chatty.py").write_text(
        "def shout():\n"
        "    print('hello from the task', flush=True)\n"
        "    print('{\"event\": 1}', flush=True)\n"
        "    return 7\n"
    )
    plan = pdir.write("""
        name: t
        tasks:
          - {id: chatty, kind: python, params: {function: "chatty:shout"}}
          - {id: after, kind: shell, needs: [chatty], params: {command: "true"}}
    """)
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def session() -> None:
        async with agent(plan, pdir.root / "mcp.err") as s:
            result = await call(s, "run", progress_callback=on_progress)
            assert result["outcome"] == "completed", result
            assert "hello from the task" not in result["messages"], result["messages"]
            assert any("chatty" in p and "-> completed" in p for p in progress), progress
            chatty = next(t for t in result["board"]["tasks"] if t["id"] == "chatty")
            assert chatty["findings"][0]["value"] == 7
            task = await call(s, "task", {"id": "chatty", "log_lines": 5})
            assert "hello from the task" in task["log_tail"], task["log_tail"]

    drive(session)


def test_a_task_report_resource_says_a_failing_kind_failed(pdir: PlanDir) -> None:
    """orch://tasks/ID/report for a kind whose report() raises: the resource is the findings
    and a section naming the kind and its error, not an error for the agent."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: broken, kind: "helpers_tasks:BrokenReport"}
    """)
    env = {"ORCH_TEST_TOKEN": "tok", "PYTHONPATH": str(ROOT / "tests")}
    assert run_orch("run", plan, env=env).returncode == 0

    async def session() -> None:
        server = StdioServerParameters(
            command=ORCH, args=["mcp", str(plan)], cwd=str(plan.parent), env=env
        )
        with (pdir.root / "mcp.err").open("a") as err:
            async with stdio_client(server, errlog=err) as streams, ClientSession(*streams) as s:
                await s.initialize()
                report = await s.read_resource("orch://tasks/broken/report")
                text = report.contents[0].text  # type: ignore[union-attr]
                assert "reported=1" in text
                assert "## broken: the helpers_tasks:BrokenReport section failed" in text
                assert "- **no answer: helpers_tasks:BrokenReport.report() failed**" in text
                assert "RuntimeError: <b>no</b> access with tok" in text

    drive(session)
