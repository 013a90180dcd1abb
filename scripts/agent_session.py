"""A scripted agent session against `orch mcp PLAN`, written out as a Markdown transcript.

It drives the server with the official MCP SDK's client over stdio, as an agent host would,
through the loop the field reports ran by hand: what is next, hand over the todo list, run,
read a result, add the investigation decided on and run it, record what was found, close the
loop at the analysis. Every call and an excerpt of its real result go to the transcript.

    scripts/agent_session.py plans/rehearsal.yaml docs/agent-session.md

The rehearsal needs its "production" vLLM on port 8100 first (README, "The rehearsal
without GPUs"); the script starts from whatever the store holds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ORCH = str(Path(sys.executable).parent / "orch")


class Transcript:
    def __init__(self, plan: Path) -> None:
        self.parts = [
            "# An agent session against the rehearsal\n",
            f"Recorded {time.strftime('%Y-%m-%d %H:%M %Z')} by `scripts/agent_session.py "
            f"{plan}` on the 2-core CPU VM: the official MCP SDK's client over stdio against "
            f"`orch mcp {plan}`. Results are the server's, cut for length (`...`).\n",
        ]
        self.step = 0

    def say(self, text: str) -> None:
        self.parts.append(text + "\n")

    def call(self, tool: str, args: dict[str, Any], result: Any, took: float) -> None:
        self.step += 1
        shown = json.dumps(args) if args else ""
        self.parts.append(f"**{self.step}. `{tool}({shown})`** ({took:.1f} s)\n")
        self.parts.append("```json\n" + json.dumps(result, indent=1)[:2500] + "\n```\n")

    def text(self) -> str:
        return "\n".join(self.parts)


def brief_board(board: dict[str, Any]) -> dict[str, Any]:
    """The board as an agent reads it, one line a task."""

    def line(t: dict[str, Any]) -> str:
        found = ", ".join(
            f"{f['key']}={f['value']}{' ' + f['unit'] if f['unit'] else ''}"
            + (f" [{f['author']}]" if f["author"] else "")
            for f in t["findings"][:4]
        )
        added = f" (added by {t['origin']})" if t["origin"] != "plan" else ""
        return f"{t['status']}{added}: {found or t['reason'] or ''}"[:160]

    return {
        "summary": board.get("summary"),
        "tasks": {t["id"]: line(t) for t in board.get("tasks", [])},
    }


async def session(plan: Path, out: Path) -> None:
    transcript = Transcript(plan)
    server = StdioServerParameters(command=ORCH, args=["mcp", str(plan)])
    async with stdio_client(server) as streams, ClientSession(*streams) as s:
        await s.initialize()
        tools = (await s.list_tools()).tools
        transcript.say(
            "The server offers: " + ", ".join(f"`{t.name}`" for t in tools) + ". Its "
            "instructions tell the agent to start with the board.\n"
        )

        async def call(tool: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
            started = time.monotonic()
            r = await s.call_tool(tool, args or {}, **kw)
            text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
            result: Any = json.loads(text) if text[:1] in "[{" else text
            if r.is_error:
                result = {"error": text}
            shown = result
            if tool in ("board",) and isinstance(result, dict) and "tasks" in result:
                shown = brief_board(result)
            if tool == "run" and isinstance(result, dict) and result.get("board"):
                shown = {**result, "board": brief_board(result["board"])}
            transcript.call(tool, args or {}, shown, time.monotonic() - started)
            return result

        transcript.say("## What is next?\n")
        await call("board")
        transcript.say(
            "The agent hands over the list it would have kept itself (the field report's "
            "wording): four items name plan tasks, one is its own. One list results.\n"
        )
        await call(
            "todowrite",
            {
                "todos": [
                    {"content": "Stop vLLM, free its memory", "status": "completed",
                     "priority": "high"},
                    {"content": "Install the serving engine", "status": "in_progress",
                     "priority": "high"},
                    {"content": "Benchmark the base model", "priority": "high"},
                    {"content": "Diagnose server hang after weight loading", "priority": "high",
                     "status": "in_progress"},
                    {"content": "Analyze: does speculation pay?", "priority": "high"},
                ]
            },
        )  # fmt: skip
        transcript.say("## Run the plan, with progress\n")
        progress: list[str] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append(f"[{done:.0f}/{total or 0:.0f}] {message}")

        await call("run", {}, progress_callback=on_progress)
        transcript.say(
            f"{len(progress)} progress notifications came while it ran; the first and last:\n\n"
            "```\n" + "\n".join(progress[:8] + ["..."] + progress[-6:]) + "\n```\n"
        )
        transcript.say("## Read a result, decide, investigate\n")
        noisy = await call("task", {"id": "bench_noisy", "log_lines": 3})
        launch = await call("task", {"id": "launch_noisy", "log_lines": 0})
        ready = next((f for f in launch["findings"] if f["key"] == "ready_after"), None)
        transcript.say(
            "The load of the drafter's server looked like a hang in the field report; here the "
            "agent turns that question into a step that reads the launch's own finding and "
            "runs it alone:\n"
        )
        await call(
            "add_task",
            {
                "id": "check_load",
                "title": "Was the drafter's server hung, or loading?",
                "kind": "shell",
                "needs": ["launch_noisy"],
                "priority": "high",
                "params": {
                    "command": 'echo ::finding load_s="$READY" unit=s note=loading-not-hung',
                    "env": {"READY": "${tasks.launch_noisy.findings.ready_after}"},
                },
            },
        )
        await call("run", {"only": ["check_load"]})
        transcript.say(
            "`check_load` needs `launch_noisy`, whose server the plan had stopped: the run "
            "relaunched it for the check and stopped it after (a completed task that holds a "
            "server runs again when a task that needs it runs), hence the seconds above and a "
            "fresh `ready_after`.\n"
        )
        await call(
            "set_todo_status",
            {
                "id": "diagnose_server_hang_after_weight_loading",
                "status": "completed",
                "note": f"ready after {ready['value'] if ready else '?'} s: loading, not hung",
            },
        )
        transcript.say("## Analysis done\n")
        analysis = await call("task", {"id": "analyze", "log_lines": 12})
        verdicts = {
            f["key"].split(".")[0]: str(f["value"]).split(";")[0]
            for f in analysis["findings"]
            if f["key"].endswith(".verdict")
        }
        accept = next((f["value"] for f in noisy["findings"] if f["key"] == "acceptance"), None)
        await call(
            "record",
            {
                "task": "bench_noisy",
                "note": f"acceptance {accept}: {verdicts.get('noisy', 'no verdict')}",
            },
        )
        await call(
            "record",
            {
                "task": "analyze",
                "key": "decision",
                "value": "; ".join(f"{name}: {head}" for name, head in verdicts.items())
                or "no verdict",
                "note": "the agent's reading of the verdicts",
            },
        )
        report = await s.read_resource("orch://tasks/analyze/report")
        text = report.contents[0].text  # type: ignore[union-attr]
        transcript.say(
            "The analysis' report, as the resource `orch://tasks/analyze/report` gives it "
            "(cut):\n\n```markdown\n" + text[:1800] + "\n```\n"
        )
        await call("board")
    out.write_text(transcript.text())


def main() -> None:
    plan, out = Path(sys.argv[1]), Path(sys.argv[2])
    anyio.run(session, plan, out)


if __name__ == "__main__":
    main()
