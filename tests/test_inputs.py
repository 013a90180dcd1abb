"""Every file orch reads on the user's word is looked at before it is opened: a FIFO, a device
or a folder where the plan, a vars file, the store, its lock or the report folder should be is a
clear error (exit 2, no traceback), and no command waits forever."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import PlanDir, run_orch

PLAN = """
    name: t
    tasks:
      - {id: a, kind: shell, params: {command: "true"}}
"""


def refused(r: object, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)  # type: ignore[attr-defined]
    text = r.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in text and all(w in text for w in words), text


@pytest.mark.parametrize("command", ["run", "validate", "plan", "status"])
def test_a_plan_that_is_a_fifo_a_device_or_a_folder_is_refused(pdir: PlanDir, command: str) -> None:
    fifo = pdir.root / "fifo.yaml"
    os.mkfifo(fifo)
    folder = pdir.root / "folder.yaml"
    folder.mkdir()
    for plan, what in (
        (fifo, "a FIFO"),
        (Path("/dev/zero"), "a character device"),
        (folder, "a folder"),
    ):
        refused(run_orch(command, plan, timeout=20), what)


def test_a_vars_file_that_is_a_fifo_is_refused(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    fifo = pdir.root / "vars.yaml"
    os.mkfifo(fifo)
    refused(run_orch("run", plan, "--vars-file", fifo, timeout=20), "--vars-file", "a FIFO")


@pytest.mark.parametrize("where", ["store", "lock"])
def test_a_fifo_where_the_store_or_its_lock_should_be_is_refused(pdir: PlanDir, where: str) -> None:
    plan = pdir.write(PLAN)
    store = pdir.store_path()
    store.parent.mkdir(parents=True, exist_ok=True)
    if where == "lock":
        assert run_orch("run", plan).returncode == 0
        lock = store.with_name(store.name + ".lock")
        lock.unlink()
        os.mkfifo(lock)
    else:
        os.mkfifo(store)
    refused(run_orch("run", plan, timeout=20), "a FIFO")
    for args in (("status", plan), ("history", plan), ("events", plan)):
        r = run_orch(*args, timeout=20)  # never waits on the FIFO
        if where == "store":
            refused(r, "a FIFO")
        else:  # reading needs no lock: the board as it is
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_report_folder_that_cannot_be_made_is_a_usage_error(pdir: PlanDir) -> None:
    plan = pdir.write(PLAN)
    assert run_orch("run", plan).returncode == 0
    a_file = pdir.root / "taken"
    a_file.write_text("x")
    for out in (a_file / "report", Path("/proc/orch-report")):
        refused(run_orch("report", plan, "-o", out, timeout=60), "cannot write the report")
