"""Stalls, against real processes: a Python child blocked on a lock or in a C sleep is reported
stalled with a py-spy stack naming the blocking line; one that is busy but silent, or that
prints now and then, is not. Through `orch run`: `on_stall` wait, fail and restart, and the
plan fields' validation. On an NVIDIA machine (marker `gpu`, scripts/gpu-tests.sh): a loader
whose GPU memory keeps growing is not stalled, one that stops growing is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import PlanError
from orchestrator.plan.model import load_plan
from orchestrator.proc.spawn import run_process
from orchestrator.proc.stalls import StallPolicy, StallReport, StallWatcher, load_probes, top_frame

from conftest import PlanDir, free_port, pid_alive, run_orch

BLOCKER = """\
import threading
lock = threading.Lock()
lock.acquire()
print("holding the lock; taking it again", flush=True)
lock.acquire(timeout=TIMEOUT)  # <- blocks
print("gave up waiting", flush=True)
"""
SLEEPER = """\
import time
print("sleeping", flush=True)
time.sleep(TIMEOUT)  # <- blocks
"""
BUSY = """\
import time
end = time.monotonic() + TIMEOUT
n = 0
while time.monotonic() < end:  # pure CPU, not a word
    n += 1
"""
CHATTY = """\
import time
for i in range(int(TIMEOUT / 0.3)):
    print("step", i, flush=True)
    time.sleep(0.3)
"""


def script(root: Path, name: str, text: str, timeout: float) -> Path:
    path = root / name
    path.write_text(text.replace("TIMEOUT", repr(timeout)))
    return path


def line_of(path: Path, marker: str) -> int:
    return next(n for n, ln in enumerate(path.read_text().splitlines(), 1) if marker in ln)


def watched(tmp_path: Path, child: Path, after: float) -> tuple[list[StallReport], int]:
    """Run `python child` through run_process with a stall watch that waits; the reports."""
    reports: list[StallReport] = []
    result = run_process(
        [sys.executable, str(child)],
        log_path=tmp_path / "task.log",
        stall=StallPolicy(after, "wait"),
        on_stall=reports.append,
    )
    return reports, result.returncode


# --- the watcher on real processes ---------------------------------------------------------------


def test_a_lock_never_released_is_stalled_and_the_stack_names_the_acquire(
    tmp_path: Path,
) -> None:
    child = script(tmp_path, "blocker.py", BLOCKER, 4.0)
    reports, code = watched(tmp_path, child, 1.5)
    assert code == 0
    assert len(reports) == 1, reports  # once per stall, not once per look
    report = reports[0]
    assert 1.5 <= report.idle < 3.5
    line = line_of(child, "# <- blocks")
    assert f"blocker.py:{line}" in report.summary, report.summary
    assert "lock.acquire(timeout=4.0)" in report.summary
    assert report.summary.startswith("no output, no CPU for ")
    assert report.evidence == tmp_path / "task.stalls.txt"
    evidence = report.evidence.read_text()
    assert "py-spy dump of pid" in evidence
    assert f"{child}:{line})" in evidence  # the dump itself, full file name
    assert "holding the lock; taking it again" in evidence  # the log's last lines
    assert "futex" in evidence  # the kernel wait channel of the blocked process


def test_a_sleep_in_a_c_call_is_stalled_naming_the_sleep(tmp_path: Path) -> None:
    child = script(tmp_path, "sleeper.py", SLEEPER, 3.0)
    reports, code = watched(tmp_path, child, 1.0)
    assert code == 0 and len(reports) == 1, reports
    assert f"sleeper.py:{line_of(child, '# <- blocks')}: time.sleep(3.0)" in reports[0].summary


def test_busy_but_silent_is_never_stalled(tmp_path: Path) -> None:
    """A pure CPU loop printing nothing, for four stall_after periods."""
    reports, code = watched(tmp_path, script(tmp_path, "busy.py", BUSY, 4.0), 1.0)
    assert code == 0 and reports == []


def test_a_line_every_so_often_is_not_stalled(tmp_path: Path) -> None:
    reports, code = watched(tmp_path, script(tmp_path, "chatty.py", CHATTY, 4.0), 1.0)
    assert code == 0 and reports == []


def test_the_watch_rearms_after_progress(tmp_path: Path) -> None:
    """Stalled, then progress, then stalled again: two reports, each once."""
    child = tmp_path / "twice.py"
    child.write_text(
        "import time\nprint('a', flush=True)\ntime.sleep(2.5)\n"
        "print('b', flush=True)\ntime.sleep(2.5)\n"
    )
    reports, code = watched(tmp_path, child, 1.0)
    assert code == 0 and len(reports) == 2, reports
    assert [":3:" in r.summary or "twice.py:3" in r.summary for r in reports] == [True, False]
    assert "twice.py:5" in reports[1].summary


def test_a_process_that_is_not_python_is_described_by_its_wait_channel(tmp_path: Path) -> None:
    reports: list[StallReport] = []
    run_process(
        ["sleep", "2.5"],
        log_path=tmp_path / "task.log",
        stall=StallPolicy(1.0),
        on_stall=reports.append,
    )
    assert len(reports) == 1
    assert "(sleep) state S, waiting in " in reports[0].summary, reports[0].summary
    assert "no Python process in the task's tree" in (tmp_path / "task.stalls.txt").read_text()


def test_without_py_spy_the_evidence_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where py-spy cannot dump (missing here; no ptrace elsewhere), the stall is still reported
    and the evidence says why there is no stack."""
    monkeypatch.setattr("orchestrator.proc.stalls.py_spy", lambda: None)
    reports, _ = watched(tmp_path, script(tmp_path, "sleeper.py", SLEEPER, 2.5), 1.0)
    assert len(reports) == 1
    assert "no stack (py-spy is not installed" in reports[0].summary
    assert "py-spy is not installed (pip install py-spy)" in reports[0].evidence.read_text()


