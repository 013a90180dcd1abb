"""What `orch run` does with each task: selection, when, preconditions, retries, findings."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from conftest import PlanDir, run_orch

HERE = Path(__file__).parent
ENV = {"PYTHONPATH": str(HERE)}


def test_retries_until_success(pdir: PlanDir) -> None:
    """A task with retries fails twice then succeeds: completed, 3 attempts, each logged."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: flaky
            kind: shell
            retries: {{attempts: 3, delay: 100ms}}
            params:
              command: "echo x >> {pdir.root}/n; [ $(wc -l < {pdir.root}/n) -ge 3 ]"
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.todo("flaky")["attempts"] == 3
    assert pdir.transitions("flaky")[1:] == [
        ("pending", "in_progress"),
        ("in_progress", "failed"),
        ("failed", "in_progress"),
        ("in_progress", "failed"),
        ("failed", "in_progress"),
        ("in_progress", "completed"),
    ]


def test_a_timeout_under_a_second_is_told_in_milliseconds(pdir: PlanDir) -> None:
    """A shell task with `timeout: 0.2` fails saying how long it ran, `timed out after 2xxms`,
    not `after 0s`; a python task's message: test_plan.py."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: slow, kind: shell, timeout: 0.2, params: {command: "sleep 30"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    error = pdir.todo("slow")["last_error"]
    assert error == "timed out after 200ms; its processes ended"  # its timeout, not less


FORK_PLAN = """
    name: t
    tasks:
      - {{id: bad, kind: shell, params: {{command: "exit 1"}}}}
      - {{id: after_bad, kind: shell, needs: [bad], params: {{command: "true"}}}}
      - {{id: indep, kind: shell, params: {{command: "touch {root}/indep"}}}}
"""


def test_failure_stops_new_work_by_default(pdir: PlanDir) -> None:
    """After a failure nothing new starts; dependents are blocked, others stay pending."""
    plan = pdir.write(FORK_PLAN.format(root=pdir.root))
    r = run_orch("run", plan)
    assert r.returncode == 1
    assert pdir.statuses() == {"bad": "failed", "after_bad": "blocked", "indep": "pending"}
    assert "needs bad, which is failed" in pdir.todo("after_bad")["reason"]
    assert not (pdir.root / "indep").exists()


def test_keep_going_runs_independent_tasks(pdir: PlanDir) -> None:
    """--keep-going runs what does not depend on the failure, and still exits 1."""
    plan = pdir.write(FORK_PLAN.format(root=pdir.root))
    r = run_orch("run", plan, "--keep-going")
    assert r.returncode == 1
    assert pdir.statuses() == {"bad": "failed", "after_bad": "blocked", "indep": "completed"}


CHAIN = """
    name: t
    tasks:
      - {{id: a, kind: shell, params: {{command: "echo a >> {root}/log; echo ::finding v={v}"}}}}
      - {{id: b, kind: shell, needs: [a], params: {{command: "echo b >> {root}/log"}}}}
      - {{id: c, kind: shell, needs: [b], params: {{command: "echo c >> {root}/log"}}}}
      - {{id: d, kind: shell, params: {{command: "echo d >> {root}/log"}}}}
"""


def _log(pdir: PlanDir) -> list[str]:
    return (pdir.root / "log").read_text().split()


def test_changed_spec_is_stale_not_rerun_until_asked(pdir: PlanDir) -> None:
    """A completed task whose spec changed is reported stale with the change, and kept."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    assert run_orch("run", plan).returncode == 0
    pdir.write(CHAIN.format(root=pdir.root, v=2))
    r = run_orch("run", plan)
    assert r.returncode == 0
    assert _log(pdir) == ["a", "b", "c", "d"]
    assert "task.stale" in r.stderr and "--rerun a" in r.stderr
    status = run_orch("status", plan)
    assert "stale: params.command:" in status.stdout
    dry = run_orch("plan", plan, "--json")
    steps = {s["id"]: s for s in json.loads(dry.stdout)["steps"]}
    assert steps["a"]["action"] == "stale" and "v=1" in steps["a"]["changed"][0]
    assert steps["b"]["action"] == "skip"


