"""A board never shows a result built on superseded inputs (orchestrator/run/selection.py,
`Freshness` and `Owed`): a done task behind what it needs is stale, and a `--rerun` cut short
is finished by the next run. Through the real `orch`, a real stub server (tests/openai_stub.py)
and a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st
from test_revival import attempts, bench, dry, launch, stop

from orchestrator.run.selection import Owed

from conftest import PlanDir, free_port, run_orch, start_orch, wait_for
from test_servers import findings, no_server_left

__all__ = ["no_server_left"]  # the autouse fixture: no server process outlives a test


def rehearsal_shape(pd: PlanDir) -> Path:
    """The rehearsal in small: a benchmark, a step that waits for a file (where the kill lands),
    a second server and benchmark, and an analysis that quotes the first benchmark's figure."""
    return pd.write(
        "name: t\ntasks:\n  - {id: prepare, kind: shell, params: {command: 'true'}}"
        + launch("launch", free_port(), "[prepare]")
        + bench("bench", "launch")
        + stop("stop", "launch", "bench")
        + f"""
  - id: pause
    kind: shell
    needs: [stop]
    params:
      command: 'touch {pd.root}/paused; while [ ! -e {pd.root}/go ]; do sleep 0.05; done'"""
        + launch("launch2", free_port(), "[pause]")
        + bench("bench2", "launch2")
        + stop("stop2", "launch2", "bench2")
        + """
  - id: analyze
    kind: shell
    needs: [bench, bench2]
    params:
      command: echo ::finding base=$RESULT:$TOK_S
      env:
        RESULT: "${tasks.bench.findings.result}"
        TOK_S: "${tasks.bench.findings.c1.output_tok_s}"
"""
    )


def board(plan: Path) -> dict[str, dict[str, object]]:
    r = run_orch("status", plan, "--json")
    assert r.returncode == 0, r.stderr
    return {t["id"]: t for t in json.loads(r.stdout)["tasks"]}


def quoted(plan: Path) -> str:
    """What `analyze` says the first benchmark measured, and what the benchmark holds now."""
    b = findings(plan, "bench")
    return f"{b['result']}:{b['c1.output_tok_s']}"


