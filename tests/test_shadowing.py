"""A user's files never hide orch's own modules, and orch's never hide the user's.

orch's task library is the top-level packages `tasks` and `probes`; a `tasks.py` or `probes.py`
beside a plan or in the working directory once made every kind of the library fail to load
("'tasks' is not a package"). A user's `module:Class` and `module:function` come from the plan's
folder under a private package (orchestrator/kinds/registry.py), so both worlds load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import yaml

from orchestrator.kinds import registry

from conftest import run_orch

ROOT = Path(__file__).resolve().parent.parent

# Imported as orch's own, either fails loudly: orch must never import them.
IMPOSTORS = {
    "tasks.py": "raise RuntimeError('the tasks.py beside the plan was imported as orch\\'s')\n",
    "probes.py": "raise RuntimeError('the probes.py beside the plan was imported as orch\\'s')\n",
}

# Every kind orch has, with params valid at `orch validate` (which touches nothing on the host).
EVERY_KIND = """
name: t
tasks:
  - id: sh
    kind: shell
    params: {command: "true"}
    preconditions:
      - {kind: command, command: "true"}
      - {kind: systemd.unit, unit: orch-none.service, state: inactive}
      - {kind: gpu.free, gpus: all}
      - {kind: gpu.count, at_least: 1}
      - {kind: port.free, port: 1}
      - {kind: disk.free, path: ., min_free: 1KiB}
      - {kind: python.package, package: pip}
  - {id: py, kind: python, params: {function: "json:dumps", args: {obj: 1}}}
  - {id: ok, kind: approve, params: {message: "go on"}}
  - {id: stop, kind: systemd.stop, params: {unit: orch-none.service}}
  - {id: start, kind: systemd.start, params: {unit: orch-none.service}}
  - {id: restart, kind: systemd.restart, params: {unit: orch-none.service}}
  - {id: wait, kind: gpu.wait_free, params: {gpus: all, timeout: 1}}
  - {id: install, kind: python.install, params: {requirement: pip, venv: venv, create: false}}
  - {id: launch, kind: server.launch, params: {flavour: command, command: [sleep, "1"], port: 1}}
  - {id: bench, kind: bench.serve, needs: [launch], params: {server: launch, concurrency: [1]}}
  - {id: down, kind: server.stop, needs: [bench], params: {server: launch}}
  - {id: pstop, kind: process.stop, params: {port: 1}}
  - id: compare
    kind: analyze.compare
    needs: [bench]
    params:
      baseline: "${tasks.bench.findings.result}"
      candidates: {same: "${tasks.bench.findings.result}"}
"""


def _every_kind() -> tuple[set[str], set[str]]:
    """The task and precondition kinds orch registers: built-ins and pyproject's entry points."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    return (
        {*registry._BUILTINS[registry.TASK_GROUP], *project[registry.TASK_GROUP]},
        {*registry._BUILTINS[registry.PRECONDITION_GROUP], *project[registry.PRECONDITION_GROUP]},
    )


def test_the_plan_uses_every_kind() -> None:
    """A kind added to orch must be added to EVERY_KIND, or the tests below miss it."""
    tasks = yaml.safe_load(EVERY_KIND)["tasks"]
    used = {t["kind"] for t in tasks}
    checks = {c["kind"] for t in tasks for c in t.get("preconditions", [])}
    assert (used, checks) == _every_kind()


def _impostors(folder: Path) -> None:
    for name, text in IMPOSTORS.items():
        (folder / name).write_text(text)