def test_top_frame_reads_py_spy_output() -> None:
    dump = textwrap.dedent("""\
        Process 7: python x.py
        Python v3.11.7 (/usr/bin/python3.11)

        Thread 8 (active): "worker"
            spin (/w/x.py:3)
        Thread 7 (idle): "MainThread"
            wait (/usr/lib/python3.11/threading.py:320)
            <module> (/w/x.py:9)
    """)
    assert top_frame(dump) == ("idle", "wait", "/usr/lib/python3.11/threading.py", 320)
    unnamed = "Thread 7 (idle)\n    <module> (/w/y.py:2)\n"  # before `threading` is imported
    assert top_frame(unnamed) == ("idle", "<module>", "/w/y.py", 2)
    assert top_frame("Process 7: x\n") is None


# --- through orch run ----------------------------------------------------------------------------


def plan_with(pdir: PlanDir, command: str, fields: str) -> Path:
    return pdir.write(f"""
        name: t
        tasks:
          - id: step
            kind: shell
            {fields}
            params: {{command: "{command}"}}
    """)


def status(pdir: PlanDir, plan: Path) -> dict[str, object]:
    r = run_orch("status", plan, "--json", cwd=pdir.root)
    task: dict[str, object] = json.loads(r.stdout)["tasks"][0]
    return task


def test_on_stall_fail_ends_the_processes_and_fails_with_the_summary(pdir: PlanDir) -> None:
    child = script(pdir.root, "blocker.py", BLOCKER, 120.0)
    plan = plan_with(
        pdir,
        "echo $$ > pid; exec python3 blocker.py",
        "stall_after: 1s\n            on_stall: fail",
    )
    started = time.monotonic()
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - started < 30  # not the child's 120 s
    assert not pid_alive(int((pdir.root / "pid").read_text()))
    task = status(pdir, plan)
    assert task["status"] == "failed"
    line = line_of(child, "# <- blocks")
    error = str(task["last_error"])
    assert error.startswith("stalled: no output, no CPU for 1s; pid ")
    assert f"main thread idle in <module> at blocker.py:{line}: lock.acquire" in error
    findings = {f["key"]: f for f in task["findings"]}  # type: ignore[attr-defined]
    assert findings["stalled"]["unit"] == "s" and findings["stalled"]["value"] >= 1.0
    assert f"blocker.py:{line}" in findings["stalled"]["note"]
    log = run_orch("logs", plan, "step", cwd=pdir.root).stdout
    assert "[orch: stalled: " in log and "step.stalls.txt" in log
    assert "task.stalled" in r.stderr


