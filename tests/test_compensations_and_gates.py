"""Runbook safety through the real `orch`: compensations that survive a crash, `finally` tasks,
`orch rollback`, and approval gates (issue 13). Each task appends to a trail file, so the order
in which things really ran is what is asserted."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import signal
import socket
from pathlib import Path

import pytest

from orchestrator.plan.model import load_plan
from orchestrator.run import loop as executor
from orchestrator.run.checks import Checks
from orchestrator.store.db import Store, runs_dir

from conftest import PlanDir, run_orch, start_orch, wait_for

# A production service stopped first; a step after it that fails while `broken` exists.
MIGRATION = """
    name: t
    vars: {{restore: true}}
    finally:
      - id: cleanup
        kind: shell
        params: {{command: "echo cleanup >> {trail}"}}
    tasks:
      - id: stop_prod
        kind: shell
        params: {{command: "echo stop >> {trail}; echo ::finding unit=vllm.service"}}
        on_failure:
          id: restore_prod
          title: Restore production
          kind: shell
          when: "${{vars.restore}}"
          params:
            command: "echo restore $UNIT >> {trail}"
            env: {{UNIT: "${{tasks.stop_prod.findings.unit}}"}}
      - id: install
        kind: shell
        needs: stop_prod
        params: {{command: "echo install >> {trail}"}}
      - id: bench
        kind: shell
        needs: install
        params: {{command: "echo bench >> {trail}; [ ! -e {root}/broken ] && {wait}"}}
