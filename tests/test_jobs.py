"""`--jobs N`: ready tasks side by side, named resources, Ctrl-C and SIGKILL in the middle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import ORCH, PlanDir, pid_alive, run_orch, start_orch, wait_for


def spans(pdir: PlanDir, run: int | None = None) -> dict[str, tuple[float, float]]:
    """Each task's (start, end) in a run (the latest), from the store's transitions."""
    with pdir.db() as db:
        run = run or db.execute("SELECT max(id) FROM runs").fetchone()[0]
        rows = db.execute(
            "SELECT task_id, to_status, at FROM transitions WHERE run_id=? ORDER BY seq", (run,)
        ).fetchall()
    started: dict[str, float] = {}
    out = {}
    for task, to, at in rows:
        if to == "in_progress":
            started[task] = at
        elif task in started:
            out[task] = (started.pop(task), at)
    return out


def wait_reason(pdir: PlanDir, task: str, text: str) -> None:
    """Until the board's reason for `task` says `text` (it waits for something)."""
    wait_for(
        lambda: text in (pdir.todo(task)["reason"] or "") if pdir.status_of(task) else False,
        what=f"{task} saying {text!r}",
    )


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in edges:  # an end and a start at the same instant: the end first
        now += step
        peak = max(peak, now)
    return peak


def sleepers(n: int, seconds: float, extra: str = "", head: str = "") -> str:
    lines = ["name: t", head, "tasks:"] if head else ["name: t", "tasks:"]
    for i in range(n):
        lines.append(
            f"  - {{id: s{i}, kind: shell, params: {{command: 'sleep {seconds}'}}{extra}}}"
        )
    return "\n".join(lines) + "\n"


def test_eight_one_second_tasks_with_four_jobs_take_about_two_seconds(pdir: PlanDir) -> None:
    plan = pdir.write(sleepers(8, 1))
    started = time.monotonic()
    r = run_orch("run", plan, "--jobs", "4")
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert took < 5.0, took  # one at a time: 8 s and more
    assert most_at_once(list(spans(pdir).values())) == 4
    # The plan's own default, and --jobs 1: one at a time, in plan order.
    plan.write_text("jobs: 2\n" + plan.read_text())
    assert run_orch("run", plan, "--from", "s0").returncode == 0
    assert most_at_once(list(spans(pdir).values())) == 2
    assert run_orch("run", plan, "--from", "s0", "--jobs", "1").returncode == 0
    order = spans(pdir)
    assert most_at_once(list(order.values())) == 1
    assert sorted(order, key=lambda t: order[t][0]) == [f"s{i}" for i in range(8)]


def test_a_resource_of_two_is_never_held_by_three(pdir: PlanDir) -> None:
    """Over five runs of six tasks holding one unit each of a resource of two, with four jobs
    and other tasks beside: never three at once, and two at once every time (the limit is
    reached, so the check bites)."""
    head = "resources: {disk-heavy: 2}"
    plan = pdir.write(
        sleepers(6, 0.3, ", resources: {disk-heavy: 1}", head)
        + "  - {id: free1, kind: shell, params: {command: 'sleep 0.3'}}\n"
        + "  - {id: free2, kind: shell, params: {command: 'sleep 0.3'}}\n"
    )
    for i in range(5):
        args = ["run", plan, "--jobs", "4"] + (["--from", "s0"] if i else [])
        r = run_orch(*args)
        assert r.returncode == 0, r.stderr
        found = spans(pdir)
        heavy = [found[f"s{j}"] for j in range(6)]
        assert most_at_once(heavy) == 2, heavy
        assert most_at_once(list(found.values())) <= 4
    r = run_orch("status", plan, "--json")
    assert all(t["status"] == "completed" for t in json.loads(r.stdout)["tasks"])


