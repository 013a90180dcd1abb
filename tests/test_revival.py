"""Servers come back when a task needs them, and are stopped again after: revival of a held
resource and the `--rerun` rule (orchestrator/run/selection.py), through the real `orch` and a real
HTTP server process (tests/openai_stub.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import PlanDir, free_port, run_orch
from test_servers import STUB, findings, no_server_left

__all__ = ["no_server_left"]  # the autouse fixture: no server process outlives a test


def launch(task_id: str, port: int, needs: str = "[]") -> str:
    return f"""
  - id: {task_id}
    kind: server.launch
    needs: {needs}
    params:
      flavour: command
      command: [{sys.executable}, {STUB}, "{port}", --child]
      port: {port}
      ready_timeout: 30s
      progress_every: 0.5s
      stop_timeout: 5s"""


def bench(task_id: str, server: str) -> str:
    return f"""
  - id: {task_id}
    kind: bench.serve
    needs: [{server}]
    params: {{server: {server}, concurrency: [1], requests: 2, warmup: 0, output_tokens: 4,
             input_words: 4}}"""


def stop(task_id: str, server: str, needs: str) -> str:
    return f"""
  - id: {task_id}
    kind: server.stop
    needs: [{needs}]
    params: {{server: {server}}}"""


def two_servers(tmp_path: Path) -> Path:
    """The rehearsal's shape: prepare -> launch -> bench -> stop -> launch2 (after stop, for
    the order only) -> bench2 -> stop2 -> final (needs both benchmarks)."""
    return PlanDir(tmp_path).write(
        "name: t\ntasks:\n  - {id: prepare, kind: shell, "
        "params: {command: 'true'}}"
        + launch("launch", free_port(), "[prepare]")
        + bench("bench", "launch")
        + stop("stop", "launch", "bench")
        + launch("launch2", free_port(), "[stop]")
        + bench("bench2", "launch2")
        + stop("stop2", "launch2", "bench2")
        + """
  - id: final
    kind: shell
    needs: [bench, bench2]
    params: {command: "echo ::finding ok=1"}