def test_an_interrupted_rerun_is_finished_by_the_next_run_and_the_board_says_stale_meanwhile(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    plan = rehearsal_shape(pd)
    (tmp_path / "go").touch()
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert findings(plan, "analyze")["base"] == quoted(plan)
    first = quoted(plan)

    # --rerun launch re-measures `bench`; SIGKILL while the run waits in `pause`.
    (tmp_path / "go").unlink()
    (tmp_path / "paused").unlink()
    proc = start_orch("run", plan, "--rerun", "prepare", cwd=tmp_path)
    wait_for(lambda: (tmp_path / "paused").exists(), timeout=60, what="the run to reach pause")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert pd.statuses()["bench"] == "completed" and pd.statuses()["analyze"] == "completed"
    assert quoted(plan) != first, "the benchmark was re-measured"

    # Before the resume: the board and the dry run both say analyze is behind, and why.
    why = "bench completed again in run #2, after this ran in run #1"
    tasks = board(plan)
    assert tasks["analyze"]["stale"] == [why], tasks["analyze"]
    assert tasks["bench2"]["stale"] is None  # its own inputs are unchanged
    steps = dry(plan)
    assert steps["analyze"] == ("run", "--rerun prepare (run #2) did not finish it")
    r = run_orch("plan", plan, "--json")
    analyze = next(s for s in json.loads(r.stdout)["steps"] if s["id"] == "analyze")
    assert analyze["changed"] == [why]
    for rest in ("launch2", "bench2", "stop2"):  # what the rerun forced and never reached
        assert steps[rest][0] == "run", (rest, steps[rest])
    for done in ("prepare", "launch", "bench", "stop"):  # redone by run #2 already
        assert steps[done][0] == "skip", (done, steps[done])

    (tmp_path / "go").touch()
    r = run_orch("run", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "run.carried" in r.stderr
    assert findings(plan, "analyze")["base"] == quoted(plan), "analyze quotes the new figures"
    assert all(t["stale"] is None for t in board(plan).values())
    assert dry(plan)["analyze"] == ("skip", "completed")  # nothing is owed any more


def shell_chain(pd: PlanDir) -> Path:
    """a -> b -> c, and d after a releaser-like order only: plain shell tasks."""
    return pd.write(
        """
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "echo ::finding n=$RANDOM"}}
          - id: b
            kind: shell
            needs: [a]
            params: {command: "echo ::finding n=$N", env: {N: "${tasks.a.findings.n}"}}
          - {id: c, kind: shell, needs: [b], params: {command: "true"}}
        """
    )


def test_a_task_redone_alone_makes_everything_built_on_it_stale_not_silently_current(
    tmp_path: Path,
) -> None:
    pd = PlanDir(tmp_path)
    plan = shell_chain(pd)
    assert run_orch("run", plan).returncode == 0
    assert all(t["stale"] is None for t in board(plan).values())

    r = run_orch("run", plan, "--rerun", "a", "--only", "a")
    assert r.returncode == 0, r.stderr
    tasks = board(plan)
    assert tasks["b"]["stale"] == ["a completed again in run #2, after this ran in run #1"]
    assert tasks["c"]["stale"] == ["b is stale"]  # built on b, so on the old a
    assert tasks["a"]["stale"] is None
    steps = dry(plan)
    assert steps["b"][0] == steps["c"][0] == "stale"

    r = run_orch("run", plan)  # kept and reported, like a changed spec: --rerun redoes them
    assert r.returncode == 0, r.stderr
    assert "task.stale" in r.stderr and "--rerun b" in r.stderr
    r = run_orch("run", plan, "--rerun", "b")
    assert r.returncode == 0, r.stderr
    assert all(t["stale"] is None for t in board(plan).values())
    assert findings(plan, "b")["n"] == findings(plan, "a")["n"]


def test_a_rerun_stopped_by_a_failure_is_finished_by_the_next_run(tmp_path: Path) -> None:
    """Fail-fast stops `--rerun a` before it reaches `b` (completed, from run #1): fixed and run
    plainly, the run redoes `b` too, so `b` quotes the `a` it now sits beside."""
    pd = PlanDir(tmp_path)
    plan = pd.write(
        f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "echo ::finding n=$RANDOM$RANDOM"}}}}
          - {{id: check, kind: shell, needs: [a], params: {{command: "test ! -e {tmp_path}/bad"}}}}
          - id: b
            kind: shell
            needs: [a]
            params: {{command: "echo ::finding n=$N", env: {{N: "${{tasks.a.findings.n}}"}}}}
        """
    )
    assert run_orch("run", plan).returncode == 0
    (tmp_path / "bad").touch()
    assert run_orch("run", plan, "--rerun", "a").returncode == 1
    assert pd.statuses() == {"a": "completed", "check": "failed", "b": "completed"}
    assert board(plan)["b"]["stale"] == ["a completed again in run #2, after this ran in run #1"]
    (tmp_path / "bad").unlink()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert findings(plan, "b")["n"] == findings(plan, "a")["n"]
    assert attempts(pd) == {"a": 2, "check": 3, "b": 2}  # a was not redone a third time


def test_a_need_done_again_with_the_same_findings_makes_nothing_stale(tmp_path: Path) -> None:
    """What a task is built on is what its needs found: `a` redone finding what it found
    before (a step redone after its compensation undid it, say) replaced nothing."""
    pd = PlanDir(tmp_path)
    plan = pd.write(
        """
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "echo ::finding unit=vllm.service"}}
          - {id: b, kind: shell, needs: [a], params: {command: "true"}}
        """
    )
    assert run_orch("run", plan).returncode == 0
    assert run_orch("run", plan, "--rerun", "a", "--only", "a").returncode == 0
    assert board(plan)["b"]["stale"] is None
    assert dry(plan)["b"] == ("skip", "completed")


@given(
    st.one_of(
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(["run", "since", "tasks", "asked", "x"]), inner, max_size=5
                )
            ),
            max_leaves=12,
        ).map(json.dumps),
    )
)
@example('{"run": Infinity, "since": 1, "tasks": [], "asked": "x"}')
def test_an_owed_record_in_any_state_is_read_or_ignored_never_a_crash(raw: str) -> None:
    """The store's meta row is bytes anyone may have edited: a record orch cannot read owes
    nothing (the next run redoes less, never crashes)."""
    owed = Owed.from_json(raw)
    assert owed is None or all(isinstance(t, str) for t in owed.tasks)