def test_a_task_waits_for_its_resource_and_the_board_says_for_what(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        resources: {{gpu-box: 1}}
        tasks:
          - id: hold
            kind: shell
            resources: {{gpu-box: 1}}
            params: {{command: "until [ -e {pdir.root}/go ]; do sleep 0.05; done"}}
          - {{id: next, kind: shell, resources: {{gpu-box: 1}}, params: {{command: "true"}}}}
    """)
    runner = start_orch("run", plan, "--jobs", "2")
    try:
        wait_reason(pdir, "next", "waiting for gpu-box")
        assert pdir.todo("next")["reason"] == "waiting for gpu-box (1 of 1 held) by hold"
        assert pdir.statuses() == {"hold": "in_progress", "next": "pending"}
        board = run_orch("status", plan).stdout
        assert "waiting for gpu-box (1 of 1 held) by hold" in board
        (pdir.root / "go").touch()
        runner.communicate(timeout=30)
        assert runner.returncode == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert spans(pdir)["next"][0] >= spans(pdir)["hold"][1]


def test_a_pending_task_says_why_it_is_pending_now_not_what_it_waited_for(pdir: PlanDir) -> None:
    """After a reset and a failed run, tasks the run did not start say so: not "reset by orch
    reset", not the wait for a resource that the failed task no longer holds."""
    ok = pdir.root / "ok"
    plan = pdir.write(f"""
        name: t
        resources: {{disk: 1}}
        tasks:
          - id: a
            kind: shell
            resources: {{disk: 1}}
            params: {{command: "sleep 0.5; test -e {ok}"}}
          - {{id: b, kind: shell, resources: {{disk: 1}}, params: {{command: "true"}}}}
          - {{id: c, kind: shell, needs: [b], params: {{command: "true"}}}}
    """)
    ok.touch()
    assert run_orch("run", plan, "--jobs", "2").returncode == 0
    assert run_orch("reset", plan, "--yes").returncode == 0
    assert pdir.todo("c")["reason"] == "reset by orch reset"
    ok.unlink()
    runner = start_orch("run", plan, "--jobs", "2")
    try:
        wait_reason(pdir, "b", "waiting for disk (1 of 1 held) by a")
        runner.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 1
    assert pdir.statuses() == {"a": "failed", "b": "pending", "c": "pending"}
    why = "not started: the run stopped after a failed"
    assert pdir.todo("b")["reason"] == why and pdir.todo("c")["reason"] == why
    board = run_orch("status", plan).stdout
    assert "waiting for disk" not in board and "reset by" not in board, board


def test_a_wait_for_a_resource_ends_on_the_board_when_it_ends(pdir: PlanDir) -> None:
    """The resource is free, the task checks its preconditions (a wait of its own): the board
    no longer says it waits for the resource."""
    go, ready = pdir.root / "go", pdir.root / "ready"
    plan = pdir.write(f"""
        name: t
        resources: {{disk: 1}}
        tasks:
          - id: a
            kind: shell
            resources: {{disk: 1}}
            params: {{command: "until [ -e {go} ]; do sleep 0.05; done"}}
          - id: b
            kind: shell
            resources: {{disk: 1}}
            preconditions: [{{kind: command, command: "test -e {ready}", wait: 30s, every: 50ms}}]
            params: {{command: "true"}}
    """)
    runner = start_orch("run", plan, "--jobs", "2")
    try:
        wait_reason(pdir, "b", "waiting for disk (1 of 1 held) by a")
        go.touch()
        wait_for(lambda: pdir.status_of("a") == "completed", what="a completed")
        wait_for(lambda: pdir.todo("b")["reason"] is None, what="b's wait for disk over")
        assert pdir.status_of("b") == "pending"  # its precondition is not met yet
        ready.touch()
        runner.communicate(timeout=30)
        assert runner.returncode == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()


def test_resources_are_validated_with_the_plan(pdir: PlanDir) -> None:
    plan = pdir.write("""
        name: t
        resources: {disk-heavy: 1}
        tasks:
          - {id: a, kind: shell, resources: {disk-hevy: 1}, params: {command: "true"}}
          - {id: b, kind: shell, resources: {disk-heavy: 2}, params: {command: "true"}}
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2
    assert "plan.yaml:5: task 'a' holds unknown resource 'disk-hevy' (did you mean" in r.stderr
    assert "plan.yaml:6: task 'b' holds 2 of 'disk-heavy', which has 1" in r.stderr
    r = run_orch("run", plan, "--jobs", "0")
    assert r.returncode == 2 and "--jobs" in r.stderr
    # Units may come from a var (known at load), as the flagship's `gpus: "${vars.tp}"`.
    plan = pdir.write("""
        name: t
        vars: {n: 2}
        resources: {disk-heavy: 1}
        tasks:
          - {id: a, kind: shell, resources: {disk-heavy: "${vars.n}"}, params: {command: "true"}}
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2 and "task 'a' holds 2 of 'disk-heavy', which has 1" in r.stderr
    assert run_orch("validate", plan, "--var", "n=1").returncode == 0


def test_a_failure_stops_new_starts_and_keep_going_runs_the_rest(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: bad, kind: shell, params: {{command: "sleep 0.2; exit 3"}}}}
          - {{id: busy, kind: shell, params: {{command: "sleep 1; echo busy >> {pdir.root}/ran"}}}}
          - {{id: later, kind: shell, params: {{command: "echo later >> {pdir.root}/ran"}}}}
          - {{id: after, kind: shell, needs: [bad], params: {{command: "true"}}}}
    """)
    r = run_orch("run", plan, "--jobs", "2")
    assert r.returncode == 1
    # busy was running when bad failed: it finished; later had not started: it waits.
    assert pdir.statuses() == {
        "bad": "failed",
        "busy": "completed",
        "later": "pending",
        "after": "blocked",
    }
    assert run_orch("run", plan, "--jobs", "2", "--keep-going").returncode == 1
    assert pdir.statuses()["later"] == "completed"
    assert (pdir.root / "ran").read_text().split() == ["busy", "later"]


def test_ctrl_c_ends_every_running_group(pdir: PlanDir) -> None:
    plan = pdir.write(
        "name: t\ntasks:\n"
        + "".join(
            f"  - {{id: s{i}, kind: shell, params: {{command: 'echo $$ >> {pdir.root}/pids; "
            "exec sleep 300'}}\n"
            for i in range(4)
        )
    )
    runner = start_orch("run", plan, "--jobs", "3")
    pids_file = pdir.root / "pids"
    wait_for(
        lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3,
        what="three tasks running",
    )
    runner.send_signal(signal.SIGINT)
    runner.communicate(timeout=60)
    assert runner.returncode == 130
    statuses = pdir.statuses()
    assert sorted(statuses.values()) == ["interrupted"] * 3 + ["pending"]
    assert pdir.todo("s3")["reason"] == "not started: the run was stopped by Ctrl-C"
    pids = [int(p) for p in pids_file.read_text().split()]
    assert not [p for p in pids if pid_alive(p)]


def test_sigkill_mid_parallel_run_resumes_with_nothing_run_twice(pdir: PlanDir) -> None:
    """Tasks log each start; orch is SIGKILLed with two running and two done: the next run
    ends the killed attempts' processes, runs those two again and the rest once, and no task
    that completed ran again."""
    plan = pdir.write(
        "name: t\ntasks:\n"
        + "".join(
            f"  - {{id: s{i}, kind: shell, params: {{command: 'echo s{i} >> {pdir.root}/ran; "
            f"echo $$ >> {pdir.root}/pids; [ -e {pdir.root}/fast ] || [ {i} -lt 2 ] "
            "|| sleep 300'}}\n"
            for i in range(6)
        )
    )
    runner = start_orch("run", plan, "--jobs", "2")
    wait_for(
        lambda: (
            sorted(pdir.statuses().values()).count("in_progress") == 2
            and list(pdir.statuses().values()).count("completed") == 2
            if pdir.store_path().exists() and pdir.status_of("s0")
            else False
        ),
        what="two done, two running",
    )
    time.sleep(0.3)  # both have printed their pid
    os.killpg(runner.pid, signal.SIGKILL)
    runner.communicate(timeout=10)
    killed = [int(p) for p in (pdir.root / "pids").read_text().split()][2:]
    (pdir.root / "fast").touch()
    r = run_orch("run", plan, "--jobs", "2")
    assert r.returncode == 0, r.stderr
    assert not [p for p in killed if pid_alive(p)]
    ran = (pdir.root / "ran").read_text().split()
    assert ran.count("s0") == ran.count("s1") == 1  # completed before the kill: not again
    assert ran.count("s2") == ran.count("s3") == 2  # killed mid-way: run again
    assert ran.count("s4") == ran.count("s5") == 1
    assert set(pdir.statuses().values()) == {"completed"}


# --- GPU leases, on a recorded 8-GPU host (the real NVML path: tests/test_gpu.py) ------------


def eight_gpus(path: Path, busy: dict[int, dict[str, object]] | None = None) -> Path:
    rows = [{"index": i, "used_mib": 300, **(busy or {}).get(i, {})} for i in range(8)]
    path.write_text(json.dumps(rows))
    return path


def test_gpu_leases_on_a_recorded_eight_gpu_host(pdir: PlanDir) -> None:
    """GPUs 2 and 5 are busy (a process; 70 GiB used). Three tasks at once: `gpus: 4` gets the
    first four free, `[6, 7]` those, and `gpus: 1` waits (all six free ones are leased) until
    one is released; each sees its GPUs in CUDA_VISIBLE_DEVICES; the leases are in the store,
    released when the tasks end."""
    state = eight_gpus(pdir.root / "gpus.json", {2: {"pids": [4121]}, 5: {"used_mib": 71_000}})
    seen = pdir.root / "seen"
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: four, kind: shell, resources: {{gpus: 4}},
             params: {{command: "echo four=$CUDA_VISIBLE_DEVICES >> {seen}; sleep 1"}}}}
          - {{id: pinned, kind: shell, resources: {{gpus: [6, 7]}},
             params: {{command: "echo pinned=$CUDA_VISIBLE_DEVICES >> {seen}; sleep 1"}}}}
          - {{id: one, kind: shell, resources: {{gpus: 1}},
             params: {{command: "echo one=$CUDA_VISIBLE_DEVICES >> {seen}"}}}}
    """)
    r = run_orch("run", plan, "--jobs", "3", env={"ORCH_GPU_STATE": str(state)})
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=") for line in seen.read_text().split())
    assert got["four"] == "0,1,3,4" and got["pinned"] == "6,7", got
    assert got["one"] in ("0", "1", "3", "4", "6", "7"), got
    found = spans(pdir)
    assert found["one"][0] >= min(found["four"][1], found["pinned"][1])  # it waited
    with pdir.db() as db:
        leases = db.execute(
            "SELECT name, task_id, released_at IS NOT NULL FROM resources WHERE kind='lease'"
        ).fetchall()
    # One row per GPU, its latest holder: none for the busy two, every lease released.
    assert sorted(n for n, _, _ in leases) == [f"gpus:{i}" for i in (0, 1, 3, 4, 6, 7)]
    assert {t for _, t, _ in leases} <= {"four", "pinned", "one"} and "pinned" in {
        t for _, t, _ in leases
    }
    assert all(done for _, _, done in leases)


