"""The load generator measures itself: a window where its one event loop could not keep up
timed the client, not the server, and is refused with the reason (tasks/loadgen.py,
`client_saturated`). The client here is the real measure_level against the real stub server
(tests/openai_stub.py), on a thread that a cgroup's CPU quota starves: the way a client
reading too many streams on one core falls behind, made certain."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import TaskError
from tasks.loadgen import BenchParams, Measured, Target, load_prompts, measure_level

from conftest import free_port, wait_for

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, as on these machines


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("openai_stub.py")), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url), timeout=20, what="the stub server")
        yield url
    finally:
        server.kill()
        server.wait(timeout=10)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def quota() -> Iterator[Path]:
    """A cpu cgroup allowing 3% of one core to the threads put in it."""
    group = CPU_CGROUPS / f"orch-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("3000")
    except OSError as exc:
        pytest.skip(f"no writable cgroup v1 cpu controller here ({exc}): cannot starve a thread")
    try:
        yield group
    finally:
        for _ in range(50):  # the starved thread has ended; its group empties a moment later
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def measured(url: str, group: Path | None) -> Measured | TaskError:
    """measure_level at concurrency 4 on a thread of its own, put in `group` if given."""
    p = BenchParams(
        url=url,
        requests=8,
        warmup=1,
        output_tokens=40,
        input_words=4,
        min_windows=2,
        max_windows=2,
        stability=0.9,
    )
    target = Target(url, "tiny", "openai", None, {})
    box: dict[str, Any] = {}

    def client() -> None:
        if group is not None:
            (group / "tasks").write_text(str(threading.get_native_id()))
        try:
            box["result"] = asyncio.run(measure_level(target, load_prompts(p), p, 4, None))
        except TaskError as exc:
            box["result"] = exc

    thread = threading.Thread(target=client)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the client never finished"
    result: Measured | TaskError = box["result"]
    return result


def test_a_client_with_a_core_to_itself_is_not_the_bottleneck(stub: str) -> None:
    result = measured(stub, None)
    assert isinstance(result, Measured), result
    for window in result.windows:
        client = window.figures["client"]
        assert client["busy"] < 0.9 and client["late"] < 0.25, client


def test_a_client_starved_of_cpu_has_its_windows_refused_with_the_reason(
    stub: str, quota: Path
) -> None:
    result = measured(stub, quota)
    assert isinstance(result, TaskError), "a starved client's windows were kept"
    text = str(result)
    assert "only 0 clean window(s) of 2" in text, text
    assert text.count("the load generator was the bottleneck") == 2, text
    assert "of a core and was behind for " in text and "% of the window (up to " in text
    assert "the server did not stream them" not in text  # the client's doing, not the server's
