"""One run of a plan through the engine API, for the agent server: `python -P -m
orchestrator.agent.child REQUEST`, REQUEST a JSON object {"plan", "store", "vars", "request",
"argv"} (`argv`: what the run records as its command line).

Why a child and not a thread of the server: a run owns its process. It sets the signal
handlers that turn Ctrl-C and SIGTERM into a recorded `interrupted`, configures the log, and
may run a `python` task's code in-process; the server's stdout must carry nothing but the
protocol, and a task that takes its process down must not take the server with it. The child
makes exactly the call `orch run` makes (Runbook.run), so the run lock still keeps a second
writer out.

Its stdout is JSON lines: {"event": ...} for each event as the store records it (the server's
progress), then {"result": ..., "board": ...} or {"error": ..., "exit_code": ...}. Log lines
(warnings and errors) go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from orchestrator.api import Runbook, RunRequest, stoppable
from orchestrator.core.errors import OrchError, PlanError
from orchestrator.core.umask import private_files

_write = threading.Lock()
_protocol: TextIO = sys.stdout


def emit(doc: dict[str, Any]) -> None:
    with _write:  # events come from the feed's thread, the result from the main one
        _protocol.write(json.dumps(doc) + "\n")
        _protocol.flush()


def own_stdout() -> None:
    """The protocol keeps the stdout it was given; file descriptor 1 and sys.stdout go to
    stderr from now on, so that a `python` task's print() (run in this process) lands among
    the messages instead of inside a JSON line."""
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def main(argv: list[str]) -> int:
    own_stdout()
    stoppable()
    private_files()
    ask = json.loads(argv[1])
    try:
        runbook = Runbook(Path(ask["plan"]), ask["store"], ask.get("vars", ()))
        summary = runbook.run(
            RunRequest(**ask.get("request", {})),
            console="warning",
            argv=ask.get("argv") or ["orch", "run", ask["plan"]],
            on_event=lambda e: emit({"event": e}),
        )
        board = runbook.status().as_json()
    except PlanError as exc:
        emit({"error": "\n".join(str(i) for i in exc.issues), "exit_code": exc.exit_code})
        return exc.exit_code
    except OrchError as exc:
        emit({"error": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    result = {"exit_code": summary.exit_code, "outcome": summary.outcome, "run": summary.run_id}
    emit({"result": result, "board": board})
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
