"""A server left by a killed run is ended by the next run without a silent wait: the run says
what it ends and how long it may wait, and a server that never became ready (its launch was cut
short; vLLM may ignore SIGTERM while it loads) is not given its drain time
(tasks/serving/launch.py `_release_grace`, orchestrator/run/leases.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from conftest import PlanDir, free_port, run_orch, start_orch, wait_for
from test_servers import STUB, no_server_left

__all__ = ["no_server_left"]  # the autouse fixture: no server process outlives a test


def test_a_leftover_server_cut_short_while_loading_is_ended_in_seconds_and_said_so(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    plan = pd.write(
        f"""
        name: t
        vars: {{load: 120}}
        tasks:
          - id: launch
            kind: server.launch
            params:
              flavour: command
              command: [{sys.executable}, {STUB}, "{port}", --load, "${{vars.load}}",
                        --ignore-term-loading]
              port: {port}
              ready_timeout: 200s
              stop_timeout: 60s
        """
    )
    proc = start_orch("run", plan, cwd=tmp_path)
    log = tmp_path / ".orch" / "t.runs" / "1" / "launch.server.log"
    wait_for(lambda: log.exists() and "loading" in log.read_text(), timeout=30, what="loading")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)

    r = run_orch("run", plan, "--var", "load=0", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    events = [
        json.loads(line)
        for line in (tmp_path / ".orch" / "t.runs" / "2" / "events.jsonl").read_text().splitlines()
    ]
    ending = next(e for e in events if e["event"] == "resource.ending")
    assert "never became ready" in ending["how"] and "SIGKILL after 10s" in ending["how"]
    released = next(e for e in events if e["event"] == "resource.released")
    took = float(released["done"].rpartition(" in ")[2].rstrip("s"))
    assert took < 30, released["done"]  # 10 s of grace, not the 60 s stop_timeout
    assert any(e["event"] == "resource.still_ending" for e in events)  # not 10 s of silence