def test_on_stall_wait_records_the_stall_and_lets_the_task_finish(pdir: PlanDir) -> None:
    script(pdir.root, "blocker.py", BLOCKER, 3.0)
    plan = pdir.write("""
        name: t
        stall_after: 1s
        tasks:
          - {id: step, kind: shell, params: {command: "python3 blocker.py"}}
    """)
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    task = status(pdir, plan)
    assert task["status"] == "completed"
    notes = [f["note"] for f in task["findings"] if f["key"] == "stalled"]  # type: ignore[attr-defined]
    assert len(notes) == 1 and "blocker.py:5" in notes[0]


def test_on_stall_restart_runs_it_again(pdir: PlanDir) -> None:
    """The first run blocks (stalled, restarted); the second finds its mark and finishes."""
    (pdir.root / "once.py").write_text(
        "import os, time\n"
        "if os.path.exists('ran'):\n    print('second time: done')\n    raise SystemExit\n"
        "open('ran', 'w').close()\ntime.sleep(120)\n"
    )
    plan = plan_with(pdir, "python3 once.py", "stall_after: 1s\n            on_stall: restart")
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    assert pdir.transitions("step") == [
        (None, "pending"),
        ("pending", "in_progress"),
        ("in_progress", "failed"),
        ("failed", "in_progress"),
        ("in_progress", "completed"),
    ]
    assert "task.restarting" in r.stderr
    assert "second time: done" in run_orch("logs", plan, "step", cwd=pdir.root).stdout


def test_on_stall_restart_is_bounded(pdir: PlanDir) -> None:
    script(pdir.root, "sleeper.py", SLEEPER, 120.0)
    plan = plan_with(pdir, "python3 sleeper.py", "stall_after: 1s\n            on_stall: restart")
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1
    task = status(pdir, plan)
    assert task["attempts"] == 3  # the first and two restarts
    assert str(task["last_error"]).endswith("(restarted 2 times)")
    assert "time.sleep(120.0)" in str(task["last_error"])


# --- the plan's fields ---------------------------------------------------------------------------


def test_plan_default_and_task_override(pdir: PlanDir) -> None:
    plan = load_plan(
        pdir.write("""
            name: t
            stall_after: 5m
            on_stall: fail
            tasks:
              - {id: a, kind: shell, params: {command: "true"}}
              - {id: b, kind: shell, stall_after: 30s, on_stall: restart, params: {command: "true"}}
        """)
    )
    a, b = plan.by_id["a"].spec, plan.by_id["b"].spec
    assert (a.stall_after, a.on_stall) == (300.0, "fail")
    assert (b.stall_after, b.on_stall) == (30.0, "restart")
    assert (
        plan.by_id["a"].spec_hash
        == load_plan(
            pdir.write(
                "name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n", "p2.yaml"
            )
        )
        .by_id["a"]
        .spec_hash
    )  # a run-time policy, like timeout: not what makes a task stale


