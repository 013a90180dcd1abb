"""systemd tasks and probes against a real systemd (tests/sandbox.py), driven through `orch run`.

The code under test runs inside the sandbox's namespaces (nsenter), where systemctl reaches the
sandbox's manager. The stand-in for a vLLM server is a small Python process listening on a port;
what is under test is our handling of systemd, not the server.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from probes.systemd import parse_timespan, unit_name

from conftest import ORCH, PlanDir, free_port, run_orch, wait_for
from sandbox import Sandbox, remove, start
from test_vllm import vllm_cpu  # noqa: F401  (the fixture)

# The stand-in server. No .py suffix: it lives in the checkout while the tests run, and ruff
# must not lint it. `child` forks a worker that outlives its parent, like vLLM's EngineCore.
SERVER = """\
import os, signal, socket, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "child" and os.fork() == 0:
    while True:
        time.sleep(3600)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
while True:
    s.accept()[0].close()
"""


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """One systemd for the whole session; shut down (and its folder removed) even on failure."""
    # The guard that would have caught the wiped /tmp: a file in the host's /tmp survives.
    fd, guard = tempfile.mkstemp(prefix="orch-sandbox-guard-")
    os.close(fd)
    sb = start()
    try:
        (sb.root / "server").write_text(SERVER)
        yield sb
    finally:
        sb.shutdown()
        remove(sb)
        assert Path(guard).exists() and Path(sys.executable).exists(), (
            "the sandbox damaged the host's /tmp"
        )
        os.unlink(guard)


@dataclass
class Unit:
    name: str
    port: int


_numbers = itertools.count(1)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def make_unit(sb: Sandbox, mode: str = "plain", running: bool = True, **service: str) -> Unit:
    """A service running the stand-in server on a free port, started unless `running=False`."""
    unit = Unit(f"standin-{next(_numbers)}.service", free_port())
    lines = [
        f'ExecStart="{sys.executable}" "{sb.root / "server"}" {unit.port} {mode}',
        *(f"{k}={v}" for k, v in service.items()),
    ]
    sb.write_unit(
        unit.name,
        "[Unit]\nDescription=stand-in for an inference server\n"
        "[Service]\n" + "\n".join(lines) + "\n",
    )
    sb.daemon_reload()
    if running:
        r = sb.systemctl("start", unit.name)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: _port_open(unit.port), 10, f"{unit.name} listening")
    return unit


@pytest.fixture
def pdir(sandbox: Sandbox, request: pytest.FixtureRequest) -> PlanDir:
    """A plan folder the sandbox can see (under the checkout, not under /tmp)."""
    root = sandbox.root / request.node.name
    root.mkdir()
    return PlanDir(root)


def orch(sb: Sandbox, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`orch ARGS` inside the sandbox, wide enough that the board shows whole findings."""
    return sb.run([ORCH, *map(str, args)], env={"COLUMNS": "400"})


def run_plan(sb: Sandbox, pdir: PlanDir, text: str, *args: str) -> dict[str, dict[str, Any]]:
    """`orch run PLAN --json` inside the sandbox; its tasks by id, findings by key in "f"."""
    plan = pdir.write(text)
    r = orch(sb, "run", plan, "--json", *args)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    tasks = {t["id"]: t for t in json.loads(r.stdout)["tasks"]}
    for t in tasks.values():
        t["f"] = {f["key"]: f for f in t["findings"]}
    return tasks