def _validates_and_plans(plan: Path, cwd: Path) -> None:
    done = run_orch("validate", plan, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert "ok, plan 't' with 13 tasks" in done.stdout
    dry = run_orch("plan", plan, "--json", cwd=cwd)
    assert dry.returncode == 0, dry.stderr
    steps = [s["id"] for s in json.loads(dry.stdout)["steps"]]
    assert {"sh", "wait", "launch", "bench", "compare"} <= set(steps), steps
    assert "the tasks.py" not in dry.stderr + dry.stdout
    assert "the probes.py" not in dry.stderr + dry.stdout


def test_tasks_py_and_probes_py_beside_the_plan_hide_no_kind(tmp_path: Path) -> None:
    """Every built-in and library kind loads with a tasks.py and a probes.py beside the plan
    (they are not imported at all): `orch validate` and `orch plan` from anywhere."""
    plans = tmp_path / "plans"
    plans.mkdir()
    _impostors(plans)
    plan = plans / "plan.yaml"
    plan.write_text(EVERY_KIND)
    _validates_and_plans(plan, cwd=plans)
    _validates_and_plans(plan, cwd=tmp_path)


def test_tasks_py_in_the_working_directory_hides_no_kind(tmp_path: Path) -> None:
    """The same with them in the working directory, the plan elsewhere; and with the plan there
    too, started as `python -m orchestrator`, where Python itself puts the working directory
    first on sys.path."""
    _impostors(tmp_path)
    (tmp_path / "plans").mkdir()
    plan = tmp_path / "plans" / "plan.yaml"
    plan.write_text(EVERY_KIND)
    _validates_and_plans(plan, cwd=tmp_path)
    here = tmp_path / "plan.yaml"
    here.write_text(EVERY_KIND)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "plan.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_a_user_s_tasks_module_and_orch_s_tasks_package_both_load_and_run(
    tmp_path: Path,
) -> None:
    """`kind: tasks:MyTask` from the tasks.py beside the plan, in the same plan as
    `gpu.wait_free` from orch's `tasks` package: both resolve, and the user's task runs (and
    imports orch's `tasks.host.gpus` as orch's), wherever orch is started."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "tasks.py").write_text(
        textwrap.dedent("""
            import orchestrator


            class MyTask(orchestrator.Task[orchestrator.NoParams]):
                Params = orchestrator.NoParams

                def run(self, ctx: orchestrator.Context) -> None:
                    from tasks.host.gpus import GpuWaitFree  # orch's, not this file

                    ctx.finding("module", __name__)
                    ctx.finding("orch_kind", GpuWaitFree.__module__)
                    ctx.finding("wanted", False)
        """)
    )
    plan = plans / "plan.yaml"
    plan.write_text(
        textwrap.dedent("""
            name: t
            tasks:
              - {id: mine, kind: "tasks:MyTask"}
              - id: wait
                kind: gpu.wait_free
                needs: [mine]
                when: "${tasks.mine.findings.wanted}"  # resolved and checked, not run
                params: {timeout: 1}
                preconditions: [{kind: gpu.count, at_least: 1}]
        """)
    )
    done = run_orch("run", plan, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    status = run_orch("status", plan, "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    tasks = {t["id"]: t for t in json.loads(status.stdout)["tasks"]}
    assert tasks["mine"]["status"] == "completed"
    assert tasks["wait"]["status"] == "skipped"
    found = {f["key"]: f["value"] for f in tasks["mine"]["findings"]}
    assert found["module"].startswith("orch_plan_") and found["module"].endswith(".tasks")
    assert found["orch_kind"] == "tasks.host.gpus"


def test_a_python_function_beside_the_plan_imports_its_sibling(tmp_path: Path) -> None:
    """`helpers:func` where helpers.py imports a sibling of the plan's folder by its plain
    name: the sibling is found (as one module, not two copies), wherever orch is started."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "shadowing_sibling.py").write_text("VALUE = 41\n")
    (plans / "helpers.py").write_text(
        textwrap.dedent("""
            import sys

            import shadowing_sibling


            def func(add: int) -> dict[str, object]:
                own = sys.modules[__package__ + ".shadowing_sibling"]
                return {"value": shadowing_sibling.VALUE + add, "one": own is shadowing_sibling}
        """)
    )
    _impostors(plans)
    plan = plans / "plan.yaml"
    plan.write_text(
        textwrap.dedent("""
            name: t
            tasks:
              - {id: f, kind: python, params: {function: "helpers:func", args: {add: 1}}}
              - {id: w, kind: gpu.wait_free, when: "false", params: {timeout: 1}}
        """)
    )
    done = run_orch("run", plan, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    status = run_orch("status", plan, "--json", cwd=tmp_path)
    task = next(t for t in json.loads(status.stdout)["tasks"] if t["id"] == "f")
    assert task["status"] == "completed", task
    assert {f["key"]: f["value"] for f in task["findings"]} == {"value": 42, "one": True}