def test_a_task_waits_for_a_busy_gpu_and_says_what_holds_it(pdir: PlanDir) -> None:
    state = eight_gpus(pdir.root / "gpus.json", {0: {"pids": [4121], "used_mib": 70_000}})
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: g0, kind: shell, resources: {{gpus: [0]}},
             params: {{command: "echo $CUDA_VISIBLE_DEVICES > {pdir.root}/g0"}}}}
          - {{id: g9, kind: shell, resources: {{gpus: [9]}}, params: {{command: "true"}}}}
    """)
    proc = subprocess.Popen(
        [ORCH, "run", str(plan), "--keep-going"],
        env={**os.environ, "ORCH_GPU_STATE": str(state), "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_reason(pdir, "g0", "waiting for gpus 0: GPU 0 holds")
        assert pdir.statuses()["g0"] == "pending"
        eight_gpus(state)  # the holder went away
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (pdir.root / "g0").read_text().strip() == "0"
    assert pdir.statuses()["g9"] == "failed"  # no GPU 9 here: failed at once, not waited for
    assert "gpus 9: not on this host (it has 0, 1, 2, 3, 4, 5, 6, 7)" in pdir.todo("g9")["reason"]


def test_a_python_tasks_timeout_holds_in_a_worker_thread(pdir: PlanDir) -> None:
    """With --jobs 2 a `python` task runs in a thread, where SIGALRM cannot be handled: its
    timeout still ends a function looping in Python, with the same words as alone; a quick
    one beside it completes, and the run ends normally."""
    (pdir.root / "spin.py").write_text(
        "def spin():\n    while True:\n        pass\n\n\ndef quick():\n    return {'ok': 1}\n"
    )
    plan = pdir.write(
        "name: t\ntasks:\n"
        + "".join(
            f"  - {{id: {i}, kind: python, timeout: {t}, params: {{function: 'spin:{f}'}}}}\n"
            for i, f, t in (("a", "spin", "500ms"), ("b", "spin", "500ms"), ("c", "quick", "5s"))
        )
    )
    for jobs in ("2", "1"):
        started = time.monotonic()
        r = run_orch("run", plan, "--jobs", jobs, "--keep-going", "--rerun", "a")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert time.monotonic() - started < 10
        assert pdir.statuses() == {"a": "failed", "b": "failed", "c": "completed"}
        for task in ("a", "b"):
            assert pdir.todo(task)["last_error"] == "timed out after 500ms", jobs


def stubborn_tasks(pdir: PlanDir, count: int) -> Path:
    """`count` shell tasks whose processes ignore SIGTERM, so that ending each takes its whole
    grace (2 s) and then a SIGKILL. Each task's leader starts a helper in a session of its own,
    out of the group's reach: only the task's jail ends it. Each writes its pid to `pids`."""
    script = pdir.root / "stubborn.sh"
    script.write_text(
        "trap '' TERM\n"
        f"echo $$ >> {pdir.root}/pids\n"
        f'[ "$1" = lead ] && setsid bash {script} helper &\n'
        "while :; do sleep 0.1; done\n"
    )
    return pdir.write(
        "name: t\ntasks:\n"
        + "".join(
            f"  - {{id: s{i}, kind: shell, params: {{grace: 2, command: 'bash {script} lead'}}}}\n"
            for i in range(count)
        )
    )


def interrupt_when_running(pdir: PlanDir, plan: Path, jobs: int, ctrl_cs: int) -> list[int]:
    """Run `plan` with `--jobs`, send Ctrl-C `ctrl_cs` times (a second one 0.5 s into the
    grace) once `jobs` tasks and their helpers run, and return their pids once orch has exited
    130."""
    runner = start_orch("run", plan, "--jobs", str(jobs))
    pids_file = pdir.root / "pids"
    wait_for(
        lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2 * jobs,
        what=f"{jobs} tasks running",
    )
    for _ in range(ctrl_cs):
        runner.send_signal(signal.SIGINT)
        time.sleep(0.5)
    runner.communicate(timeout=60)
    assert runner.returncode == 130
    assert sorted(pdir.statuses().values()) == ["interrupted"] * jobs
    return [int(p) for p in pids_file.read_text().split()]


def test_one_ctrl_c_ends_tasks_that_take_their_whole_grace_to_end(pdir: PlanDir) -> None:
    """Each task's thread is interrupted once: the interrupt is not repeated into the grace
    period it spends ending its processes, which would leave them alive (a flake under load)."""
    pids = interrupt_when_running(pdir, stubborn_tasks(pdir, 2), jobs=2, ctrl_cs=1)
    assert not [p for p in pids if pid_alive(p)]


def test_a_second_ctrl_c_in_the_grace_period_still_ends_every_group(pdir: PlanDir) -> None:
    """As with one task at a time (terminate_pids holds Ctrl-C back), a second Ctrl-C while
    task threads end their processes is held until each has ended them."""
    pids = interrupt_when_running(pdir, stubborn_tasks(pdir, 2), jobs=2, ctrl_cs=2)
    assert not [p for p in pids if pid_alive(p)]


TIDY = """\
import time
from pathlib import Path