def progress_lines(pdir: PlanDir) -> list[str]:
    """What the tasks said through ctx.progress in the latest run (its events.jsonl)."""
    latest = max(pdir.root.glob(".orch/t.runs/*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    events = [json.loads(line) for line in latest.read_text().splitlines()]
    return [e["msg"] for e in events if e.get("event") == "task.progress"]


def one_task(kind: str, **params: object) -> str:
    return textwrap.dedent(f"""
        name: t
        tasks:
          - id: a
            kind: {kind}
            params: {json.dumps(params)}
    """)


# --- probe -------------------------------------------------------------------------------------

PROBE = """
import json, sys
from dataclasses import asdict
from probes.systemd import read_unit
p = read_unit(sys.argv[1])
print(json.dumps({"type": type(p).__name__, "describe": p.describe(), **asdict(p)}))
"""


def probe(sb: Sandbox, unit: str) -> dict[str, Any]:
    r = sb.python(PROBE, unit)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.systemd
def test_probe_reads_a_running_unit_and_its_processes(sandbox: Sandbox) -> None:
    """State, main pid, KillMode, timeouts and the cgroup's processes, read from real systemd."""
    unit = make_unit(sandbox, TimeoutStopSec="7s", KillMode="mixed")
    p = probe(sandbox, unit.name)
    assert p["type"] == "UnitState"
    assert (p["load_state"], p["active_state"], p["sub_state"]) == ("loaded", "active", "running")
    assert p["kill_mode"] == "mixed" and p["timeout_stop"] == 7.0
    assert p["control_group"] == sandbox.control_group(unit.name)
    assert [q["pid"] for q in p["processes"]] == [p["main_pid"]]
    assert str(unit.port) in p["processes"][0]["command"]
    assert p["describe"] == f"{unit.name} is active (running), main pid {p['main_pid']}"


@pytest.mark.systemd
def test_probe_tells_missing_from_inactive_from_no_systemd(sandbox: Sandbox) -> None:
    """'unit not found', 'inactive' and 'systemd not running here' are three outcomes."""
    gone = probe(sandbox, "no-such-unit.service")
    assert gone["type"] == "UnitNotFound"
    assert gone["describe"] == (
        "no-such-unit.service does not exist: systemd has no unit file for it (not-found)"
    )
    idle = make_unit(sandbox, running=False)
    p = probe(sandbox, idle.name)
    assert p["type"] == "UnitState" and p["describe"] == f"{idle.name} is inactive (dead)"
    # No systemd: a fresh PID and mount namespace whose /run holds no /run/systemd/system.
    r = subprocess.run(
        [
            "unshare",
            "--fork",
            "--pid",
            "--mount",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            'mount -t tmpfs tmpfs /run && exec "$@"',
            "sh",
            sys.executable,
            "-c",
            PROBE,
            "vllm.service",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": "."},
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stderr
    none = json.loads(r.stdout)
    assert none["type"] == "SystemdUnavailable"
    assert "systemd is not running here (PID 1 is" in none["describe"]


def test_unit_names_and_timespans() -> None:
    """Unit names are completed and checked like systemd's; timespans parse to seconds."""
    assert unit_name("vllm") == "vllm.service"
    assert unit_name("my.app") == "my.app.service"
    assert unit_name("sglang@0.service") == "sglang@0.service"
    assert unit_name("-.slice") == "-.slice"
    assert unit_name("dev-disk-by\\x2duuid.device") == "dev-disk-by\\x2duuid.device"
    for bad, words in [
        ("vllm; rm -rf /", "';'"),
        ("a b", "' '"),
        ("$(reboot)", "'\\$'"),
        ("x`id`", "'`'"),
        ("tpl@.service", "template"),
        ("@x.service", "before"),
        ("a@b@c.service", "more than one"),
        ("", "required"),
    ]:
        with pytest.raises(ValueError, match=words):
            unit_name(bad)
    assert parse_timespan("1min 30s") == 90.0
    assert parse_timespan("500ms") == 0.5
    assert parse_timespan("infinity") is None


def test_unit_name_with_shell_metacharacters_is_a_plan_error(pdir_host: PlanDir) -> None:
    """A unit name with shell syntax stops the plan at load time, with its file and line."""
    plan = pdir_host.write("""
        name: t
        tasks:
          - id: stop
            kind: systemd.stop
            params:
              unit: "vllm; touch /pwned"
          - id: check
            kind: shell
            preconditions: [{kind: systemd.unit, unit: "x$(id)", state: active}]
            params: {command: "true"}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 2
    assert (
        "plan.yaml:7: task 'stop': param 'unit': unit name 'vllm; touch /pwned' has "
        "characters systemd does not allow (' ', '/', ';')"
    ) in r.stderr
    assert (
        "plan.yaml:10: task 'check' precondition 'systemd.unit': param 'unit': unit name "
        "'x$(id)' has characters systemd does not allow ('$', '(', ')')"
    ) in r.stderr
    assert not pdir_host.store_path().exists()


@pytest.fixture
def pdir_host(tmp_path: Path) -> PlanDir:
    return PlanDir(tmp_path)


# --- systemd.stop --------------------------------------------------------------------------------


@pytest.mark.systemd
def test_stop_already_stopped_unit_is_ok(sandbox: Sandbox, pdir: PlanDir) -> None:
    """Idempotent: an inactive unit is not an error; the finding says 'already inactive'."""
    unit = make_unit(sandbox, running=False)
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=unit.name))["a"]
    assert a["status"] == "completed", a
    assert a["f"]["final_state"]["value"] == "inactive (dead)"
    assert a["f"]["final_state"]["note"] == "already inactive"
    assert a["f"]["duration"]["value"] == 0.0


@pytest.mark.systemd
def test_missing_unit_fails_the_task_and_blocks_the_check(sandbox: Sandbox, pdir: PlanDir) -> None:
    """A unit that does not exist fails systemd.stop/start clearly; systemd.unit blocks,
    unless it asks for `load: not-found`."""
    tasks = run_plan(
        sandbox,
        pdir,
        """
        name: t
        tasks:
          - {id: stop, kind: systemd.stop, params: {unit: no-such-unit}}
          - {id: start, kind: systemd.start, params: {unit: no-such-unit}}
          - id: check
            kind: shell
            preconditions: [{kind: systemd.unit, unit: no-such-unit, state: inactive}]
            params: {command: "true"}
          - id: absent
            kind: shell
            preconditions: [{kind: systemd.unit, unit: no-such-unit, load: not-found}]
            params: {command: "true"}
    """,
        "--keep-going",
    )
    missing = "no-such-unit.service does not exist: systemd has no unit file for it (not-found)"
    assert tasks["stop"]["status"] == "failed" and tasks["stop"]["last_error"] == missing
    assert tasks["start"]["status"] == "failed" and tasks["start"]["last_error"] == missing
    assert tasks["check"]["status"] == "blocked"
    assert tasks["check"]["reason"] == f"precondition systemd.unit failed: {missing}"
    assert tasks["absent"]["status"] == "completed"  # what `load: not-found` asks for


@pytest.mark.systemd
def test_stop_of_unit_ignoring_sigterm_ends_with_sigkill(sandbox: Sandbox, pdir: PlanDir) -> None:
    """TimeoutStopSec=1s: systemd SIGKILLs the main process; the finding says so."""
    unit = make_unit(sandbox, "ignore-term", TimeoutStopSec="1s")
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=unit.name))["a"]
    assert a["status"] == "completed", a
    f = a["f"]
    assert f["final_state"]["value"] == "failed (failed)"
    assert f["final_state"]["note"] == (
        "SIGTERM was not enough: systemd sent SIGKILL after TimeoutStopSec=1s"
    )
    assert f["duration"]["value"] >= 0.9
    assert f["cgroup"]["value"] == "empty" and not _port_open(unit.port)


@pytest.mark.systemd
def test_stop_past_our_deadline_fails_with_the_state(sandbox: Sandbox, pdir: PlanDir) -> None:
    """Our `timeout` shorter than TimeoutStopSec: the task fails saying where the stop is."""
    unit = make_unit(sandbox, "ignore-term", TimeoutStopSec="60s")
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=unit.name, timeout="700ms"))["a"]
    assert a["status"] == "failed"
    error = a["last_error"]
    assert re.match(
        rf"stop of {unit.name} did not finish within [\d.]+s: {unit.name} is "
        r"deactivating \(stop-sigterm\), main pid \d+, job \d+ pending",
        error,
    )
    assert "systemd sends SIGKILL after TimeoutStopSec=60s" in error
    assert a["f"]["previous_state"]["value"] == "active (running)"
    sandbox.systemctl("kill", "--signal=SIGKILL", unit.name)  # don't leave it for 60 s


@pytest.mark.systemd
def test_kill_mode_process_leftovers(sandbox: Sandbox, pdir: PlanDir) -> None:
    """KillMode=process: warned; the stop fails naming the surviving child, which is still
    alive; with kill_leftovers the next run ends it and the cgroup is empty."""
    unit = make_unit(sandbox, "child", KillMode="process")
    main, child = (p["pid"] for p in probe(sandbox, unit.name)["processes"])
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=unit.name))["a"]
    assert a["status"] == "failed"
    assert any(
        m.startswith(f"warning: KillMode=process: stopping {unit.name} leaves")
        for m in progress_lines(pdir)
    )
    assert a["f"]["kill_mode"]["value"] == "process"
    assert "children running" in a["f"]["kill_mode"]["note"]
    assert a["f"]["leftovers"]["value"] == 1
    assert a["last_error"].startswith(
        f"{unit.name} is inactive (dead), but 1 process remains in "
        f"its control group {sandbox.control_group(unit.name)} "
        f"(KillMode=process): pid {child} "
    )
    assert [p["pid"] for p in probe(sandbox, unit.name)["processes"]] == [child]
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=unit.name, kill_leftovers=True))["a"]
    assert a["status"] == "completed", a
    assert a["f"]["final_state"]["note"] == "already inactive"
    assert a["f"]["leftovers"]["note"].startswith(f"ended: pid {child} ")
    assert a["f"]["cgroup"]["value"] == "empty"
    assert probe(sandbox, unit.name)["processes"] == []


@pytest.mark.systemd
def test_stop_of_transient_unit_that_is_collected(sandbox: Sandbox, pdir: PlanDir) -> None:
    """A `systemd-run --collect` unit (how a server is launched) vanishes once stopped: ok."""
    name, port = f"transient-{next(_numbers)}.service", free_port()
    r = sandbox.run(
        [
            "systemd-run",
            f"--unit={name}",
            "--collect",
            "-p",
            "KillMode=mixed",
            sys.executable,
            str(sandbox.root / "server"),
            str(port),
            "plain",
        ]
    )
    assert r.returncode == 0, r.stderr
    wait_for(lambda: _port_open(port), 10, "transient server listening")
    a = run_plan(sandbox, pdir, one_task("systemd.stop", unit=name))["a"]
    assert a["status"] == "completed", a
    assert a["f"]["final_state"]["note"] == "unloaded once stopped (a transient unit)"
    assert a["f"]["cgroup"]["value"] == "empty"
    assert probe(sandbox, name)["type"] == "UnitNotFound"


# --- systemd.start, systemd.restart, systemd.unit ------------------------------------------------


@pytest.mark.systemd
def test_start_restart_and_unit_check(sandbox: Sandbox, pdir: PlanDir) -> None:
    """start (then again: already active), restart gives a new main pid; systemd.unit checks."""
    unit = make_unit(sandbox, running=False)
    tasks = run_plan(
        sandbox,
        pdir,
        f"""
        name: t
        tasks:
          - id: start
            kind: systemd.start
            preconditions:
              - {{kind: systemd.unit, unit: {unit.name}, state: inactive, load: loaded}}
              - {{kind: systemd.unit, unit: {unit.name}}}  # it exists
            params: {{unit: {unit.name}}}
          - {{id: again, kind: systemd.start, needs: start, params: {{unit: {unit.name}}}}}
          - {{id: restart, kind: systemd.restart, needs: again, params: {{unit: {unit.name}}}}}
          - id: blocked
            kind: shell
            needs: restart
            preconditions: [{{kind: systemd.unit, unit: {unit.name}, state: [inactive, failed]}}]
            params: {{command: "true"}}
    """,
    )
    start_, again, restart = tasks["start"], tasks["again"], tasks["restart"]
    assert start_["status"] == again["status"] == restart["status"] == "completed"
    assert start_["f"]["previous_state"]["value"] == "inactive (dead)"
    assert start_["f"]["final_state"]["value"] == "active (running)"
    first_pid = start_["f"]["final_state"]["note"]
    assert again["f"]["final_state"]["note"] == f"already active, {first_pid}"
    assert restart["f"]["previous_state"]["note"] == first_pid
    assert restart["f"]["final_state"]["value"] == "active (running)"
    assert restart["f"]["final_state"]["note"] not in (first_pid, None)
    new_pid = probe(sandbox, unit.name)["main_pid"]
    assert restart["f"]["final_state"]["note"] == f"main pid {new_pid}"
    assert tasks["blocked"]["status"] == "blocked"
    assert tasks["blocked"]["reason"] == (
        f"precondition systemd.unit failed: {unit.name} is active (running), main pid {new_pid}"
        " (wanted: inactive or failed)"
    )
    wait_for(lambda: _port_open(unit.port), 10, "restarted server listening")


@pytest.mark.systemd
def test_restart_reports_survivors_of_the_previous_instance(
    sandbox: Sandbox, pdir: PlanDir
) -> None:
    """KillMode=process: the old instance's child outlives a restart; named, then ended."""
    unit = make_unit(sandbox, "child", KillMode="process")
    old_child = probe(sandbox, unit.name)["processes"][1]["pid"]
    a = run_plan(sandbox, pdir, one_task("systemd.restart", unit=unit.name))["a"]
    assert a["status"] == "failed"
    assert "1 process remains of the previous instance in its control group" in a["last_error"]
    assert f"pid {old_child} " in a["last_error"]
    assert a["f"]["final_state"]["value"] == "active (running)"
    a = run_plan(sandbox, pdir, one_task("systemd.restart", unit=unit.name, kill_leftovers=True))
    assert a["a"]["status"] == "completed", a
    pids = [p["pid"] for p in probe(sandbox, unit.name)["processes"]]
    assert old_child not in pids and len(pids) == 2  # the new main process and its new child


@pytest.mark.systemd
def test_failed_start_says_how_the_main_process_ended(sandbox: Sandbox, pdir: PlanDir) -> None:
    """A unit whose process exits 3: the start fails, saying so."""
    name = f"broken-{next(_numbers)}.service"
    sandbox.write_unit(name, "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'exit 3'\n")
    sandbox.daemon_reload()
    a = run_plan(sandbox, pdir, one_task("systemd.start", unit=name))["a"]
    assert a["status"] == "failed"
    assert a["last_error"] == (
        f"{name} failed to start: {name} is failed (failed), result "
        f"exit-code; main process exited with status 3; "
        f"see `journalctl -u {name}`"
    )


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.systemd
def test_plan_stops_a_server_and_waits_for_its_port(sandbox: Sandbox, pdir: PlanDir) -> None:
    """End to end through `orch run`: a running unit is stopped (state before and after, time
    taken, cgroup verified empty), then a task waits for the port to be released; the board
    shows the findings."""
    unit = make_unit(sandbox)
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: stop_server
            title: Stop the inference server
            kind: systemd.stop
            preconditions: [{{kind: systemd.unit, unit: {unit.name}, state: active}}]
            params: {{unit: {unit.name}, timeout: 30s}}
          - id: next_step
            needs: stop_server
            kind: shell
            preconditions: [{{kind: port.free, port: {unit.port}, wait: 30s}}]
            params: {{command: "echo ::finding next=ran"}}
    """)
    r = orch(sandbox, "run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _port_open(unit.port)
    assert probe(sandbox, unit.name)["describe"] == f"{unit.name} is inactive (dead)"
    board = r.stdout  # `orch run` ends with the board
    line = next(ln for ln in board.splitlines() if "stop_server" in ln)
    assert re.search(
        r"✓ stop_server .* Stop the inference server .*"
        r"previous_state=active \(running\) \(main pid \d+\), "
        r"final_state=inactive \(dead\), duration=[\d.]+ s, cgroup=empty$",
        line,
    )
    assert re.search(r"✓ next_step .* next=ran$", board, re.MULTILINE)
    assert "2 tasks: 2 completed" in board


FLAGSHIP = Path(__file__).resolve().parent.parent / "plans" / "sglang_migration.yaml"


def test_the_flagship_restores_vllm_when_the_install_fails(sandbox: Sandbox, pdir: PlanDir) -> None:
    """plans/sglang_migration.yaml itself, its production vLLM a unit of the real systemd and
    its GPUs eight idle ones from a recorded NVML state: approved on the command line, it stops
    the unit, finds the GPUs free, fails to install SGLang, and starts the unit again; the stop
    is pending for the next run. Then the same failure with `restore_vllm=false` leaves the
    unit stopped."""
    unit = make_unit(sandbox)
    gpus = pdir.root / "gpus.json"
    gpus.write_text(json.dumps([{"index": i, "used_mib": 300} for i in range(8)]))

    def flagship(*args: str) -> tuple[dict[str, dict[str, Any]], str]:
        """Every task's row by id, and what orch said on stderr."""
        r = sandbox.run(
            [ORCH, "run", str(FLAGSHIP), "--store", str(pdir.root / "f.db"), "--json",
             "--approve", "confirm_stop", "--var", f"vllm_unit={unit.name}",
             "--var", "venv=/proc/no-venv-here", *args],
            env={"ORCH_GPU_STATE": str(gpus)},
            timeout=180,
        )  # fmt: skip
        assert r.returncode == 1, r.stdout + r.stderr
        return {t["id"]: t for t in json.loads(r.stdout)["tasks"]}, r.stderr

    tasks, said = flagship()
    # Every task and orch's stderr, should it fail: it did, when two suites' sandboxes shared a
    # cgroup (tests/sandbox.py). A str message is not cut.
    board = "\n".join(f"{k}: {t['status']}: {t['reason']}" for k, t in tasks.items())
    assert tasks["stop_vllm"]["status"] == "pending", board + "\n" + said[-3000:]
    assert tasks["stop_vllm"]["reason"] == "undone by restore_vllm"
    assert tasks["free_gpus"]["status"] == "completed"
    assert tasks["install_sglang"]["status"] == "failed"
    assert tasks["restore_vllm"]["status"] == "completed"
    assert probe(sandbox, unit.name)["describe"].startswith(f"{unit.name} is active (running)")
    wait_for(lambda: _port_open(unit.port), 10, "production answering again")
    with closing(sqlite3.connect(pdir.root / "f.db")) as db:
        order = [
            r[0]
            for r in db.execute(
                "SELECT task_id || ' ' || to_status FROM transitions WHERE run_id=1"
                " AND to_status IN ('completed', 'failed') ORDER BY seq"
            )
        ]
    assert order == [
        "confirm_stop completed",
        "stop_vllm completed",
        "free_gpus completed",
        "install_sglang failed",  # both attempts
        "install_sglang failed",
        "restore_vllm completed",
    ]

    tasks, _ = flagship("--var", "restore_vllm=false")
    assert tasks["restore_vllm"]["status"] == "skipped"
    assert tasks["stop_vllm"]["status"] == "completed"
    assert probe(sandbox, unit.name)["describe"] == f"{unit.name} is inactive (dead)"


# --- server.launch under systemd ------------------------------------------------------------------


@pytest.mark.systemd
def test_a_server_runs_as_a_transient_unit_whose_stop_takes_the_whole_group(
    sandbox: Sandbox, pdir: PlanDir
) -> None:
    """Where systemd runs, server.launch uses `systemd-run` (KillMode=mixed, the log appended
    to the task's server log); server.stop ends the main process and the child it forked, and
    the collected unit is gone."""
    port = free_port()
    stub = Path(__file__).with_name("openai_stub.py")
    tasks = run_plan(
        sandbox,
        pdir,
        f"""
        name: t
        tasks:
          - id: launch
            kind: server.launch
            params:
              flavour: command
              command: [{sys.executable}, {stub}, "{port}", --child, --load, "0.5"]
              port: {port}
              ready_timeout: 30s
          - id: look
            kind: shell
            needs: [launch]
            params:
              command: >-
                echo ::finding kill_mode=$(systemctl show -p KillMode --value "$UNIT")
                && {sys.executable} -c 'import sys; from probes.systemd import read_unit;
                print("::finding processes=%d" % len(read_unit(sys.argv[1]).processes))'
                "$UNIT"
              env: {{UNIT: "${{tasks.launch.findings.supervisor}}"}}
          - {{id: stop, kind: server.stop, needs: [look], params: {{server: launch}}}}
    """,
    )
    assert {t["status"] for t in tasks.values()} == {"completed"}, tasks
    unit = tasks["launch"]["f"]["supervisor"]["value"]
    assert re.fullmatch(r"orch-launch-1-[0-9a-f]{6}\.service", unit)
    assert tasks["launch"]["f"]["pid"]["value"] > 1  # the unit's main pid
    assert tasks["look"]["f"]["kill_mode"]["value"] == "mixed"
    assert tasks["look"]["f"]["processes"]["value"] == 2  # the stub and its child
    assert "stub: serving on" in Path(tasks["launch"]["f"]["log"]["value"]).read_text()
    assert tasks["stop"]["f"]["stopped"]["value"] is True
    assert probe(sandbox, unit)["type"] == "UnitNotFound"  # stopped, and collected
    assert not _port_open(port)


@pytest.mark.systemd
@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_cpu")
def test_the_rehearsal_stops_a_vllm_unit_with_its_engine_processes(
    sandbox: Sandbox, pdir: PlanDir
) -> None:
    """plans/rehearsal.yaml's first step where systemd runs (`--var production=systemd`): a real
    vLLM as a unit, API server plus EngineCore in its cgroup, stopped with nothing left."""
    port = free_port()
    unit = f"vllm-rehearsal-{port}.service"
    serve = Path(__file__).resolve().parent.parent / "scripts" / "vllm_cpu" / "serve.sh"
    r = sandbox.run(["systemd-run", f"--unit={unit}", "--", str(serve), str(port)])
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: (
            subprocess.run(
                ["curl", "-sf", f"http://127.0.0.1:{port}/health"], capture_output=True
            ).returncode
            == 0
        ),
        timeout=300,
        what=f"vLLM in {unit}",
    )
    engine = len(probe(sandbox, unit)["processes"])
    assert engine >= 2  # the API server and its EngineCore at least
    plan = Path(__file__).resolve().parent.parent / "plans" / "rehearsal.yaml"
    r = orch(
        sandbox,
        "run",
        plan,
        "--only",
        "stop_vllm_unit",
        "--store",
        pdir.root / "r.db",
        "--var",
        "production=systemd",
        "--var",
        f"production_unit={unit}",
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (task,) = [t for t in json.loads(r.stdout)["tasks"] if t["id"] == "stop_vllm_unit"]
    f = {x["key"]: x["value"] for x in task["findings"]}
    assert f["previous_state"].startswith("active (running)")
    assert f["cgroup"] == "empty" and not _port_open(port)
    assert probe(sandbox, unit)["type"] in ("UnitState", "UnitNotFound")
