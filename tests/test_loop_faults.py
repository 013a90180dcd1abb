"""The run loop (run/loop.py) when tasks go wrong, through the real `orch` CLI: a bug in a
task class, bad params, an unresolvable `when`, a blocked precondition, retries, the run's
outcome, a SIGKILLed run taken over."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import PlanDir, run_orch, start_orch, wait_for

# --- run/loop.py, through the CLI -----------------------------------------------------------


def _pythonpath(folder: Path) -> dict[str, str]:
    """PYTHONPATH with `folder` added (kept: a mutation run points it at its copy)."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    }


BUGGY = """
from pydantic import BaseModel
from orchestrator import Context, Task

class P(BaseModel):
    n: int = 0

class Buggy(Task[P]):
    Params = P
    def run(self, ctx: Context) -> None:
        print("before the bug", flush=True)
        {}["missing"]
"""


def test_bug_in_a_task_class_fails_the_task_not_the_run(pdir: PlanDir) -> None:
    """An exception from a task class: that task fails with the exception as its error and
    the traceback in its log; the run ends normally and (keep-going) runs the rest."""
    (pdir.root / "mybug.py").write_text(BUGGY)
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: bug, kind: "mybug:Buggy"}}
          - {{id: other, kind: shell, params: {{command: "touch {pdir.root}/other"}}}}
    """)
    r = run_orch("run", plan, "--keep-going", env=_pythonpath(pdir.root))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    row = pdir.todo("bug")
    assert (row["status"], row["last_error"]) == ("failed", "KeyError: 'missing'")
    log = Path(row["log_path"]).read_text()
    assert "Traceback (most recent call last)" in log and "KeyError" in log
    assert pdir.statuses()["other"] == "completed"
    with pdir.db() as conn:
        assert conn.execute("SELECT outcome FROM runs").fetchone()[0] == "failed"


def test_bad_params_fail_the_task_before_it_starts_and_stop_the_run(pdir: PlanDir) -> None:
    (pdir.root / "mybug.py").write_text(BUGGY)
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "echo ::finding n=many"}}}}
          - {{id: bad, kind: "mybug:Buggy", needs: [a], params: {{n: "${{tasks.a.findings.n}}"}}}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    r = run_orch("run", plan, env=_pythonpath(pdir.root))
    assert r.returncode == 1, r.stderr
    row = pdir.todo("bad")
    assert row["status"] == "failed" and row["last_error"].startswith("params: ")
    assert row["attempts"] == 0, "it never started"
    assert pdir.statuses()["later"] == "pending", "fail fast: nothing new starts"


def test_unresolvable_when_fails_the_task_and_stops_unless_keep_going(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "true"}}}}
          - {{id: w, kind: shell, needs: [a], when: "${{tasks.a.findings.nothing}} == 1",
              params: {{command: "true"}}}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    assert pdir.todo("w")["status"] == "failed"
    assert "recorded no finding 'nothing'" in pdir.todo("w")["last_error"]
    assert pdir.statuses()["later"] == "pending"
    r = run_orch("run", plan, "--keep-going")
    assert pdir.statuses()["later"] == "completed"


def test_blocked_precondition_stops_new_work_unless_keep_going(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions: [{{kind: "helpers_tasks:BrokenCheck"}}]
            params: {{command: "true"}}
          - {{id: later, kind: shell, params: {{command: "touch {pdir.root}/later"}}}}
    """)
    env = _pythonpath(Path(__file__).parent)
    r = run_orch("run", plan, env=env)
    assert r.returncode == 1
    assert pdir.statuses() == {"a": "blocked", "later": "pending"}
    assert "--keep-going runs what does not depend on the failure" in r.stderr
    r = run_orch("run", plan, "--keep-going", env=env)
    assert pdir.statuses() == {"a": "blocked", "later": "completed"}


def test_retry_waits_its_delay_and_failure_after_last_attempt_stops(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: flaky
            kind: shell
            retries: {{attempts: 2, delay: 700ms}}
            params: {{command: "echo x >> {pdir.root}/n; exit 1"}}
          - {{id: later, kind: shell, params: {{command: "true"}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1
    with pdir.db() as conn:
        at = [
            row[0]
            for row in conn.execute(
                "SELECT at FROM transitions WHERE task_id='flaky' AND to_status!='pending'"
                " ORDER BY seq"
            )
        ]
    assert len(at) == 4
    assert at[2] - at[1] >= 0.7, "the second attempt starts after the delay"
    assert (pdir.root / "n").read_text() == "x\nx\n"
    assert pdir.statuses()["later"] == "pending"
    assert "task.retry" in r.stderr or "retry" in r.stderr


def test_run_outcome_is_failed_when_a_task_in_scope_is_blocked(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "exit 1"}}
          - {id: b, kind: shell, needs: [a], params: {command: "true"}}
    """)
    assert run_orch("run", plan, "--keep-going").returncode == 1
    with pdir.db() as conn:
        assert conn.execute("SELECT outcome FROM runs").fetchone()[0] == "failed"
    assert pdir.statuses() == {"a": "failed", "b": "blocked"}


def test_sigkilled_holder_of_a_real_run_is_taken_over(pdir: PlanDir) -> None:
    """A real `orch run` holding the store is SIGKILLed mid-task; the next run takes over."""

    plan = pdir.write(f"""
        name: t
        tasks: [{{id: a, kind: shell, params: {{command: "touch {pdir.root}/up; sleep 300"}}}}]
    """)
    proc = start_orch("run", plan)
    try:
        wait_for(lambda: (pdir.root / "up").exists(), what="task started")
        r = run_orch("run", plan)
        assert r.returncode == 3, r.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    plan.write_text(plan.read_text().replace("; sleep 300", ""))
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.statuses() == {"a": "completed"}
