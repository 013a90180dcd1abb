"""Resume, crash, kill and lock behaviour, through the real `orch` CLI and real processes."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from functools import partial
from pathlib import Path

import pytest

from orchestrator.plan.model import load_plan
from orchestrator.run import attempt
from orchestrator.run import loop as executor

from conftest import ORCH, PlanDir, pid_alive, run_orch, start_orch, wait_for


def test_middle_failure_then_resume_runs_first_step_once(pdir: PlanDir) -> None:
    """Middle step fails; after the fix the plan resumes, the first step's effect happened once."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: first
            kind: shell
            params: {{command: "echo ran >> {pdir.root}/first.count"}}
          - id: middle
            kind: shell
            needs: [first]
            params:
              command: "test -e {pdir.root}/fixed || {{ echo 'cause: not fixed'; exit 3; }}"
          - id: last
            kind: shell
            needs: [middle]
            params: {{command: "echo ::finding done=yes"}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1, r.stderr
    assert pdir.statuses() == {"first": "completed", "middle": "failed", "last": "blocked"}
    assert "cause: not fixed" in pdir.todo("middle")["output_tail"]
    assert "exit code 3" in pdir.todo("middle")["last_error"]
    assert "middle failed" in r.stdout and "cause: not fixed" in r.stdout

    (pdir.root / "fixed").touch()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(pdir.statuses().values()) == {"completed"}
    assert (pdir.root / "first.count").read_text() == "ran\n"
    assert pdir.todo("first")["attempts"] == 1
    assert pdir.todo("middle")["attempts"] == 2
    assert "done=yes" in r.stdout


SLOW_PLAN = """
    name: t
    tasks:
      - id: first
        kind: shell
        params: {{command: "echo ran >> {root}/first.count"}}
      - id: slow
        kind: shell
        needs: [first]
        params:
          command: |
            echo "$$" > {root}/slow.pid
            if [ -e {root}/second ]; then echo fast; exit 0; fi
            sleep 300 &
            echo "$!" > {root}/child.pid
            wait
      - id: last
        kind: shell
        needs: [slow]
        params: {{command: "echo ran >> {root}/last.count"}}
"""


def test_sigkill_mid_task_is_reported_interrupted_and_resumed(pdir: PlanDir) -> None:
    """SIGKILL of the orchestrator mid-task: next run says interrupted, ends leftovers, finishes."""
    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", plan)
    child_file = pdir.root / "child.pid"
    wait_for(lambda: child_file.exists() and child_file.read_text().strip() != "", what="child")
    child = int(child_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert pid_alive(child), "the task's process outlives a SIGKILLed orchestrator"

    status = run_orch("status", plan)
    assert status.returncode == 0
    assert pdir.statuses()["slow"] == "interrupted"
    assert "died" in pdir.todo("slow")["reason"]
    assert pid_alive(child), "status does not kill anything"

    (pdir.root / "second").touch()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not pid_alive(child), "leftovers of the dead run are ended before the retry"
    assert "leftovers_ended" in r.stderr
    assert set(pdir.statuses().values()) == {"completed"}
    assert (pdir.root / "first.count").read_text() == "ran\n"
    assert (pdir.root / "last.count").read_text() == "ran\n"
    assert pdir.transitions("slow")[-3:] == [
        ("in_progress", "interrupted"),
        ("interrupted", "in_progress"),
        ("in_progress", "completed"),
    ]
    with pdir.db() as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM runs ORDER BY id")]
    assert outcomes == ["crashed", "completed"]


def test_sigkill_is_detected_by_the_next_run_without_status(pdir: PlanDir) -> None:
    """The next `orch run` alone (no `status` first) notices the dead run and recovers."""
    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", plan)
    wait_for(lambda: (pdir.root / "child.pid").exists(), what="child")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    (pdir.root / "second").touch()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert "recovered" in r.stderr and "slow" in r.stderr
    assert (pdir.root / "first.count").read_text() == "ran\n"


def _task_processes(marker_prefix: str) -> list[int]:
    """Pids of live processes whose environment carries ORCH_TASK=<prefix>..."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(f"ORCH_TASK={marker_prefix}".encode()) for e in env) and pid_alive(
            int(entry)
        ):
            found.append(int(entry))
    return found


def test_ctrl_c_exits_130_and_leaves_no_child(pdir: PlanDir) -> None:
    """Ctrl-C during a task: exit 130, the task is interrupted, no child process survives."""
    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", plan)
    child_file = pdir.root / "child.pid"
    wait_for(lambda: child_file.exists() and child_file.read_text().strip() != "", what="child")
    child = int(child_file.read_text())
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: SIGINT to the foreground group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert not pid_alive(child)
    assert not pid_alive(int((pdir.root / "slow.pid").read_text()))
    assert pdir.statuses()["slow"] == "interrupted"
    assert "Ctrl-C" in pdir.todo("slow")["reason"]
    with pdir.db() as conn:
        assert conn.execute("SELECT outcome FROM runs").fetchone()[0] == "interrupted"


def test_sigint_stops_a_run_started_with_sigint_ignored(pdir: PlanDir) -> None:
    """`orch run ... &` from a script inherits SIGINT ignored: `kill -INT` must still stop it."""
    import subprocess

    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = subprocess.Popen(
        [ORCH, "run", str(plan)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "NO_COLOR": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # as `&` does
    wait_for(
        lambda: (
            (pdir.root / "child.pid").exists()
            and (pdir.root / "child.pid").read_text().strip() != ""
        ),
        what="child",
    )
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert pdir.statuses()["slow"] == "interrupted"


def test_sigterm_is_handled_like_ctrl_c(pdir: PlanDir) -> None:
    """SIGTERM to the orchestrator (systemd, kill): exit 130, the group ended, status recorded."""
    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", plan)
    wait_for(
        lambda: (
            (pdir.root / "child.pid").exists()
            and (pdir.root / "child.pid").read_text().strip() != ""
        ),
        what="child",
    )
    child = int((pdir.root / "child.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert not pid_alive(child)
    assert "SIGTERM" in pdir.todo("slow")["reason"]


def test_second_run_on_same_store_is_refused(pdir: PlanDir) -> None:
    """Two concurrent runs on one store: the second refuses, naming the holder."""
    plan = pdir.write(SLOW_PLAN.format(root=pdir.root))
    proc = start_orch("run", plan)
    try:
        wait_for(lambda: (pdir.root / "child.pid").exists(), what="first run busy")
        r = run_orch("run", plan)
        assert r.returncode == 3
        assert f"pid {proc.pid}" in r.stderr and "run #1" in r.stderr
        assert "Traceback" not in r.stderr
        assert (pdir.root / "first.count").read_text() == "ran\n"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)


def test_lock_of_dead_run_is_taken_over(pdir: PlanDir) -> None:
    """A lock held by a process that was then SIGKILLed does not stop the next run, and the
    file names the new holder, not the dead one (while it lived, a run was refused)."""
    plan = pdir.write("""
        name: t
        tasks: [{id: a, kind: shell, params: {command: "true"}}]
    """)
    store = pdir.store_path()
    store.parent.mkdir(parents=True)
    hold = (
        "import sys, time; from pathlib import Path; from orchestrator.store.lock import RunLock; "
        "RunLock(Path(sys.argv[1])).acquire({'pid': 999999, 'host': 'elsewhere', 'run_id': 7}); "
        "print('held', flush=True); time.sleep(300)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(store)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = run_orch("run", plan)
        assert refused.returncode == 3 and "run #7" in refused.stderr, refused.stderr
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert json.loads(store.with_name("t.db.lock").read_text())["pid"] != 999999


def test_timeout_ends_the_whole_group(pdir: PlanDir) -> None:
    """A task past its timeout fails, and its process group (children too) is ended."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: hang
            kind: shell
            timeout: 1s
            params:
              command: "sleep 300 & echo $! > {pdir.root}/child.pid; wait"
              grace: 2
    """)
    r = run_orch("run", plan)
    assert r.returncode == 1
    row = pdir.todo("hang")
    assert "timed out" in row["last_error"]
    assert row["ended_at"] - row["started_at"] < 10
    assert not pid_alive(int((pdir.root / "child.pid").read_text()))


def _transitions_since(pdir: PlanDir, seq: int) -> list[sqlite3.Row]:
    """Transitions logged after `seq`; none while the store does not exist yet (read-only: a
    poll must never create the store file before orch does)."""
    path = pdir.store_path()
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT * FROM transitions WHERE seq > ? ORDER BY seq", (seq,)
        ).fetchall()
    except sqlite3.OperationalError:  # the schema is not there yet
        return []
    finally:
        conn.close()


def _logged(pdir: PlanDir, seq: int, task_id: str, to: str) -> bool:
    return any(
        r["task_id"] == task_id and r["to_status"] == to for r in _transitions_since(pdir, seq)
    )


def test_store_is_consistent_after_kills_at_random_moments(pdir: PlanDir) -> None:
    """SIGKILL at moments taken from the store's own log (a task just started, or just
    completed), a random offset into the next step: the store stays valid, no completed task
    runs again, and the plan finishes. A failure names its seed; ORCH_KILL_SEED=N replays it."""
    seed = int(os.environ.get("ORCH_KILL_SEED") or random.randrange(2**32))
    print(f"ORCH_KILL_SEED={seed}")
    rng = random.Random(seed)
    tasks = "\n".join(
        f"  - {{id: t{i}, kind: shell, params: {{command: 'echo {i} >> {pdir.root}/log'}}"
        + (f", needs: [t{i - 1}]" if i else "")
        + "}"
        for i in range(30)
    )
    plan = pdir.write(f"name: t\ntasks:\n{tasks}\n")
    log = pdir.root / "log"

    def ran() -> list[str]:
        return log.read_text().split() if log.exists() else []

    kills, seq = 0, 0
    done_at_kill: dict[str, int] = {}  # task -> times it had run when a kill found it done
    try:
        for _ in range(5):
            left = [i for i in range(30) if f"t{i}" not in done_at_kill]
            if not left:
                break
            target, event = f"t{rng.choice(left[:3])}", rng.choice(["in_progress", "completed"])
            offset = rng.uniform(0.0, 0.05)  # about one step of this plan
            proc = start_orch("run", plan)
            wait_for(partial(_logged, pdir, seq, target, event), what=f"{target} {event}")
            time.sleep(offset)
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
            kills += 1
            with pdir.db() as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                seq = conn.execute("SELECT max(seq) FROM transitions").fetchone()[0]
            statuses = pdir.statuses()
            assert list(statuses.values()).count("in_progress") <= 1, statuses
            counts = ran()
            assert {t: counts.count(t[1:]) for t in done_at_kill} == done_at_kill, "re-ran"
            done_at_kill.update(
                {t: counts.count(t[1:]) for t, s in statuses.items() if s == "completed"}
            )
        r = run_orch("run", plan)
        assert r.returncode == 0, r.stderr
        assert set(pdir.statuses().values()) == {"completed"}
        lines = ran()
        assert sorted(set(lines), key=int) == [str(i) for i in range(30)]
        # A task completed before a kill never runs again; at most one per kill ran twice.
        assert {t: lines.count(t[1:]) for t in done_at_kill} == done_at_kill
        assert len(lines) - 30 <= kills
    except AssertionError as exc:
        raise AssertionError(f"replay with ORCH_KILL_SEED={seed}: {exc}") from exc


def test_leftover_that_fails_a_precondition_is_ended_first(pdir: PlanDir) -> None:
    """A dead run's leftover would fail the task's precondition: it is ended before the check."""
    tag = f"orch-leftover-{os.getpid()}"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: serve
            kind: shell
            preconditions: [{{kind: command, command: "! pgrep -f '[o]{tag[1:]}'"}}]
            params:
              command: |
                [ -e {pdir.root}/second ] && exit 0
                python3 -c "import time; time.sleep(300)" {tag} &
                echo "$!" > {pdir.root}/child.pid
                wait
    """)
    proc = start_orch("run", plan)
    child_file = pdir.root / "child.pid"
    wait_for(lambda: child_file.exists() and child_file.read_text().strip() != "", what="child")
    child = int(child_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert pid_alive(child)
    (pdir.root / "second").touch()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not pid_alive(child)


def test_task_left_in_progress_by_a_closed_run_is_recovered(pdir: PlanDir) -> None:
    """A run that closed between two commits, with its task still in progress, does not wedge
    the store: the next run marks the task interrupted and runs it."""
    from orchestrator.core.status import Status
    from orchestrator.store.db import Store, TodoSpec
    from orchestrator.store.liveness import current_identity

    plan = pdir.write("name: t\ntasks: [{id: a, kind: shell, params: {command: 'true'}}]\n")
    store = Store.open(pdir.store_path())
    try:
        store.bind_plan("t")
        run_id = store.begin_run(current_identity(), str(plan), "test", pdir.root)
        store.sync_plan([TodoSpec("a", 0, "a", "medium", "shell", [], "x", "{}")], run_id)
        store.transition("a", Status.IN_PROGRESS, "attempt 1/1", run_id)
        store.end_run(run_id, "interrupted")  # the task's own commit never happened
    finally:
        store.close()
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    assert pdir.transitions("a")[-3:] == [
        ("in_progress", "interrupted"),
        ("interrupted", "in_progress"),
        ("in_progress", "completed"),
    ]


SEES = """
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
for task in sys.argv[2:]:
    status = conn.execute("SELECT status FROM todos WHERE id=?", (task,)).fetchone()[0]
    print(f"::finding seen_{task}={status}")
"""


def test_another_process_sees_each_step_committed_before_the_next_starts(pdir: PlanDir) -> None:
    """What a step's process reads from the store with a connection of its own: the steps
    before it completed, itself in progress. A run alone commits a completion together with
    the next start (one commit for two), so this is what holds that to the guarantee; a
    precondition between them must see the completion committed too (it may look at the
    store from elsewhere, and it may wait)."""
    (pdir.root / "sees.py").write_text(SEES)
    store = pdir.store_path()
    look = f"{sys.executable} {pdir.root}/sees.py {store}"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: python
            params: {{function: "helpers_tasks:noop"}}
          - id: b
            kind: shell
            needs: [a]
            params: {{command: "{look} a b"}}
          - id: c
            kind: python
            needs: [b]
            params: {{function: "helpers_tasks:noop"}}
          - id: d
            kind: shell
            needs: [c]
            preconditions:
              - {{kind: command, command: "{look} c | grep -q seen_c=completed"}}
            params: {{command: "{look} c d"}}
    """)
    r = run_orch("run", plan, env={"PYTHONPATH": str(Path(__file__).parent)})
    assert r.returncode == 0, r.stdout + r.stderr
    with pdir.db() as conn:
        seen = dict(conn.execute("SELECT key, value FROM findings").fetchall())
    assert seen == {
        "seen_a": "completed",
        "seen_b": "in_progress",
        "seen_c": "completed",
        "seen_d": "in_progress",
    }


def test_a_held_completion_is_committed_before_a_dead_runs_leftovers_are_ended(
    pdir: PlanDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ending what a dead run left of a step (up to a 10 s grace) comes after the previous
    step's completion is committed: another connection, looking when the ending starts, sees
    it. The ending is the real one, watched (attempt.jail wrapped, not replaced)."""
    marker = pdir.root / "fixed"
    plan_path = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "test -e {marker}"}}}}
          - {{id: b, kind: shell, params: {{command: "test -e {marker}"}}}}
    """)
    r = run_orch("run", plan_path, "--keep-going")  # both fail: b has a run, so leftovers
    assert r.returncode == 1 and pdir.statuses() == {"a": "failed", "b": "failed"}, r.stderr
    marker.touch()

    seen: list[str] = []
    real_jail = attempt.jail

    def watched(marker_env: tuple[str, str]) -> object:
        if ":b:" in marker_env[1]:
            with closing(sqlite3.connect(f"file:{pdir.store_path()}?mode=ro", uri=True)) as c:
                seen.append(c.execute("SELECT status FROM todos WHERE id='a'").fetchone()[0])
        return real_jail(marker_env)

    monkeypatch.setattr(attempt, "jail", watched)
    result = executor.execute(load_plan(plan_path), pdir.store_path(), executor.RunOptions())
    assert result.outcome == "completed"
    assert seen == ["completed"]