def test_bad_stall_fields_name_file_and_line(pdir: PlanDir) -> None:
    path = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            stall_after: 0.5s   # E1
            params: {command: "true"}
          - id: b
            kind: shell
            stall_after: 1m
            on_stall: panic   # E2
            params: {command: "true"}
          - id: c
            kind: shell
            on_stall: fail   # E3
            params: {command: "true"}
          - id: d
            kind: shell
            stall_after: soon   # E4
            params: {command: "true"}
    """)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    by_line = {i.line: i.message for i in info.value.issues}
    assert all(i.file == str(path) for i in info.value.issues)
    assert "0.5s is too short: at least 1s" in by_line[line_of(path, "# E1")]
    assert "'panic' is not one of wait, fail or restart" in by_line[line_of(path, "# E2")]
    assert "on_stall needs stall_after" in by_line[line_of(path, "# E3")]
    assert "'soon' is not a duration" in by_line[line_of(path, "# E4")]
    assert len(info.value.issues) == 4


def test_plan_on_stall_without_any_stall_after_is_refused(pdir: PlanDir) -> None:
    path = pdir.write("""
        name: t
        on_stall: fail   # E1
        tasks:
          - {id: a, kind: shell, params: {command: "true"}}
    """)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    [issue] = info.value.issues
    assert issue.line == line_of(path, "# E1") and "on_stall needs stall_after" in issue.message


# --- GPUs (scripts/gpu-tests.sh) -----------------------------------------------------------------

GROWER = """\
import sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True)
held = []
for _ in range(int(sys.argv[1])):  # "load weights": 256 MiB every half second, silently
    held.append(torch.ones(256 * 2**20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    time.sleep(0.5)
time.sleep(float(sys.argv[2]))  # <- stops growing
"""


def _watched_child(
    tmp_path: Path, gpu_uuid: str, steps: int, seconds: float, probes: bool
) -> list[StallReport]:
    """The grower started on the GPU (`steps` growths, then a long sleep) and watched for
    `seconds` with stall_after 2 s, with the installed probes or none; ended whatever happens."""
    child, log = tmp_path / "grower.py", tmp_path / "grower.log"
    child.write_text(GROWER)
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, str(child), str(steps), "30"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu_uuid},
        )
    try:
        deadline = time.monotonic() + 120
        while b"ready" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        return _watch(proc, log, 2.0, seconds, probes)
    finally:
        proc.kill()
        proc.wait()


def _watch(
    proc: subprocess.Popen[bytes], log: Path, after: float, seconds: float, probes: bool
) -> list[StallReport]:
    watch = StallWatcher(
        StallPolicy(after),
        lambda: [proc.pid],
        log,
        log.stat().st_size,
        log.with_suffix(".stalls.txt"),
        None if probes else [],
    )
    reports = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and proc.poll() is None:
            if (r := watch.check()) is not None:
                reports.append(r)
            time.sleep(0.1)
    finally:
        watch.close()
    return reports


def _idle_gpu_uuid() -> str:
    from probes.nvml import NvmlUnavailable, snapshot

    snap = snapshot()
    if isinstance(snap, NvmlUnavailable):
        pytest.skip(f"{snap}; GPU tests run on an NVIDIA machine: scripts/gpu-tests.sh")
    for g in snap.gpus:
        if not g.processes and g.used_bytes < 2**30:
            return g.uuid
    pytest.skip("no idle GPU here")


@pytest.mark.gpu
def test_a_loader_whose_gpu_memory_grows_is_not_stalled_and_one_that_stops_is(
    tmp_path: Path,
) -> None:
    """Growing 256 MiB every 0.5 s with no output and next to no CPU: not stalled with the GPU
    probe (and, the control, stalled without it: GPU memory is what told them apart); then it
    stops growing and sleeps: stalled, naming the sleep, with no GPU change."""
    uuid = _idle_gpu_uuid()
    assert load_probes(), "the GPU probe (entry point orch.progress) is not installed"
    growing = _watched_child(tmp_path, uuid, 14, 6.0, probes=True)
    assert growing == [], growing[0].summary
    control = _watched_child(tmp_path, uuid, 14, 6.0, probes=False)
    assert control, "without the GPU probe the silent loader should look stalled"
    stopped = _watched_child(tmp_path, uuid, 2, 8.0, probes=True)
    assert len(stopped) == 1
    summary = stopped[0].summary
    assert summary.startswith("no output, no CPU, no GPU change for "), summary
    assert f"grower.py:{line_of(tmp_path / 'grower.py', '# <- stops')}: time.sleep" in summary
    assert "gpu" in stopped[0].evidence.read_text()  # the GPU figures are in the evidence


@pytest.mark.gpu
def test_server_launch_tells_loading_from_hung(pdir: PlanDir) -> None:
    """server.launch with on_stall fail: a loader that stops growing and never listens fails as
    stalled with its stack; the server's processes are ended."""
    uuid = _idle_gpu_uuid()
    (pdir.root / "grower.py").write_text(GROWER)
    port = free_port()
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: launch
            kind: server.launch
            stall_after: 3s
            on_stall: fail
            params:
              flavour: command
              command: [{sys.executable}, grower.py, "4", "600"]
              port: {port}
              env: {{CUDA_VISIBLE_DEVICES: "{uuid}"}}
              ready_timeout: 3m
    """)
    r = run_orch("run", plan, cwd=pdir.root, timeout=240)
    assert r.returncode == 1, r.stderr
    task = status(pdir, plan)
    error = str(task["last_error"])
    assert error.startswith("stalled: no output, no CPU, no GPU change for 3s"), error
    assert f"grower.py:{line_of(pdir.root / 'grower.py', '# <- stops')}: time.sleep" in error


# --- server.launch: loading or hung --------------------------------------------------------------

SERVER = """\
import runpy, sys, threading, time
if sys.argv[2] == "hung":
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # <- hung
end = time.monotonic() + 3  # "loading": busy, silent, then serves
while time.monotonic() < end:
    pass
sys.argv = ["openai_stub.py", sys.argv[1]]
runpy.run_path(STUB, run_name="__main__")
"""


def launch_plan(pdir: PlanDir, mode: str, fields: str) -> Path:
    stub = Path(__file__).with_name("openai_stub.py")
    (pdir.root / "server.py").write_text(SERVER.replace("STUB", repr(str(stub))))
    port = free_port()
    return pdir.write(f"""
        name: t
        tasks:
          - id: launch
            kind: server.launch
            stall_after: 1s
            {fields}
            params:
              flavour: command
              command: [{sys.executable}, server.py, "{port}", {mode}]
              port: {port}
              progress_every: 0.5s
              ready_timeout: 1m
          - {{id: stop, kind: server.stop, needs: [launch], params: {{server: launch}}}}
    """)


def test_server_launch_a_busy_load_is_loading(pdir: PlanDir) -> None:
    r = run_orch("run", launch_plan(pdir, "busy", ""), cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    assert "task.stalled" not in r.stderr and "loading for" in r.stderr


def test_server_launch_a_hung_load_is_stalled_with_its_stack(pdir: PlanDir) -> None:
    plan = launch_plan(pdir, "hung", "on_stall: fail")
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1, r.stderr
    task = status(pdir, plan)
    error = str(task["last_error"])
    line = line_of(pdir.root / "server.py", "# <- hung")
    assert error.startswith("stalled: no output, no CPU for 1s; pid "), error
    assert f"main thread idle in <module> at server.py:{line}: lock.acquire()" in error
    stalls = pdir.root / ".orch" / "t.runs" / "1" / "launch.stalls.txt"
    assert "py-spy dump of pid" in stalls.read_text()
    with pdir.db() as conn:  # the server was stopped and let go
        held = conn.execute("SELECT released_at FROM resources WHERE name='launch'").fetchone()
    assert held["released_at"] is not None


def test_server_launch_says_stalled_while_it_waits(pdir: PlanDir) -> None:
    """on_stall wait (the default): the stall is recorded, the progress says stalled, not
    loading, and the load goes on until its ready_timeout."""
    plan = launch_plan(pdir, "hung", "")
    plan.write_text(plan.read_text().replace("ready_timeout: 1m", "ready_timeout: 3s"))
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1, r.stderr
    assert "task.stalled" in r.stderr and "stalled: nothing moved for" in r.stderr
    task = status(pdir, plan)
    assert str(task["last_error"]).startswith("not ready after 3s")
    [stalled] = [f for f in task["findings"] if f["key"] == "stalled"]  # type: ignore[attr-defined]
    assert "server.py:5: lock.acquire()" in stalled["note"]