def test_status_of_an_unchanged_plan_answers_from_the_store_and_agrees(pdir: PlanDir) -> None:
    """`orch status PLAN` after a run answers from what the run recorded, without loading the
    plan (one whose kind cannot be imported now still shows), and says what the full path
    says; a plan edit, a forget, or a var from the environment that changed make it load."""
    plan = pdir.write("""
        name: t
        vars: {who: {env: ORCH_TEST_WHO, default: a, secret: false}}
        tasks:
          - {id: g, kind: "helpers_tasks:Greet", params: {name: "${vars.who}"}}
          - {id: d, kind: shell, params: {command: "true"}}
    """)
    assert run_orch("run", plan, env=ENV).returncode == 0
    assert run_orch("run", plan, env={**ENV, "ORCH_TEST_WHO": "b"}).returncode == 0  # stale
    fast = run_orch("status", plan, "--json", env={"ORCH_TEST_WHO": "b"})  # no PYTHONPATH
    assert fast.returncode == 0, fast.stderr
    assert json.loads(fast.stdout)["tasks"][0]["stale"] == ["vars.who: 'a' -> 'b'"]
    full = run_orch("status", plan, "--json", env={**ENV, "ORCH_TEST_WHO": "b"})
    assert json.loads(fast.stdout) == json.loads(full.stdout)
    with pdir.db() as db:  # without the cache the plan is loaded: its kind cannot be imported
        raw = db.execute("SELECT value FROM meta WHERE key='stale_cache'").fetchone()[0]
        db.execute("DELETE FROM meta WHERE key='stale_cache'")
        db.commit()
    r = run_orch("status", plan, env={"ORCH_TEST_WHO": "b"})  # the store's board, and why
    assert r.returncode == 0 and "helpers_tasks" in r.stderr, r.stderr
    assert "staleness could not be computed" in r.stderr

    def loads(who: str) -> bool:  # the plan was loaded (and failed): not answered from the store
        r = run_orch("status", plan, env={"ORCH_TEST_WHO": who})
        assert r.returncode == 0, r.stderr
        return "staleness could not be computed" in r.stderr

    with pdir.db() as db:
        db.execute("INSERT INTO meta VALUES ('stale_cache', ?)", (raw,))
        db.commit()
    assert not loads("b")
    assert loads("c")  # another env
    plan.write_text(plan.read_text() + "# an edit\n")
    assert loads("b")
    plan.write_text(plan.read_text().replace("# an edit\n", ""))
    assert run_orch("forget", plan, "d", env={**ENV, "ORCH_TEST_WHO": "b"}).returncode == 0
    assert loads("b")  # moved on
    for damaged in ("char(0) || value", "'[1]'"):  # a cache that cannot be read is no answer
        with pdir.db() as db:
            db.execute(f"UPDATE meta SET value = {damaged} WHERE key='stale_cache'")
            db.commit()
        assert loads("b")


def test_a_var_from_the_environment_is_part_of_the_finished_plan(pdir: PlanDir) -> None:
    """The same plan bytes with another value of an `env:` var are another plan: the re-run
    does not say "nothing to do", it finds the task stale."""
    plan = pdir.write("""
        name: t
        vars: {v: {env: ORCH_TEST_V, secret: false}}
        tasks:
          - {id: a, kind: shell, params: {command: "echo ${vars.v}"}}
    """)
    assert run_orch("run", plan, env={"ORCH_TEST_V": "1"}).returncode == 0
    r = run_orch("run", plan, env={"ORCH_TEST_V": "2"})
    assert r.returncode == 0 and "nothing to do" not in r.stderr
    assert "vars.v: '1' -> '2'" in r.stderr
    r = run_orch("run", plan, env={"ORCH_TEST_V": "2"})
    assert "nothing to do" not in r.stderr  # a kept stale task: not finished either