"""


def migration(pdir: PlanDir, wait: str = "true") -> Path:
    (pdir.root / "broken").touch()
    return pdir.write(MIGRATION.format(trail=pdir.root / "trail", root=pdir.root, wait=wait))


def trail(pdir: PlanDir) -> list[str]:
    path = pdir.root / "trail"
    return path.read_text().splitlines() if path.exists() else []


def board(plan: Path) -> dict[str, dict[str, object]]:
    r = run_orch("status", plan, "--json")
    assert r.returncode == 0, r.stderr
    return {t["id"]: t for t in json.loads(r.stdout)["tasks"]}


def started_in(pdir: PlanDir, run_id: int) -> list[str]:
    """The tasks run `run_id` started, in order (from the store's transition log)."""
    with pdir.db() as db:
        return [
            r[0]
            for r in db.execute(
                "SELECT task_id FROM transitions WHERE to_status='in_progress' AND run_id=?"
                " ORDER BY seq",
                (run_id,),
            )
        ]


# --- compensations -----------------------------------------------------------------------------


def test_a_failure_after_a_step_runs_its_compensation_and_the_next_run_redoes_the_step(
    pdir: PlanDir,
) -> None:
    plan = migration(pdir)
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    assert trail(pdir) == ["stop", "install", "bench", "restore vllm.service", "cleanup"]
    tasks = board(plan)
    assert tasks["restore_prod"]["status"] == "completed"
    assert tasks["stop_prod"]["status"] == "pending"  # undone: the next run stops it again
    assert tasks["stop_prod"]["reason"] == "undone by restore_prod"
    assert tasks["install"]["status"] == "completed"  # not undone: it has no compensation
    assert "task.compensating" in r.stderr and "undoes=stop_prod" in r.stderr
    assert "↺ Restore production" in r.stdout

    (pdir.root / "broken").unlink()
    (pdir.root / "trail").unlink()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert trail(pdir) == ["stop", "bench", "cleanup"]  # install kept; nothing undone
    tasks = board(plan)
    # The plan completed: the compensation armed by this run's stop is not needed any more.
    assert tasks["restore_prod"]["status"] == "skipped"
    assert tasks["restore_prod"]["reason"] == "the plan completed: nothing to undo"
    with pdir.db() as db:
        armed = db.execute("SELECT count(*) FROM todos WHERE armed_run IS NOT NULL").fetchone()
    assert armed[0] == 0
    r = run_orch("run", plan)
    assert r.returncode == 0 and "nothing to do" in r.stderr  # a finished plan stays finished


def test_the_compensation_is_armed_in_the_same_commit_as_the_completion(pdir: PlanDir) -> None:
    """Not before (a stop that failed would be "undone"), not after (a kill in between would
    lose it): the arming transition and the completion share a timestamp and a transaction."""
    plan = migration(pdir)
    run_orch("run", plan, "--only", "stop_prod")
    with pdir.db() as db:
        done = db.execute(
            "SELECT at FROM transitions WHERE task_id='stop_prod' AND to_status='completed'"
        ).fetchone()[0]
        armed = db.execute(
            "SELECT at, reason FROM transitions WHERE task_id='restore_prod' AND run_id=1"
            " AND to_status='pending' AND reason LIKE 'armed%'"
        ).fetchone()
        row = db.execute("SELECT armed_run, armed_at FROM todos WHERE id='restore_prod'").fetchone()
    assert armed["at"] == done == row["armed_at"] and row["armed_run"] == 1
    assert armed["reason"] == "armed (run #1): undoes stop_prod if the plan fails after it"
    # A run that did its part (--only) is no failure: nothing is undone...
    assert trail(pdir) == ["stop", "cleanup"]
    assert board(plan)["stop_prod"]["status"] == "completed"
    # ...until a later run fails: then everything armed is undone.
    r = run_orch("run", plan)
    assert r.returncode == 1
    assert trail(pdir)[2:] == ["install", "bench", "restore vllm.service", "cleanup"]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_after_the_first_step_is_compensated_first_by_the_next(
    pdir: PlanDir, how: signal.Signals
) -> None:
    """SIGKILL (nothing runs in the dying orch) or SIGTERM (a stop, not a failure: nothing is
    undone then either): the next run ends what was left running, runs the compensation before
    anything else, says so, and then does the plan."""
    plan = migration(pdir, wait=f"[ -e {pdir.root}/fast ] || sleep 300")
    (pdir.root / "broken").unlink()
    runner = start_orch("run", plan)
    wait_for(lambda: "bench" in trail(pdir), what="bench running")
    os.killpg(runner.pid, how)
    runner.communicate(timeout=30)
    assert trail(pdir) == ["stop", "install", "bench"]  # the dead run undid nothing
    (pdir.root / "fast").touch()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert trail(pdir)[3:] == ["restore vllm.service", "cleanup", "stop", "bench", "cleanup"]
    assert started_in(pdir, 2)[:2] == ["restore_prod", "cleanup"]
    assert "run.compensating" in r.stderr and "armed by run #1, which did not complete" in r.stderr


def dry(plan: Path) -> list[tuple[str, str, str]]:
    """`orch plan --json`: (task, action, reason), in the order the run would take them."""
    r = run_orch("plan", plan, "--json")
    assert r.returncode == 0, r.stderr
    return [(s["id"], s["action"], s["reason"]) for s in json.loads(r.stdout)["steps"]]


def test_orch_plan_says_finally_runs_only_when_a_step_surely_starts(pdir: PlanDir) -> None:
    """A `finally` task is armed by the first step that starts. When the only step to run is
    a gate (it waits unless approved), the dry run does not promise the `finally` task, and
    the run indeed stops at the gate without it; once a plain step would start, it says run."""
    cleanup = f'{{id: cleanup, kind: shell, params: {{command: "echo c >> {pdir.root}/trail"}}}}'
    gate = "{id: confirm, kind: approve, params: {message: go?}}"
    plan = pdir.write(f"""
        name: t
        finally: [{cleanup}]
        tasks:
          - {gate}
          - {{id: after, kind: shell, needs: confirm, params: {{command: "true"}}}}
    """)
    steps = {i: (a, r) for i, a, r in dry(plan)}
    assert steps["confirm"] == ("run", "an approval gate: waits unless approved")
    assert steps["cleanup"] == (
        "guard",
        "runs at the end of the run (not armed unless a step starts: none surely does)",
    )
    assert run_orch("run", plan).returncode == 4  # waits at the gate
    assert started_in(pdir, 1) == [] and trail(pdir) == []  # as it said: no cleanup
    first = "{id: first, kind: shell, params: {command: 'true'}}"
    plan.write_text(plan.read_text().replace(f"- {gate}", f"- {first}\n  - {gate}"))
    steps = {i: (a, r) for i, a, r in dry(plan)}
    assert steps["first"] == ("run", "")
    assert steps["cleanup"] == ("run", "runs at the end of the run")


@pytest.mark.parametrize("how", ["failed", "stopped", "killed"])
def test_orch_plan_runs_the_due_compensation_first_and_the_step_it_undoes_again(
    pdir: PlanDir, how: str
) -> None:
    """Run #1 left restore_prod armed and due: bench failed and restore_prod failed too at
    the run's end (`failed`), or the run was stopped (SIGTERM) or killed (SIGKILL: the run is
    still open in the store) in bench, undoing nothing (cleanup is due then too). The store
    says stop_prod completed, but the next run undoes it first and so stops it again: `orch
    plan` must say so, in the run's order, and the run must do what it said."""
    root = pdir.root
    wait = "true" if how == "failed" else f"[ -e {root}/fast ] || sleep 300"
    plan = migration(pdir, wait=wait)
    if how == "failed":
        plan.write_text(
            plan.read_text().replace("echo restore", f"[ ! -e {root}/stuck ] && echo restore")
        )
        (root / "stuck").touch()
        assert run_orch("run", plan).returncode == 1
        assert pdir.statuses()["restore_prod"] == "failed"  # still armed: due
        (root / "stuck").unlink()
        due_first = ["restore_prod"]
    else:
        runner = start_orch("run", plan)
        wait_for(lambda: "bench" in trail(pdir), what="bench running")
        os.killpg(runner.pid, signal.SIGTERM if how == "stopped" else signal.SIGKILL)
        runner.communicate(timeout=30)
        (root / "fast").touch()
        due_first = ["restore_prod", "cleanup"]  # the engine's order: compensations first
    (root / "broken").unlink()
    assert trail(pdir)[:3] == ["stop", "install", "bench"]
    assert "restore vllm.service" not in trail(pdir)
    assert pdir.statuses()["stop_prod"] == "completed"  # what the store says now

    steps = dry(plan)  # before anything else reads the store (`status` closes a dead run)
    assert [(i, a) for i, a, _ in steps] == [
        *[(i, "undo") for i in due_first],
        ("stop_prod", "run"),
        ("install", "skip"),  # no compensation: kept
        ("bench", "run"),
        ("cleanup", "run"),  # a step starts: the run's end runs it
    ]
    why = {(i, a): reason for i, a, reason in steps}
    assert why["restore_prod", "undo"] == (
        "armed (run #1): undoes stop_prod if the plan fails after it (due: runs first)"
    )
    assert why["stop_prod", "run"] == "undone by restore_prod"
    assert why["cleanup", "run"] == "runs at the end of the run"
    text = run_orch("plan", plan).stdout
    assert "  undo     restore_prod  armed (run #1): undoes stop_prod" in text, text
    assert "  run      stop_prod     undone by restore_prod\n" in text, text

    before = len(trail(pdir))
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    # The run did what `orch plan` said, in that order, and nothing else.
    assert started_in(pdir, 2) == [i for i, a, _ in steps if a in ("undo", "run")]
    assert trail(pdir)[before:] == [
        "restore vllm.service",
        *(["cleanup"] if how != "failed" else []),
        "stop",
        "bench",
        "cleanup",
    ]
    assert pdir.statuses()["stop_prod"] == "completed"


def test_orch_plan_says_no_step_runs_while_a_due_compensation_is_blocked(pdir: PlanDir) -> None:
    """A due compensation whose precondition fails now blocks, and then the run stops before
    the plan's steps: `orch plan` says that, and the run starts nothing."""
    with socket.socket() as held:  # the port restore_prod needs free stays taken throughout
        held.bind(("127.0.0.1", 0))
        held.listen()
        plan = pdir.write(f"""
            name: t
            finally: [{{id: cleanup, kind: shell, params: {{command: "echo cleanup"}}}}]
            tasks:
              - id: stop_prod
                kind: shell
                params: {{command: "echo stop >> {pdir.root}/trail"}}
                on_failure:
                  id: restore_prod
                  kind: shell
                  preconditions: [{{kind: port.free, port: {held.getsockname()[1]}}}]
                  params: {{command: "echo restore >> {pdir.root}/trail"}}
              - id: bench
                kind: shell
                needs: stop_prod
                params: {{command: "[ ! -e {pdir.root}/broken ]"}}
        """)
        (pdir.root / "broken").touch()
        assert run_orch("run", plan).returncode == 1
        assert pdir.statuses()["restore_prod"] == "blocked"  # still armed: due
        (pdir.root / "broken").unlink()
        steps = dry(plan)
        assert [(i, a) for i, a, _ in steps] == [
            ("restore_prod", "block"),
            ("stop_prod", "leave"),
            ("bench", "leave"),
            ("cleanup", "guard"),
        ]
        why = {i: reason for i, _, reason in steps}
        assert "(due; precondition port.free fails now: port" in why["restore_prod"]
        assert why["bench"] == "restore_prod would not complete, so the plan's steps do not run"
        assert why["cleanup"] == "runs at the end of the run (not armed: no step starts)"
        r = run_orch("run", plan)
        assert r.returncode == 1 and "the plan's steps did not run" in r.stderr
        assert started_in(pdir, 2) == []  # as it said: nothing
        assert trail(pdir) == ["stop"]


def test_a_compensation_that_fails_first_stops_the_run_and_rollback_retries_it(
    pdir: PlanDir,
) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: stop_prod
            kind: shell
            params: {{command: "echo stop >> {pdir.root}/trail"}}
            on_failure:
              id: restore_prod
              kind: shell
              params: {{command: "[ -e {pdir.root}/unit ] && echo restore >> {pdir.root}/trail"}}
          - id: bench
            kind: shell
            needs: stop_prod
            params: {{command: "[ -e {pdir.root}/good ]"}}
          - {{id: notes, kind: shell, params: {{command: "true"}}}}
    """)
    assert run_orch("run", plan).returncode == 1  # bench failed; the restore failed too
    tasks = board(plan)
    assert tasks["restore_prod"]["status"] == "failed"
    assert tasks["stop_prod"]["status"] == "completed"  # not undone: its undo did not complete
    assert tasks["notes"]["reason"] == "not started: the run stopped after bench failed"
    (pdir.root / "good").touch()
    r = run_orch("run", plan)  # the restore is due, fails again: nothing of the plan runs
    assert r.returncode == 1
    assert started_in(pdir, 2) == ["restore_prod"]
    assert "the plan's steps did not run" in r.stderr
    assert board(plan)["notes"]["reason"] == (
        "not started: a compensation or finally task did not complete"
    )
    (pdir.root / "unit").touch()
    r = run_orch("rollback", plan)
    assert r.returncode == 0, r.stderr
    assert trail(pdir) == ["stop", "restore"]
    assert started_in(pdir, 3) == ["restore_prod"]
    assert board(plan)["stop_prod"]["status"] == "pending"
    r = run_orch("rollback", plan)
    assert r.returncode == 0 and started_in(pdir, 4) == []  # nothing armed: nothing to undo
    assert run_orch("run", plan).returncode == 0
    assert trail(pdir) == ["stop", "restore", "stop"]


def test_a_rollback_with_nothing_to_undo_records_no_run(pdir: PlanDir) -> None:
    """Nothing armed, nothing left running: `orch rollback` says so and records no run, so
    the board's header is not a "completed" run above a failed task (or all pending)."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "exit 1"}}
          - {id: b, kind: shell, needs: a, params: {command: "true"}}
    """)
    r = run_orch("rollback", plan)
    assert r.returncode == 0, r.stderr
    assert "nothing is armed: nothing to undo" in r.stderr
    assert " · never run · " in r.stdout.splitlines()[0] and "2 pending" in r.stdout
    assert run_orch("run", plan).returncode == 1
    r = run_orch("rollback", plan)
    assert r.returncode == 0 and "nothing is armed: nothing to undo" in r.stderr
    assert r.stdout.startswith("t · run #1 failed "), r.stdout
    with pdir.db() as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert json.loads(run_orch("status", plan, "--json").stdout)["run"]["outcome"] == "failed"


def test_rollback_completed_undoes_a_completed_plan_last_step_first_once(pdir: PlanDir) -> None:
    """A completed plan disarmed its compensations; `--completed` arms them again and runs
    them, the last step's first; what they undid is pending, and a second rollback finds
    nothing (the next run redoes the steps)."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            params: {command: "echo a >> trail"}
            on_failure: {id: undo_a, kind: shell, params: {command: "echo undo_a >> trail"}}
          - id: b
            kind: shell
            needs: a
            params: {command: "echo b >> trail"}
            on_failure: {id: undo_b, kind: shell, params: {command: "echo undo_b >> trail"}}
          - {id: c, kind: shell, needs: b, params: {command: "echo c >> trail"}}
    """)
    assert run_orch("run", plan).returncode == 0
    plain = run_orch("rollback", plan)
    assert plain.returncode == 0 and "nothing is armed: nothing to undo" in plain.stderr
    undone = run_orch("rollback", plan, "--completed")
    assert undone.returncode == 0, undone.stderr
    assert trail(pdir) == ["a", "b", "c", "undo_b", "undo_a"]
    tasks = board(plan)
    assert [tasks[t]["status"] for t in ("a", "b", "c")] == ["pending", "pending", "completed"]
    with pdir.db() as db:
        armed = db.execute(
            "SELECT reason FROM transitions WHERE task_id='undo_a' AND to_status='pending'"
            " ORDER BY seq DESC LIMIT 1"
        ).fetchone()[0]
    assert armed == "armed again: orch rollback --completed (run #2)"
    again = run_orch("rollback", plan, "--completed")
    assert again.returncode == 0 and "nothing is armed: nothing to undo" in again.stderr
    assert trail(pdir) == ["a", "b", "c", "undo_b", "undo_a"]
    assert run_orch("run", plan).returncode == 0
    assert trail(pdir)[5:] == ["a", "b"]


def test_a_compensation_the_user_turned_off_is_skipped_and_undoes_nothing(pdir: PlanDir) -> None:
    plan = migration(pdir)
    r = run_orch("run", plan, "--var", "restore=false")
    assert r.returncode == 1
    assert "restore vllm.service" not in trail(pdir)
    tasks = board(plan)
    assert tasks["restore_prod"]["status"] == "skipped"
    assert tasks["stop_prod"]["status"] == "completed"


def test_guards_are_not_steps(pdir: PlanDir) -> None:
    plan = migration(pdir)
    r = run_orch("run", plan, "--only", "restore_prod")
    assert r.returncode == 2
    assert (
        "'restore_prod' is a compensation (it undoes stop_prod if the plan fails after it), "
        "not a step" in r.stderr
    )
    assert "orch rollback" in r.stderr


def test_bad_compensations_are_plan_errors_with_lines(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        finally:
          - {id: fin, kind: shell, needs: a, params: {command: "true"}}
          - just text
        tasks:
          - id: a
            kind: shell
            params: {command: "true"}
            on_failure:
              - id: a
                kind: shell
                params: {command: "true"}
              - id: undo
                kind: shel
                params: {command: "${tasks.b.findings.x}"}
          - id: b
            kind: shell
            needs: undo
            params: {command: "true"}
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    expected = [
        ":4: task 'fin': `needs` has no meaning in finally",
        ":5: finally: each entry is a task",
        ":11: duplicate task id 'a'",
        "unknown task kind 'shel'",
        "${tasks.b.findings.x}: 'b' is not among the needs of 'undo'",
        ":19: task 'b' needs unknown task 'undo'",
    ]
    for text in expected:
        assert any(text in line for line in lines), (text, r.stderr)


# --- approval gates ----------------------------------------------------------------------------

GATED = """
    name: t
    tasks:
      - id: measure
        kind: shell
        params: {{command: "echo ::finding tok_s=$(cat {trail}.tok) unit=tok/s"}}
      - id: confirm
        kind: approve
        needs: measure
        params:
          message: stop the production vLLM?
          show: {{base_tok_s: "${{tasks.measure.findings.tok_s}}"}}
      - id: stop
        kind: shell
        needs: confirm
        params: {{command: "echo stop >> {trail}"}}
"""


def gated(pdir: PlanDir) -> Path:
    (pdir.root / "trail.tok").write_text("980")
    return pdir.write(GATED.format(trail=pdir.root / "trail"))


def approvals(pdir: PlanDir) -> list[dict[str, object]]:
    with pdir.db() as db:
        return [dict(r) for r in db.execute("SELECT * FROM approvals ORDER BY seq")]


def test_a_run_stops_at_the_gate_until_approved(pdir: PlanDir) -> None:
    plan = gated(pdir)
    r = run_orch("run", plan)
    assert r.returncode == 4, r.stderr  # waiting: neither success (0) nor failure (1)
    assert trail(pdir) == []
    tasks = board(plan)
    assert tasks["confirm"]["status"] == "waiting" and tasks["stop"]["status"] == "pending"
    assert "approve: stop the production vLLM? (base_tok_s=980)" in str(tasks["confirm"]["reason"])
    assert "? confirm" in r.stdout and "1 waiting" in r.stdout
    with pdir.db() as db:
        assert db.execute("SELECT outcome FROM runs").fetchone()[0] == "waiting"
    assert run_orch("run", plan).returncode == 4  # still waiting: nobody approved

    r = run_orch("approve", plan, "confirm", "--note", "maintenance window")
    assert r.returncode == 0, r.stderr
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert trail(pdir) == ["stop"]
    (record,) = approvals(pdir)
    assert record["how"] == "orch approve" and record["note"] == "maintenance window"
    assert str(record["by"]).startswith(os.environ.get("SUDO_USER") or getpass.getuser())
    found = {f["key"]: f for f in board(plan)["confirm"]["findings"]}  # type: ignore[attr-defined]
    assert found["approved_by"]["value"] == record["by"]
    assert found["approved_by"]["note"] == "maintenance window"
    assert found["base_tok_s"]["value"] == 980


def test_the_board_says_whole_what_to_type_at_a_gate(pdir: PlanDir) -> None:
    """The gate's row is cut to the width; under the board, the command to approve it, whole:
    the plan as the run was given it and the run's --var options (the approval is of the
    plan those make). Typed as shown, it lets the same run pass the gate."""
    pdir.write("""
        name: t
        vars: {n: 1, token: {default: "", secret: true}}
        tasks:
          - {id: measure, kind: shell, params: {command: "echo ${vars.n}"}}
          - id: confirm
            kind: approve
            needs: measure
            params: {message: stop the production vLLM server now that the benchmark is done?}
          - {id: stop, kind: shell, needs: confirm, params: {command: "true"}}
    """)
    r = run_orch("run", "plan.yaml", "--var", "n=2", cwd=pdir.root, env={"COLUMNS": "100"})
    assert r.returncode == 4, r.stderr
    (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith(" ? confirm")]
    assert row.endswith("…") and "orch approve" not in row  # the board's width cut it
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("confirm ")]
    assert line == "confirm waits for approval: orch approve plan.yaml confirm --var n=2"
    assert len(line) <= 100
    tasks = board(pdir.root / "plan.yaml")
    assert tasks["stop"]["reason"] == "not started: the run waits for approval of confirm"
    assert str(tasks["confirm"]["reason"]).endswith(" · orch approve plan.yaml confirm --var n=2")
    assert "orch approve plan.yaml confirm --var n=2, then run again" in r.stderr
    typed = shlex.split(line.partition(": ")[2])
    assert run_orch(*typed[1:], cwd=pdir.root).returncode == 0
    assert run_orch("run", "plan.yaml", "--var", "n=2", cwd=pdir.root).returncode == 0
    assert "confirm waits" not in run_orch("status", "plan.yaml", cwd=pdir.root).stdout
    # Another store, a secret var: its value is never written, so it is named, not shown.
    r = run_orch("run", "plan.yaml", "--var=token=s3cr3t", "--store", "b.db", cwd=pdir.root)
    assert r.returncode == 4 and "s3cr3t" not in r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == (
        "confirm waits for approval: orch approve plan.yaml confirm --store b.db"
        " (and the run's secret --var values)"
    )


def test_an_edited_plan_or_changed_findings_void_the_approval(pdir: PlanDir) -> None:
    plan = gated(pdir)
    assert run_orch("run", plan).returncode == 4
    assert run_orch("approve", plan, "confirm").returncode == 0
    plan.write_text(plan.read_text().replace("echo stop", "echo stopped"))  # edited after
    r = run_orch("run", plan)
    assert r.returncode == 4
    assert "no longer holds: the plan changed since" in str(board(plan)["confirm"]["reason"])
    assert run_orch("approve", plan, "confirm").returncode == 0
    # The figures the person saw change (measured again): asked again.
    (pdir.root / "trail.tok").write_text("500")
    r = run_orch("run", plan, "--rerun", "measure")
    assert r.returncode == 4
    reason = str(board(plan)["confirm"]["reason"])
    assert "(base_tok_s=500)" in reason and "the findings it was shown changed since" in reason
    assert trail(pdir) == []
    assert run_orch("approve", plan, "confirm").returncode == 0
    assert run_orch("run", plan).returncode == 0
    assert trail(pdir) == ["stopped"]
    assert len(approvals(pdir)) == 3 and len({a["plan_hash"] for a in approvals(pdir)}) == 2


def test_approve_on_the_command_line_is_recorded_the_same_way(pdir: PlanDir) -> None:
    plan = gated(pdir)
    r = run_orch("run", plan, "--approve", "confirm")
    assert r.returncode == 0, r.stderr
    (record,) = approvals(pdir)
    assert record["how"] == "orch run --approve" and record["run_id"] == 1


def test_a_gate_whose_finding_is_missing_fails_and_approve_names_the_gates(pdir: PlanDir) -> None:
    plan = gated(pdir)
    plan.write_text(plan.read_text().replace("tok_s=", "other="))
    r = run_orch("run", plan, "--approve", "confirm")
    assert r.returncode == 1
    assert "recorded no finding 'tok_s'" in str(board(plan)["confirm"]["last_error"])
    r = run_orch("approve", plan, "measure")
    assert r.returncode == 2 and "'measure' is not an approval gate" in r.stderr
    assert "(gates: confirm)" in r.stderr


def test_an_approval_holds_when_the_store_has_tasks_added_to_the_plan(pdir: PlanDir) -> None:
    """`orch approve` hashes the plan the run runs: the file's tasks and those added to the
    store (`orch todo add`, an agent), not the file's alone."""
    plan = gated(pdir)
    added = run_orch("todo", "add", plan, "extra", "--kind", "shell", "--param", "command=echo")
    assert added.returncode == 0, added.stderr
    assert run_orch("run", plan).returncode == 4
    assert run_orch("approve", plan, "confirm").returncode == 0
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert trail(pdir) == ["stop"]