HERE = Path(__file__).parent


def tidy(name):
    # The marker is written inside the try: a Ctrl-C the test sends once it sees the marker
    # must find the handler in place (before, under load it could land between the two).
    try:
        (HERE / f"{name}.running").touch()
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        for _ in range(30):
            time.sleep(0.05)
        (HERE / f"{name}.tidied").touch()
        raise


def deaf():
    running = HERE / "deaf.running"
    while True:
        try:
            running.touch()  # inside the try, as tidy's
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            if (HERE / "deaf.heard").exists():
                raise
            (HERE / "deaf.heard").touch()
"""


def test_a_task_that_tidies_up_after_ctrl_c_is_interrupted_once(pdir: PlanDir) -> None:
    """A `python` task that catches Ctrl-C to tidy up for 1.5 s finishes tidying with --jobs 2
    as it does alone: its thread is told of one Ctrl-C once, not again every half second."""
    (pdir.root / "tidy.py").write_text(TIDY)
    plan = pdir.write(
        "name: t\ntasks:\n"
        + "".join(
            f"  - {{id: {i}, kind: python, params: {{function: 'tidy:tidy', args: {{name: {i}}}}}}}"
            "\n"
            for i in ("a", "b")
        )
    )
    for jobs in ("2", "1"):
        for mark in [*pdir.root.glob("*.tidied"), *pdir.root.glob("*.running")]:
            mark.unlink()
        runner = start_orch("run", plan, "--jobs", jobs)
        wait_for(lambda: (pdir.root / "a.running").exists(), what="a running")
        if jobs == "2":
            wait_for(lambda: (pdir.root / "b.running").exists(), what="b running")
        runner.send_signal(signal.SIGINT)
        runner.communicate(timeout=30)
        assert runner.returncode == 130
        assert (pdir.root / "a.tidied").exists(), jobs
        assert (pdir.root / "b.tidied").exists() == (jobs == "2")


def test_a_second_ctrl_c_reaches_a_task_that_ignored_the_first(pdir: PlanDir) -> None:
    """A task that swallows a Ctrl-C goes on running, as it would alone; a second Ctrl-C is
    passed on to its thread too, and the run ends."""
    (pdir.root / "tidy.py").write_text(TIDY)
    plan = pdir.write(
        "name: t\ntasks:\n  - {id: a, kind: python, params: {function: 'tidy:deaf'}}\n"
        "  - {id: b, kind: shell, params: {command: 'sleep 60'}}\n"
    )
    runner = start_orch("run", plan, "--jobs", "2")
    wait_for(lambda: (pdir.root / "deaf.running").exists(), what="a running")
    wait_for(lambda: pdir.status_of("b") == "in_progress", what="b running")
    runner.send_signal(signal.SIGINT)
    wait_for(lambda: (pdir.root / "deaf.heard").exists(), what="a hearing Ctrl-C")
    wait_for(lambda: pdir.status_of("b") == "interrupted", what="b interrupted")
    assert runner.poll() is None  # a goes on
    runner.send_signal(signal.SIGINT)
    runner.communicate(timeout=30)
    assert runner.returncode == 130
    assert pdir.statuses() == {"a": "interrupted", "b": "interrupted"}
