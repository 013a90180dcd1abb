"""The jail's own choices, each seen directly: which containment level a host gets, the name a
later run finds a jail by, who is a member, and the life of a jail's cgroup.

The end-to-end escapes (real orch runs, real setsid and double forks) are in test_containment.py;
here each test drives one decision of orchestrator/proc/containment.py with real processes and a
real cgroup2 subtree of its own (so nothing another orch on the host made is touched).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import UsageError
from orchestrator.proc import containment
from orchestrator.proc.containment import MECHANISMS, Jail, cgroup2_mount, detect

from conftest import pid_alive, wait_for

MOUNT = cgroup2_mount()
WRITABLE = MOUNT is not None and os.access(MOUNT / "cgroup.procs", os.W_OK)
ROOT = Path(__file__).resolve().parents[1]
needs_cgroup = pytest.mark.skipif(not WRITABLE, reason="no writable cgroup2 here")


@pytest.fixture(autouse=True)
def fresh_detection() -> Iterator[None]:
    detect.cache_clear()
    yield
    detect.cache_clear()


@pytest.fixture
def own_mount(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cgroup2 subtree standing in for the mount: the jails' `orch` folder is made in it."""
    assert MOUNT is not None
    root = MOUNT / f"orch-test-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    monkeypatch.setattr(containment, "cgroup2_mount", lambda: root)
    monkeypatch.delenv("ORCH_CONTAINMENT", raising=False)
    yield root
    for cgroup in sorted(root.glob("**/"), key=lambda p: len(p.parts), reverse=True):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        procs = cgroup / "cgroup.procs"
        wait_for(lambda: not procs.read_text().split(), what=f"{cgroup} emptied")  # noqa: B023
        cgroup.rmdir()