def test_a_mistyped_approve_is_a_usage_error_not_a_wait(pdir: PlanDir) -> None:
    plan = gated(pdir)
    r = run_orch("run", plan, "--approve", "confrim")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "'confrim' is not an approval gate" in r.stderr and "did you mean 'confirm'" in r.stderr
    assert not pdir.store_path().exists()  # nothing ran


def add_gate(plan: Path, pdir: PlanDir) -> None:
    """A gate `late` added to the store after `measure`, and a step `after` behind it."""
    for args in (
        ("late", "--kind", "approve", "--param", "message=go on?", "--needs", "measure"),
        ("after", "--kind", "shell", "--needs", "late"),
    ):
        extra = (
            ("--param", f"command=echo after >> {pdir.root / 'trail'}")
            if args[0] == "after"
            else ()
        )
        r = run_orch("todo", "add", plan, *args, *extra)
        assert r.returncode == 0, r.stderr


def test_a_gate_added_to_the_store_is_approved_by_orch_approve(pdir: PlanDir) -> None:
    """The run waits at a gate `orch todo add` (or an agent) added: `orch approve` must
    accept it, as the run's plan has it, and the next run passes it."""
    plan = gated(pdir)
    add_gate(plan, pdir)
    r = run_orch("run", plan, "--approve", "confirm")
    assert r.returncode == 4, r.stdout + r.stderr
    assert board(plan)["late"]["status"] == "waiting"
    r = run_orch("approve", plan, "late", "-m", "ok")
    assert r.returncode == 0, r.stderr
    assert "late approved by" in r.stdout
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(trail(pdir)) == ["after", "stop"]
    assert [(a["task_id"], a["how"]) for a in approvals(pdir)] == [
        ("confirm", "orch run --approve"),
        ("late", "orch approve"),
    ]


