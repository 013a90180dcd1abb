"""Secret vars: their values never reach the store, lock, run log, events, history or board."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import PlanDir, run_orch

TOKEN = "hf_s3cretT0ken_9f2c"  # an inert word: it may be spliced into a command
ROTATED = "hf_r0tated_77aa"

PLAN = """\
    name: t
    vars:
      token: {env: ORCH_TEST_TOKEN}
      password: {default: hunter2-long, secret: true}
      region: {env: ORCH_TEST_REGION, default: eu, secret: false}
    tasks:
      - id: use
        kind: shell
        params:
          command: "echo region=${vars.region}; echo token=$TOKEN; test ${vars.token} = x"
          env: {TOKEN: "${vars.token}"}
      - id: after
        kind: shell
        needs: [use]
        params: {command: "true"}
"""


def everything_orch_wrote(pdir: PlanDir) -> str:
    """The store's every value (all tables) and every other file orch wrote, as one text.

    A task's own output in its log is the task's, not orch's (see orchestrator/redact.py): the
    `$ command` line is orch's and is included."""
    with sqlite3.connect(pdir.store_path()) as conn:
        dump = "\n".join(conn.iterdump())
    texts = [dump]
    for path in pdir.root.rglob("*"):
        if not path.is_file() or path.suffix in (".db", ".db-wal", ".db-shm", ".yaml"):
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".log":
            text = "\n".join(line for line in text.splitlines() if line.startswith("$ "))
        texts.append(text)
    return "\n".join(texts)


def test_secret_values_are_masked_everywhere_orch_writes(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    env = {"ORCH_TEST_TOKEN": TOKEN}
    r = run_orch("run", plan, "--var", "password=hunter2-cli", cwd=pdir.root, env=env)
    assert r.returncode == 1, r.stderr  # `test TOKEN = x` fails: the error quotes the command
    outputs = [r.stdout, r.stderr]
    for args in (
        ("status", plan),
        ("status", plan, "--json"),
        ("history", plan),
        ("history", plan, "--json"),
        ("logs", plan, "use"),
    ):
        shown = run_orch(*args, cwd=pdir.root, env=env)
        assert shown.returncode in (0, 1), shown.stderr
        outputs += [shown.stdout, shown.stderr]
    written = everything_orch_wrote(pdir) + "\n".join(outputs[:-2])  # logs: the task's output
    for secret in (TOKEN, "hunter2-cli"):
        assert secret not in written
    assert "***" in pdir.todo("use")["last_error"] + (pdir.todo("use")["output_tail"] or "")
    assert "region=eu" in (pdir.todo("use")["output_tail"] or "")  # not secret: shown


def test_a_rotated_secret_re_runs_nothing(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN.replace("test ${vars.token} = x", "test -n ${vars.token}"))
    assert run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN}).returncode == 0
    r = run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": ROTATED})
    assert r.returncode == 0, r.stderr
    assert pdir.todo("use")["attempts"] == 1  # the secret is not part of the task's identity


@pytest.mark.parametrize(
    ("var", "message"),
    [
        (
            "token: {env: ORCH_TEST_UNSET_VAR}",
            "environment variable ORCH_TEST_UNSET_VAR is not set",
        ),
        ("token: {secret: true}", "a secret var needs a `default` or an `env`"),
        ("token: {env: X, secret: maybe}", "`secret` is true or false"),
    ],
)
def test_bad_secret_declarations_are_plan_errors(pdir: PlanDir, var: str, message: str) -> None:
    plan = pdir.write(
        f"name: t\nvars:\n  {var}\ntasks:\n  - {{id: a, kind: shell, "
        "params: {command: 'true'}}\n"
    )
    r = run_orch("validate", plan, cwd=pdir.root)
    assert r.returncode == 2 and message in r.stderr and "plan.yaml:3" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_mapping_var_that_is_not_a_declaration_stays_a_value(pdir: PlanDir) -> None:
    plan = pdir.write(
        "name: t\nvars:\n  limits: {env: prod, cpu: 4}\ntasks:\n"
        "  - {id: a, kind: shell, params: {command: 'true'}}\n"
    )
    assert run_orch("run", plan, cwd=pdir.root).returncode == 0
    shown = json.loads(run_orch("status", plan, "--json", cwd=pdir.root).stdout)
    assert shown["tasks"][0]["status"] == "completed"


def test_events_file_is_masked(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    run_orch("run", plan, cwd=pdir.root, env={"ORCH_TEST_TOKEN": TOKEN})
    events = list(pdir.root.rglob("events.jsonl"))
    assert events and all(TOKEN not in e.read_text() for e in events)
    assert any("***" in e.read_text() for e in events)
