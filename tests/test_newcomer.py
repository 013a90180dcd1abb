"""The rough edges a new user met (issue "A board that never shows a result built on superseded
inputs"): each through the real `orch`, as that user typed it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import ORCH, PlanDir, run_orch

ROOT = Path(__file__).resolve().parent.parent


def test_a_shell_script_whose_middle_command_fails_fails(pdir: PlanDir) -> None:
    """`bash -eo pipefail`, as GitHub Actions runs a bash step: the `echo` after a failing
    `false` does not make the task complete."""
    plan = pdir.write(
        """
        name: t
        tasks:
          - id: a
            kind: shell
            params:
              command: |
                false
                echo ::finding reached=yes
        """
    )
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    assert pdir.statuses() == {"a": "failed"}
    with pdir.db() as db:
        assert db.execute("SELECT count(*) FROM findings").fetchone()[0] == 0


def test_a_command_reads_no_bashrc_when_orch_runs_over_ssh(pdir: PlanDir) -> None:
    """bash started with SSH_CLIENT set and SHLVL unset (orch on a fleet host) reads ~/.bashrc
    unless told not to: a task's PATH and time would depend on how orch was started. Neither
    a `shell` task nor a `command` precondition runs it."""
    home = pdir.root / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export FROM_BASHRC=sourced\n")
    plan = pdir.write(
        """
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions:
              - {kind: command, command: 'test -z "$FROM_BASHRC"'}
            params:
              command: 'echo "::finding rc=x$FROM_BASHRC"'
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SHLVL", "BASH_ENV")}
    env |= {"HOME": str(home), "SSH_CLIENT": "10.0.0.1 50000 22", "NO_COLOR": "1"}
    r = subprocess.run([ORCH, "run", str(plan)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    with pdir.db() as db:
        assert db.execute("SELECT value FROM findings WHERE key = 'rc'").fetchone()[0] == "x"


def test_a_var_takes_the_type_of_its_plan_value(pdir: PlanDir) -> None:
    plan = pdir.write(
        """
        name: t
        vars: {size_mb: 8, ratio: 0.5, dry: false, tag: v1, token: {env: NO_SUCH_VAR_X, default: 3}}
        tasks:
          - {id: a, kind: shell, params: {command: "echo ${vars.tag}"}}
        """
    )
    for var, why in [
        ("size_mb=abc", "--var size_mb=abc: this var is a whole number (the plan's value is 8)"),
        ("size_mb=8.5", "this var is a whole number"),
        ("ratio=x", "--var ratio=x: this var is a number (the plan's value is 0.5)"),
        ("dry=1", "this var is true or false"),
        ("token=abc", "--var token=***: this var is a whole number (the plan's value is ***)"),
    ]:
        r = run_orch("validate", plan, "--var", var)
        assert r.returncode == 2 and why in r.stderr, (var, r.stderr)
        assert "Traceback" not in r.stderr
    for var in ("size_mb=16", "ratio=2", "dry=true", "tag=123"):
        r = run_orch("validate", plan, "--var", var)
        assert r.returncode == 0, (var, r.stderr)


def test_the_board_counts_tries_of_the_latest_run_and_says_when_tasks_were_reset(
    pdir: PlanDir,
) -> None:
    flag = pdir.root / "ok"
    plan = pdir.write(
        f"""
        name: t
        tasks:
          - id: a
            kind: shell
            retries: {{attempts: 2, delay: 0s}}
            params: {{command: "test -e {flag}"}}
        """
    )
    for _ in range(3):
        assert run_orch("run", plan).returncode == 1
    doc = json.loads(run_orch("status", plan, "--json").stdout)
    (task,) = doc["tasks"]
    assert (task["attempts"], task["run_attempts"]) == (6, 2)
    board = run_orch("status", plan).stdout
    assert " 2× " in board and "6×" not in board
    flag.touch()
    assert run_orch("run", plan).returncode == 0
    assert "×" not in run_orch("status", plan).stdout  # one try in the latest run
    assert run_orch("reset", plan, "--yes").returncode == 0
    head = run_orch("status", plan).stdout.splitlines()[0]
    assert "run #4 completed" in head and ", then 1 task forgotten" in head


def test_a_skipped_task_whose_when_changed_is_shown_stale_not_with_its_old_reason(
    pdir: PlanDir,
) -> None:
    plan = pdir.write(
        """
        name: t
        vars: {check: false}
        tasks:
          - {id: verify, kind: shell, when: "${vars.check}", params: {command: "true"}}
        """
    )
    assert run_orch("run", plan).returncode == 0
    assert "when '${vars.check}' is false" in run_orch("status", plan).stdout
    r = run_orch("run", plan, "--var", "check=true")
    assert r.returncode == 0
    board = run_orch("status", plan, "--var", "check=true").stdout
    assert "stale:" in board and "is false" not in board, board


def test_approve_says_so_on_the_board_and_in_json(pdir: PlanDir) -> None:
    plan = pdir.write(
        """
        name: t
        tasks:
          - {id: gate, kind: approve, params: {message: "go?"}}
          - {id: after, kind: shell, needs: [gate], params: {command: "true"}}
        """
    )
    assert run_orch("run", plan).returncode == 4
    r = run_orch("approve", plan, "gate", "--json", "-m", "window")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["task"] == "gate" and doc["note"] == "window" and doc["findings_hash"]
    line = next(ln for ln in run_orch("status", plan).stdout.splitlines() if " gate " in ln)
    assert "approved by" in line and "the next `orch run` passes it" in line


def test_json_of_a_bad_plan_is_json_on_stdout_for_every_command(pdir: PlanDir) -> None:
    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shel}\n")
    for command in ("run", "validate", "plan", "status"):
        r = run_orch(command, plan, "--json")
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["ok"] is False
        assert doc["problems"][0]["line"] == 3 and "shel" in doc["problems"][0]["message"]
    r = run_orch("run", pdir.root / "nope.yaml", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["problems"][0]["line"] is None


def test_a_misnamed_plan_file_gets_a_did_you_mean_and_a_tab_is_named(pdir: PlanDir) -> None:
    pdir.write("name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    r = run_orch("run", pdir.root / "plan.yml")
    assert r.returncode == 2 and f"did you mean {pdir.root / 'plan.yaml'}?" in r.stderr
    tab = pdir.write("name: t\ntasks:\n\t- {id: a, kind: shell}\n", "tab.yaml")
    r = run_orch("validate", tab)
    assert r.returncode == 2 and f"{tab}:3:" in r.stderr and "a tab" in r.stderr


def test_an_unknown_var_is_reported_in_a_task_whose_id_is_bad_too(pdir: PlanDir) -> None:
    plan = pdir.write(
        """
        name: t
        vars: {n: 1}
        tasks:
          - {kind: shell, params: {command: "echo ${vars.nn}"}}
          - {id: "bad id", kind: shell, params: {command: "echo ${vars.nm}"}}
        """
    )
    r = run_orch("validate", plan)
    assert r.returncode == 2
    assert "no var 'nn'" in r.stderr and "no var 'nm'" in r.stderr and "4 problems" in r.stderr