def test_rerun_runs_task_and_its_dependents_only(pdir: PlanDir) -> None:
    """--rerun b re-runs b and c (which needs it), not a or d."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    assert run_orch("run", plan).returncode == 0
    assert run_orch("run", plan, "--rerun", "b").returncode == 0
    assert _log(pdir) == ["a", "b", "c", "d", "b", "c"]


def test_only_runs_one_task(pdir: PlanDir) -> None:
    """--only c runs just c when its needs are completed; when they are not, it is refused
    as usage (exit 2) before anything is written, by `orch plan` too: a completed c is not
    turned blocked."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    for command in ("run", "plan"):
        r = run_orch(command, plan, "--only", "c")
        assert r.returncode == 2, r.stderr
        assert "--only: c needs b, which is pending: add --only for what it needs" in r.stderr
    assert not (pdir.root / "log").exists()
    assert set(pdir.statuses().values()) <= {"pending"}  # nothing recorded of it
    assert run_orch("run", plan).returncode == 0
    assert run_orch("run", plan, "--only", "c").returncode == 0
    assert _log(pdir)[-1] == "c" and len(_log(pdir)) == 5
    assert run_orch("forget", plan, "b").returncode == 0
    assert run_orch("run", plan, "--only", "c").returncode == 2
    assert pdir.statuses()["c"] == "completed"  # as it was
    assert run_orch("run", plan, "--only", "b", "--only", "c").returncode == 0
    assert _log(pdir)[-2:] == ["b", "c"]


def test_from_runs_the_rest_of_the_plan(pdir: PlanDir) -> None:
    """--from b re-runs b and every task after it in plan order (c, d)."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    assert run_orch("run", plan).returncode == 0
    assert run_orch("run", plan, "--from", "b").returncode == 0
    assert _log(pdir)[4:] == ["b", "c", "d"]


def test_unknown_task_in_selection_is_usage_error(pdir: PlanDir) -> None:
    """--rerun of a task the plan does not have: exit 2 with the task list, nothing run."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    r = run_orch("run", plan, "--rerun", "zz")
    assert r.returncode == 2
    assert "no task 'zz'" in r.stderr and "a, b, c, d" in r.stderr
    assert not (pdir.root / "log").exists()
    typo = run_orch("plan", plan, "--only", "bb")
    assert typo.returncode == 2 and "(did you mean 'b'?)" in typo.stderr