def test_an_added_gate_is_accepted_by_run_approve_and_suggested_for_a_typo(
    pdir: PlanDir,
) -> None:
    plan = gated(pdir)
    add_gate(plan, pdir)
    for command in (("approve", plan, "lates"), ("run", plan, "--approve", "lates")):
        r = run_orch(*command)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "'lates' is not an approval gate" in r.stderr
        assert "did you mean 'late'" in r.stderr and "(gates: confirm, late)" in r.stderr
    r = run_orch("run", plan, "--approve", "confirm", "--approve", "late")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(trail(pdir)) == ["after", "stop"]


def test_a_gate_is_judged_by_its_latest_approval_only(pdir: PlanDir) -> None:
    """An earlier approval that would hold does not pass the gate when a later one is void:
    the latest replaces it (the store hands only that one to approvals.judge)."""
    plan = gated(pdir)
    assert run_orch("run", plan).returncode == 4
    assert run_orch("approve", plan, "confirm").returncode == 0  # holds for this plan
    store = Store.open(pdir.store_path())
    try:
        store.approve("confirm", "p2", None, "another plan", "other findings", "test")
        latest = store.latest_approval("confirm")
        assert latest is not None and latest["by"] == "p2"
        assert store.latest_approval("measure") is None
    finally:
        store.close()
    r = run_orch("run", plan)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "the plan changed since" in board(plan)["confirm"]["reason"]


