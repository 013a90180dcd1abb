"""Host preconditions (ports, disk, Python packages) against the real host, through `orch run`."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

from tasks.host.checks import parse_size

from conftest import PlanDir, run_orch


def _listen() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _one_task(pdir: PlanDir, precondition: str) -> str:
    return str(
        pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            preconditions: [{precondition}]
            params: {{command: "true"}}
    """)
    )


def test_port_held_blocks_naming_the_holder(pdir: PlanDir) -> None:
    """A listening port blocks the task; the message names the holder's pid and command."""
    with _listen() as s:
        port = s.getsockname()[1]
        r = run_orch("run", _one_task(pdir, f"{{kind: port.free, port: {port}}}"))
    assert r.returncode == 1
    reason = pdir.todo("a")["reason"]
    assert f"port {port} is held" in reason and f"pid {os.getpid()}" in reason
    assert "python" in reason


def test_port_free_waits_for_release(pdir: PlanDir) -> None:
    """With `wait:`, the task starts once the port is released."""
    s = _listen()
    port = s.getsockname()[1]
    timer = threading.Timer(1.0, s.close)
    timer.start()
    try:
        r = run_orch(
            "run", _one_task(pdir, f"{{kind: port.free, port: {port}, wait: 20s, every: 100ms}}")
        )
    finally:
        timer.join()
        s.close()
    assert r.returncode == 0, r.stderr
    assert pdir.todo("a")["status"] == "completed"


def test_disk_free_reports_what_it_found(pdir: PlanDir) -> None:
    """Too little disk blocks with the free space found and the space needed."""
    huge = f"{{kind: disk.free, path: {pdir.root}, min_free: 900PiB}}"
    r = run_orch("run", _one_task(pdir, huge))
    assert r.returncode == 1
    reason = pdir.todo("a")["reason"]
    assert "free, needs" in reason and "TiB" in reason
    ok = run_orch("run", _one_task(pdir, f"{{kind: disk.free, path: {pdir.root}, min_free: 1MiB}}"))
    assert ok.returncode == 0


def test_python_package_version_spec(pdir: PlanDir) -> None:
    """python.package checks the version in the given interpreter, and that it imports."""
    py = sys.executable
    ok = run_orch(
        "run",
        _one_task(pdir, f"{{kind: python.package, package: pytest, version: '>=7', python: {py}}}"),
    )
    assert ok.returncode == 0, ok.stderr
    r = run_orch(
        "run",
        _one_task(pdir, f"{{kind: python.package, package: pytest, version: '<1', python: {py}}}"),
        "--rerun",
        "a",
    )
    assert r.returncode == 1
    assert "does not satisfy <1" in pdir.todo("a")["reason"]
    run_orch("run", _one_task(pdir, "{kind: python.package, package: no-such-dist-x}"))
    assert "not installed" in pdir.todo("a")["reason"]


def test_bad_version_spec_is_a_plan_error(pdir: PlanDir) -> None:
    """An invalid version specifier is caught when the plan loads, with its line."""
    r = run_orch("validate", _one_task(pdir, "{kind: python.package, package: x, version: '=>1'}"))
    assert r.returncode == 2
    assert "plan.yaml:6:" in r.stderr and "version" in r.stderr


def test_parse_size() -> None:
    """Binary units for GiB/G, decimal for GB/MB, numbers as bytes."""
    assert parse_size("50GiB") == parse_size("50G") == 50 * 2**30
    assert parse_size("500MB") == 500_000_000
    assert parse_size(10) == 10


def test_process_tree_and_listener_probes() -> None:
    """process_tree lists a real child and grandchild; listeners names the real holder."""
    import subprocess
    import time

    from probes.procs import listeners, process_tree

    parent = subprocess.Popen(["bash", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        # Until the child has exec'd sleep: forked, it is still called bash (under load, seen).
        for _ in range(500):
            tree = process_tree(parent.pid)
            if any(p.name == "sleep" for p in tree[1:]):
                break
            time.sleep(0.02)
        assert [p.pid for p in tree][0] == parent.pid
        assert any(p.name == "sleep" for p in tree[1:])
        assert "bash" in tree[0].label()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the sleep too, not only bash
        parent.wait()
    with _listen() as s:
        (held,) = listeners(s.getsockname()[1])
        assert held.process is not None and held.process.pid == os.getpid()
        assert held.address == "127.0.0.1"


def test_the_import_probe_leaves_nothing_in_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose import writes into the temp folder (as torch's inductor cache does when
    vllm is imported) writes into the probe's own, removed after: the host's stays clean."""
    from tasks.host.checks import probe_package

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "cachey.py").write_text(
        "import os, tempfile\nos.makedirs(os.path.join(tempfile.gettempdir(), 'cachey_cache'))\n"
    )
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    monkeypatch.setenv("TMPDIR", str(temp))
    info = probe_package(sys.executable, "pip", "cachey")
    assert info is not None and info.import_error is None, info
    assert list(temp.iterdir()) == []