@contextlib.contextmanager
def jailed(
    box: Jail, argv: tuple[str, ...] = ("sleep", "300")
) -> Iterator[subprocess.Popen[bytes]]:
    """A process started in `box` (its cgroup joined before exec), killed afterwards."""
    join = box.prepare()
    assert join is not None
    child = subprocess.Popen(argv, preexec_fn=join)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def marked_python(mark: tuple[str, str], script: str) -> list[str]:
    """The words `script` printed, run by a Python process carrying `mark` (as orch would,
    run from a task of another orch)."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, mark[0]: mark[1], "PYTHONPATH": python_path()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def python_path() -> str:
    """The checkout first, then what the tests run with (a tracer's sitecustomize, say)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def marker() -> tuple[str, str]:
    return ("ORCH_TASK", f"jail-test:{uuid.uuid4().hex}@{os.getpid()}")


def sleeper(
    mark: tuple[str, str] | None = None, new_session: bool = False
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if mark is not None:
        env[mark[0]] = mark[1]
    proc = subprocess.Popen(["sleep", "300"], env=env, start_new_session=new_session)
    # Popen returns once exec has closed its close-on-exec pipe, a moment before the kernel
    # lays out the new environment: /proc/PID/environ can still read empty (40 of 3000 here).
    wait_for(lambda: Path(f"/proc/{proc.pid}/environ").read_bytes() != b"", 10, "sleep's exec")
    return proc


@pytest.mark.parametrize("level", MECHANISMS)
def test_a_forced_level_is_the_level_used(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    monkeypatch.setenv("ORCH_CONTAINMENT", level)
    assert detect() == level


def test_an_unknown_forced_level_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_CONTAINMENT", raising=False)
    chosen = detect()
    detect.cache_clear()
    monkeypatch.setenv("ORCH_CONTAINMENT", "cgroups")
    assert detect() == chosen


@needs_cgroup
@pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="systemd is PID 1: scope")
def test_without_systemd_a_writable_cgroup2_is_chosen_and_its_folder_made(own_mount: Path) -> None:
    """This host: no systemd as PID 1 (whether or not systemd-run is installed), cgroup2 writable.
    The `orch` folder is made on first use and found again by a later run."""
    assert detect() == "cgroup"
    assert (own_mount / "orch" / "cgroup.procs").exists()
    detect.cache_clear()
    assert detect() == "cgroup"  # the folder is there already


def test_no_cgroup2_mount_falls_back_to_the_marker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ORCH_CONTAINMENT", raising=False)
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is PID 1: scope")
    monkeypatch.setattr(containment, "cgroup2_mount", lambda: None)
    assert detect() == "marker"
    detect.cache_clear()
    # a folder that is not a cgroup (no cgroup.procs to write) is no better
    monkeypatch.setattr(containment, "cgroup2_mount", lambda: tmp_path)
    assert detect() == "marker"


def test_a_jail_is_found_by_the_same_name_in_every_version() -> None:
    """A run by the next version of orch must find the jail of a run this one left (and a unit
    name must stay short): the name is part of the store's format, pinned here."""
    box = Jail(("ORCH_TASK", "run-1:a:1@0123456789abcdef"), "cgroup")
    assert box.name == "orch-cd730a63ade79f81fb41"
    assert Jail(box.marker, "scope").name == box.name  # whatever level made it
    with pytest.raises(dataclasses.FrozenInstanceError):
        box.marker = ("ORCH_TASK", "run-2:a:1@0123456789abcdef")  # type: ignore[misc]


def test_user_bus_is_the_socket_in_the_runtime_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not root, systemd as PID 1: a scope needs the user's bus (`systemd-run --user`)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert not containment._user_bus()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert not containment._user_bus()
    (tmp_path / "bus").touch()
    assert containment._user_bus()


@needs_cgroup
def test_prepare_reuses_a_cgroup_a_dead_run_left(own_mount: Path) -> None:
    """A jail's cgroup is still there when its remove() found it busy and orch died: the next
    spawn under the same marker joins it instead of failing."""
    box = Jail(marker(), "cgroup")
    (own_mount / "orch").mkdir()
    (own_mount / "orch" / box.name).mkdir()
    with jailed(box) as child:
        assert box.members() == [child.pid]
        assert box.end(1.0, child) == [child.pid]
        assert child.returncode is not None
        assert not (own_mount / "orch" / box.name).exists()


@needs_cgroup
def test_remove_gives_up_on_a_busy_cgroup_after_its_wait(own_mount: Path) -> None:
    box = Jail(marker(), "cgroup")
    (own_mount / "orch").mkdir()
    with jailed(box) as child:
        box.remove(wait=0.1)  # busy: left for the next run's end()
        assert (own_mount / "orch" / box.name).is_dir()
        child.kill()
        child.wait()
        box.remove()
        assert not (own_mount / "orch" / box.name).exists()
        box.remove()  # gone already: nothing to do


@needs_cgroup
def test_cgroup_kill_ends_a_process_that_ignores_sigterm(own_mount: Path) -> None:
    box = Jail(marker(), "cgroup")
    (own_mount / "orch").mkdir()
    cgroup = own_mount / "orch" / box.name
    with jailed(box, ("sh", "-c", "trap '' TERM; while :; do sleep 1; done")) as child:
        if not (cgroup / "cgroup.kill").exists():
            pytest.skip("cgroup.kill needs Linux 5.14+")
        containment._kill_cgroup(cgroup)
        assert child.wait(timeout=10) == -9


def test_a_live_unmarked_session_is_not_the_jails(tmp_path: Path) -> None:
    """`session` names the jail's session only while its leader is the jail's or gone: a live
    process without the marker that leads a session (the pid given out again) is another's."""
    mark = marker()
    stranger = sleeper(new_session=True)
    ours = sleeper(mark, new_session=True)
    try:
        assert Jail(mark, "cgroup", stranger.pid).members() == [ours.pid]
        assert Jail(mark, "cgroup", ours.pid).members() == [ours.pid]
        ours.kill()
        ours.wait()
        assert Jail(mark, "cgroup", stranger.pid).members() == []
    finally:
        for proc in (stranger, ours):
            proc.kill()
            proc.wait()


def test_a_jail_ended_by_a_process_inside_it_spares_that_process() -> None:
    """orch run from a task of another orch carries that task's marker: ending its jail (the
    outer one's, e.g. a nested run's cleanup) ends the others and never orch itself."""
    mark = marker()
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from orchestrator.proc.containment import Jail
        sibling = subprocess.Popen(["sleep", "300"])
        box = Jail({mark!r}, "marker")
        assert os.getpid() not in box.members(), box.members()
        ended = box.end(1.0, sibling)
        print("alive", ended == [sibling.pid], sibling.returncode is not None)
        """
    )
    assert marked_python(mark, script) == ["alive", "True", "True"]


def test_ended_orphans_adopted_by_orch_leave_no_zombie() -> None:
    """The marker level makes orch a subreaper: an orphan whose parent died becomes orch's
    child, and ending it must also collect it, or it stays a zombie as long as orch runs."""
    mark = marker()
    script = textwrap.dedent(
        f"""
        import os, subprocess, time
        from orchestrator.proc.containment import Jail
        box = Jail({mark!r}, "marker")
        box.prepare()  # orch becomes a subreaper
        spawn = "sleep 300 >/dev/null 2>&1 & echo $!"  # the pipe closes as sh exits
        sh = subprocess.run(["sh", "-c", spawn], capture_output=True, text=True)
        orphan = int(sh.stdout)
        with open(f"/proc/{{orphan}}/stat") as f:
            ppid = int(f.read().rpartition(")")[2].split()[1])
        ended = box.end(1.0)
        print(ppid == os.getpid(), ended == [orphan], os.path.exists(f"/proc/{{orphan}}"))
        """
    )
    assert marked_python(mark, script) == ["True", "True", "False"]


def test_no_cgroup2_at_all_a_jail_still_ends_its_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment, "cgroup2_mount", lambda: None)
    mark = marker()
    child = sleeper(mark)
    try:
        box = Jail(mark, "cgroup")  # as chosen on a host that had one; no adopting here
        assert box.cgroup() is None
        assert box.end(1.0, child) == [child.pid]
        assert not pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_cgroup_forced_on_a_host_without_cgroup2_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(containment, "cgroup2_mount", lambda: None)
    with pytest.raises(UsageError, match="ORCH_CONTAINMENT=cgroup"):
        Jail(marker(), "cgroup").prepare()


def test_a_leader_that_already_exited_is_reaped_by_end() -> None:
    """Its jail has no live member left, so nothing is signalled: end() must still collect the
    leader's exit status, or it stays a zombie of orch's."""
    mark = marker()
    env = {**os.environ, mark[0]: mark[1]}
    leader = subprocess.Popen(["true"], env=env)
    stat = Path(f"/proc/{leader.pid}/stat")
    wait_for(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", what="a zombie")
    assert Jail(mark, "cgroup").end(1.0, leader) == []
    assert leader.returncode == 0
    assert not stat.exists()