def test_when_false_skips_and_dependents_still_run(pdir: PlanDir) -> None:
    """`when` evaluated at start from a finding: false skips the task; its dependents run."""
    plan = pdir.write("""
        name: t
        vars: {threshold: 10}
        tasks:
          - {id: probe, kind: shell, params: {command: "echo ::finding rate=3"}}
          - id: tune
            kind: shell
            needs: [probe]
            when: "${tasks.probe.findings.rate} > ${vars.threshold}"
            params: {command: "exit 1"}
          - {id: report, kind: shell, needs: [tune], params: {command: "true"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.statuses() == {"probe": "completed", "tune": "skipped", "report": "completed"}
    assert "is false" in pdir.todo("tune")["reason"]


def test_finding_with_shell_syntax_reaches_the_command_as_data(pdir: PlanDir) -> None:
    """A finding holding shell syntax, passed in the environment, is text to the command: what
    it says is printed, never run."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: evil
            kind: shell
            params: {{command: "echo \\"::finding name='x; touch {pdir.root}/pwned'\\""}}
          - id: use
            kind: shell
            needs: [evil]
            params:
              command: "printf '%s\\\\n' $NAME \\"$NAME\\" > {pdir.root}/out"
              env: {{NAME: "${{tasks.evil.findings.name}}"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr + r.stdout
    assert not (pdir.root / "pwned").exists()
    said = f"x; touch {pdir.root}/pwned"
    assert (pdir.root / "out").read_text() == "\n".join([*said.split(), said]) + "\n"


def test_missing_finding_fails_the_task_clearly(pdir: PlanDir) -> None:
    """A ${tasks.X.findings.K} that X never recorded fails the task, naming what X has."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "echo ::finding speed=3"}}
          - id: b
            kind: shell
            needs: [a]
            params: {command: "true", env: {S: "${tasks.a.findings.sped}"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1
    err = pdir.todo("b")["last_error"]
    assert "recorded no finding 'sped'" in err and "speed" in err


def test_python_task_findings_and_user_errors(pdir: PlanDir) -> None:
    """`python` tasks record ctx findings and returned dicts; an exception fails the task."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: m
            kind: python
            params: {function: "helpers_tasks:measure", args: {tokens: 100}}
          - id: greet
            kind: helpers_tasks:Greet
            params: {name: orch}
          - {id: crash, kind: python, needs: [m], params: {function: "helpers_tasks:boom"}}
    """)
    r = run_orch("run", plan, "--json", env=ENV)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    tasks = {t["id"]: t for t in doc["tasks"]}
    assert {f["key"]: f["value"] for f in tasks["m"]["findings"]} == {
        "accept_rate": 0.42,
        "tokens": 100,
        "throughput": 50.0,
    }
    assert tasks["m"]["findings"][0] == {
        "key": "accept_rate",
        "value": 0.42,
        "unit": "ratio",
        "note": "no speedup",
        "author": None,  # recorded by the task's own attempt
    }
    assert tasks["greet"]["findings"][0]["value"] == "hello orch"
    assert tasks["crash"]["status"] == "failed"
    assert tasks["crash"]["last_error"] == "RuntimeError: kaboom in user code"
    log = run_orch("logs", plan, "crash")
    assert "Traceback" in log.stdout and "kaboom" in log.stdout


def test_precondition_blocks_with_what_was_found(pdir: PlanDir) -> None:
    """A failing precondition blocks the task with the check's own words; nothing runs."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions:
              - {{kind: command, command: "echo 'disk full on /models'; false"}}
            params: {{command: "touch {pdir.root}/ran"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1
    row = pdir.todo("a")
    assert row["status"] == "blocked"
    assert "disk full on /models" in row["reason"]
    assert not (pdir.root / "ran").exists()


def test_precondition_wait_polls_until_it_holds(pdir: PlanDir) -> None:
    """`wait:` polls the precondition; the task runs once the condition becomes true."""
    flag = pdir.root / "ready"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions:
              - {{kind: command, command: "test -e {flag}", wait: 20s, every: 100ms}}
            params: {{command: "true"}}
    """)
    timer = threading.Timer(1.0, flag.touch)
    timer.start()
    started = time.monotonic()
    r = run_orch("run", plan)
    timer.join()
    assert r.returncode == 0, r.stderr
    assert 0.9 < time.monotonic() - started < 15


def test_status_json_schema_and_todowrite(pdir: PlanDir) -> None:
    """`status --json` follows orch.status/v1; `--format todowrite` has exactly its keys."""
    plan = pdir.write(FORK_PLAN.format(root=pdir.root))
    run_orch("run", plan)
    doc = json.loads(run_orch("status", plan, "--json").stdout)
    assert doc["schema"] == "orch.status/v1"
    assert doc["summary"]["failed"] == 1 and doc["summary"]["total"] == 3
    assert set(doc["tasks"][0]) == {
        "id",
        "title",
        "priority",
        "kind",
        "origin",
        "status",
        "reason",
        "attempts",
        "run_attempts",
        "started_at",
        "ended_at",
        "duration_s",
        "last_error",
        "output_tail",
        "log_path",
        "stale",
        "role",
        "protects",
        "armed_run",
        "findings",
    }
    todo = json.loads(run_orch("status", plan, "--format", "todowrite").stdout)
    assert set(todo) == {"todos"}
    assert all(set(t) == {"content", "status", "priority"} for t in todo["todos"])
    assert {t["status"] for t in todo["todos"]} <= {
        "pending",
        "in_progress",
        "completed",
        "cancelled",
    }


def test_status_finds_the_single_store_without_arguments(pdir: PlanDir) -> None:
    """`orch status` with no PLAN uses the one .orch/*.db here; none found is exit 2."""
    assert run_orch("status", cwd=pdir.root).returncode == 2
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    run_orch("run", plan)
    r = run_orch("status", cwd=pdir.root)
    assert r.returncode == 0 and "4 tasks: 4 completed" in r.stdout


def test_store_of_another_plan_is_refused(pdir: PlanDir) -> None:
    """Pointing a plan at another plan's store is an error, not a silent mix."""
    a = pdir.write(CHAIN.format(root=pdir.root, v=1))
    b = pdir.write(
        "name: other\ntasks: [{id: x, kind: shell, params: {command: 'true'}}]\n", "b.yaml"
    )
    assert run_orch("run", a).returncode == 0
    r = run_orch("run", b, "--store", pdir.store_path())
    assert r.returncode == 2 and "holds plan 't'" in r.stderr


def test_argv_command_items_are_not_shell_quoted(pdir: PlanDir) -> None:
    """In an argv list no shell is involved: a var with spaces arrives as one plain argument."""
    plan = pdir.write(f"""
        name: t
        vars: {{msg: "a b  $(c)"}}
        tasks:
          - id: a
            kind: shell
            params:
              command:
                - python3
                - -c
                - "import sys; open('{pdir.root}/o', 'w').write(sys.argv[1])"
                - "${{vars.msg}}"
    """)
    assert run_orch("run", plan).returncode == 0
    assert (pdir.root / "o").read_text() == "a b  $(c)"


def test_crashing_precondition_blocks_its_task_only(pdir: PlanDir) -> None:
    """A bug in a precondition blocks that task with the error; the run ends cleanly (exit 1)."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions: [{kind: "helpers_tasks:BrokenCheck"}]
            params: {command: "true"}
    """)
    r = run_orch("run", plan, env=ENV)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "crashed: ZeroDivisionError: division by zero" in pdir.todo("a")["reason"]


def test_findings_may_use_any_name(pdir: PlanDir) -> None:
    """Findings named like the log's own fields (task, took, event) are recorded, no crash."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            params:
              command: "echo ::finding task=1; echo ::finding took=2; echo ::finding event=3"
    """)
    r = run_orch("run", plan, "--json")
    assert r.returncode == 0, r.stderr
    assert [f["key"] for f in json.loads(r.stdout)["tasks"][0]["findings"]] == [
        "task",
        "took",
        "event",
    ]


def test_rerun_of_finished_unchanged_plan_takes_the_fast_path(pdir: PlanDir) -> None:
    """A finished, byte-identical plan is answered from the store: no new run, nothing runs;
    an edit or another --var takes the full path again."""
    plan = pdir.write(CHAIN.format(root=pdir.root, v=1))
    assert run_orch("run", plan).returncode == 0
    r = run_orch("run", plan)
    assert r.returncode == 0 and "nothing to do" in r.stderr
    assert "4 tasks: 4 completed" in r.stdout
    with pdir.db() as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    plan.write_text(plan.read_text() + "\n# a comment changes the bytes\n")
    r = run_orch("run", plan)
    assert r.returncode == 0 and "nothing to do" not in r.stderr
    assert _log(pdir) == ["a", "b", "c", "d"]
    with pdir.db() as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_fast_path_is_not_taken_after_a_failure(pdir: PlanDir) -> None:
    """A plan with a failed task is never 'finished': the next run retries it."""
    plan = pdir.write(FORK_PLAN.format(root=pdir.root))
    assert run_orch("run", plan).returncode == 1
    r = run_orch("run", plan)
    assert r.returncode == 1 and "nothing to do" not in r.stderr


def test_finding_line_forms() -> None:
    """`::finding` lines: numbers stay numbers, quoted or unquoted notes, unit anywhere."""
    from orchestrator.core.findings import Finding, parse_finding_line

    assert parse_finding_line("::finding tok_s=63.6 unit=tok/s note=single stream") == Finding(
        "tok_s", 63.6, "tok/s", "single stream"
    )
    assert parse_finding_line("::finding n=42 note='accept ~42%, no speedup' unit=%") == Finding(
        "n", 42, "%", "accept ~42%, no speedup"
    )
    assert parse_finding_line("::finding version=0.5.23") == Finding("version", "0.5.23")
    assert parse_finding_line("finding x=1") is None
    assert parse_finding_line("::finding novalue") is None


def test_boolean_findings_stay_booleans(pdir: PlanDir) -> None:
    """A finding true/false comes back as a JSON boolean, not 1/0, and shows as true."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: python, params: {function: "helpers_tasks:flags"}}
    """)
    r = run_orch("run", plan, "--json", env=ENV)
    assert r.returncode == 0, r.stderr
    values = {f["key"]: f["value"] for f in json.loads(r.stdout)["tasks"][0]["findings"]}
    assert values == {"changed": True, "cached": False, "count": 1}
    assert "changed=true" in run_orch("status", plan).stdout


def test_success_on_retry_does_not_stop_the_run(pdir: PlanDir) -> None:
    """A task that fails once then passes lets its dependents run; the run exits 0."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: flaky
            kind: shell
            retries: {{attempts: 2, delay: 10ms}}
            params: {{command: "echo x >> {pdir.root}/n; [ $(wc -l < {pdir.root}/n) -ge 2 ]"}}
          - {{id: after, kind: shell, needs: [flaky], params: {{command: "true"}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.statuses() == {"flaky": "completed", "after": "completed"}
    # The first failure is an attempt's, not the task's: a warning, then the retry.
    assert "task.attempt_failed" in r.stderr and "task.failed" not in r.stderr
    assert r.stderr.index("task.attempt_failed") < r.stderr.index("task.retry")
    assert "findings=None" not in r.stderr  # a task without findings logs no findings field


def test_odd_finding_values_are_kept_as_text_not_corrupted(pdir: PlanDir) -> None:
    """Values that would not survive as numbers stay text; a huge integer does not crash."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            params:
              command: >-
                echo ::finding cuda=12.10; echo ::finding sha=1e51234;
                echo ::finding big=99999999999999999999; echo ::finding n=7
    """)
    r = run_orch("run", plan, "--json")
    assert r.returncode == 0, r.stderr
    values = {f["key"]: f["value"] for f in json.loads(r.stdout)["tasks"][0]["findings"]}
    assert values == {"cuda": "12.10", "sha": "1e51234", "big": "99999999999999999999", "n": 7}


def test_argv_items_written_as_numbers_are_their_text(pdir: PlanDir) -> None:
    """`command: [sleep, 0.1]`: YAML reads 0.1 as a number; an argv item is text (the `Argv`
    params type that server.launch's argv lists use too)."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: [sleep, 0.1]}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.statuses() == {"a": "completed"}


def test_the_readmes_demo_plan_completes_and_resumes(tmp_path: Path) -> None:
    """plans/demo.yaml is the README's run command: it must do its job, then have nothing to do."""
    demo = Path(__file__).resolve().parent.parent / "plans" / "demo.yaml"
    args = ("run", demo, "--store", tmp_path / "demo.db", "--var", f"workdir={tmp_path / 'w'}")
    first = run_orch(*args)
    assert first.returncode == 0, first.stderr
    status = json.loads(run_orch("status", "--store", tmp_path / "demo.db", "--json").stdout)
    assert {t["status"] for t in status["tasks"]} == {"completed"}
    found = {t["id"]: {f["key"]: f["value"] for f in t["findings"]} for t in status["tasks"]}
    assert found["write_data"]["size"] == 8 * 1024 * 1024
    assert found["measure"]["read_mb_s"] > 0
    again = run_orch(*args)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr


def test_tasks_run_from_the_plans_folder_wherever_orch_starts(tmp_path: Path) -> None:
    """A relative path in a command, a relative cwd and a module:function all start at the
    plan's folder, not at the directory orch was started from."""
    home = tmp_path / "runbook"
    (home / "data").mkdir(parents=True)
    (home / "notes.txt").write_text("from the plan's folder\n")
    (home / "data" / "x.txt").write_text("x\n")
    (home / "helpers_here.py").write_text("def where():\n    import os\n    return os.getcwd()\n")
    (home / "plan.yaml").write_text("""name: t
tasks:
  - {id: cat, kind: shell, params: {command: "cat notes.txt"}}
  - {id: sub, kind: shell, params: {command: "cat x.txt", cwd: data}}
  - {id: py, kind: python, params: {function: "helpers_here:where"}}
""")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_orch("run", home / "plan.yaml", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    status = json.loads(run_orch("status", home / "plan.yaml", "--json", cwd=elsewhere).stdout)
    found = {t["id"]: {f["key"]: f["value"] for f in t["findings"]} for t in status["tasks"]}
    assert found["py"]["result"] == str(home)
    assert run_orch("logs", home / "plan.yaml", "cat", cwd=elsewhere).stdout.endswith(
        "from the plan's folder\n"
    )
    assert not (elsewhere / ".orch").exists()  # the store lives beside the plan