def test_a_mistyped_gate_id_changes_nothing_in_an_existing_store(pdir: PlanDir) -> None:
    """`orch approve PLAN TYPO` is refused before the store is opened for writing: its bytes
    stay as they were and its runs folder, removed, is not made again."""
    plan = gated(pdir)
    assert run_orch("run", plan).returncode == 4
    store_path = pdir.store_path()
    shutil.rmtree(runs_dir(store_path))
    before = store_path.read_bytes()
    r = run_orch("approve", plan, "confirn")
    assert r.returncode == 2 and "did you mean 'confirm'" in r.stderr, r.stderr
    assert store_path.read_bytes() == before
    assert not runs_dir(store_path).exists()


def test_a_gate_resolves_its_params_once_a_visit(
    pdir: PlanDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting or passing, a gate's params (its `show` findings) are resolved once: the
    approval check's resolution is what its attempt runs with."""
    plan = gated(pdir)
    real = Checks.resolve_params
    resolved: list[dict[str, object]] = []

    def counted(self: Checks, cls: type, params: dict[str, object]) -> dict[str, object]:
        out = real(self, cls, params)
        if "message" in params:  # the gate's
            resolved.append(out)
        return out

    monkeypatch.setattr(Checks, "resolve_params", counted)
    for approve, outcome in (((), "waiting"), (("confirm",), "completed")):
        resolved.clear()
        options = executor.RunOptions(approve=approve, console_level="critical")
        result = executor.execute(load_plan(plan), pdir.store_path(), options)
        assert result.outcome == outcome
        assert resolved == [{"message": "stop the production vLLM?", "show": {"base_tok_s": 980}}]
    assert trail(pdir) == ["stop"]
    found = {f["key"]: f["value"] for f in board(plan)["confirm"]["findings"]}  # type: ignore[attr-defined]
    assert found["base_tok_s"] == 980