"""
    )


def attempts(pd: PlanDir) -> dict[str, int]:
    with pd.db() as db:
        return dict(db.execute("SELECT id, attempts FROM todos").fetchall())


def dry(plan: Path, *args: str) -> dict[str, tuple[str, str]]:
    """`orch plan --json`: task -> (action, reason)."""
    r = run_orch("plan", plan, "--json", *args)
    assert r.returncode == 0, r.stderr
    return {s["id"]: (s["action"], s["reason"]) for s in json.loads(r.stdout)["steps"]}


ALL_ONCE = {
    "prepare": 1,
    "launch": 1,
    "bench": 1,
    "stop": 1,
    "launch2": 1,
    "bench2": 1,
    "stop2": 1,
    "final": 1,
}


def test_rerun_a_benchmark_relaunches_its_server_stops_it_again_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    plan = two_servers(tmp_path)
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == ALL_ONCE
    steps = dry(plan, "--rerun", "bench")
    assert steps["launch"] == ("run", "what it held was stopped by stop; bench still needs it")
    assert steps["stop"] == ("run", "stops launch again after bench")
    assert steps["bench"][0] == steps["final"][0] == "run"
    for kept in ("prepare", "launch2", "bench2", "stop2"):
        assert steps[kept] == ("skip", "completed"), (kept, steps[kept])

    r = run_orch("run", plan, "--rerun", "bench", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "task.revived" in r.stderr
    assert attempts(pd) == {**ALL_ONCE, "launch": 2, "bench": 2, "stop": 2, "final": 2}
    assert set(pd.statuses().values()) == {"completed"}
    assert findings(plan, "stop")["stopped"] is True  # it stopped the relaunched server
    # launch2 needs stop for the order only: a releaser redone makes nothing stale.
    doc = json.loads(run_orch("status", plan, "--json").stdout)
    assert [t["id"] for t in doc["tasks"] if t["stale"]] == []


def test_the_rerun_rule_stops_at_a_releaser_unless_the_rerun_starts_upstream_of_its_holder(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    plan = two_servers(tmp_path)
    assert run_orch("run", plan, cwd=tmp_path).returncode == 0
    # The launch itself: it, its users and its stop run again; what follows the stop does not.
    steps = dry(plan, "--rerun", "launch")
    assert {t for t, (action, _) in steps.items() if action == "run"} == {
        "launch",
        "bench",
        "stop",
        "final",
    }
    # The releaser alone: nothing needs the server, so it is not relaunched just to be stopped.
    steps = dry(plan, "--rerun", "stop")
    assert {t for t, (action, _) in steps.items() if action == "run"} == {"stop"}
    # Upstream of the holder (a reinstall, say): everything after it ran on the old state.
    steps = dry(plan, "--rerun", "prepare")
    assert {action for action, _ in steps.values()} == {"run"}
    r = run_orch("run", plan, "--rerun", "launch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == {**ALL_ONCE, "launch": 2, "bench": 2, "stop": 2, "final": 2}


def test_only_a_benchmark_brings_its_server_back_and_stops_it_again(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    plan = two_servers(tmp_path)
    assert run_orch("run", plan, cwd=tmp_path).returncode == 0
    steps = dry(plan, "--only", "bench")
    assert steps["launch"] == ("run", "what it held was stopped by stop; bench still needs it")
    assert steps["stop"] == ("run", "stops launch again after bench")
    assert {t for t, (action, _) in steps.items() if action == "leave"} == {
        "prepare",
        "launch2",
        "bench2",
        "stop2",
        "final",
    }
    r = run_orch("run", plan, "--only", "bench", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == {**ALL_ONCE, "launch": 2, "bench": 2, "stop": 2}
    r = run_orch("run", plan, "--only", "bench", "--only", "final", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == {**ALL_ONCE, "launch": 3, "bench": 3, "stop": 3, "final": 2}
    assert findings(plan, "stop")["stopped"] is True


def test_a_user_that_failed_after_the_end_of_the_run_stopped_its_server_gets_it_back(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    port = free_port()
    flag = tmp_path / "fixed"
    plan = pd.write(
        "name: t\ntasks:"
        + launch("launch", port)
        + f"""
  - id: use
    kind: shell
    needs: [launch]
    params: {{command: "curl -sf http://127.0.0.1:{port}/health && test -f {flag}"}}
"""
        + stop("stop", "launch", "use")
    )
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 1
    steps = dry(plan)
    assert steps["launch"] == (
        "run",
        "what it held was ended (at the end of run #1); use still needs it",
    )
    assert steps["stop"] == ("run", "stops launch again after use")
    flag.touch()
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == {"launch": 2, "use": 2, "stop": 1}
    assert findings(plan, "stop")["stopped"] is True


def test_a_task_added_after_the_stop_gets_the_server_back_before_it_is_stopped_again(
    tmp_path: Path,
) -> None:
    """A new user comes after the releaser in the plan and does not need it: the releaser is
    still run after it (an ordering the plan's needs do not give)."""
    pd = PlanDir(tmp_path)
    port = free_port()
    use = f"""
  - id: use
    kind: shell
    needs: [launch]
    params: {{command: "curl -sf http://127.0.0.1:{port}/health"}}"""
    text = "name: t\ntasks:" + launch("launch", port) + use + stop("stop", "launch", "use")
    plan = pd.write(text)
    assert run_orch("run", plan, cwd=tmp_path).returncode == 0
    plan = pd.write(text + use.replace("id: use", "id: late"))
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert attempts(pd) == {"launch": 2, "use": 1, "stop": 2, "late": 1}
    assert findings(plan, "stop")["stopped"] is True


def test_a_finished_plan_relaunches_nothing(tmp_path: Path) -> None:
    pd = PlanDir(tmp_path)
    plan = two_servers(tmp_path)
    assert run_orch("run", plan, cwd=tmp_path).returncode == 0
    assert {action for action, _ in dry(plan).values()} == {"skip"}
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0 and "task.started" not in r.stderr
    # A task that needs only finished results: the servers stay down.
    r = run_orch("run", plan, "--only", "final", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "task.revived" not in r.stderr
    assert attempts(pd) == {**ALL_ONCE, "final": 2}
