"""`orch report` of a long chain grows linearly, held without timing anything: the queries it
runs and the engine's lines it executes per task stay the same as the plan grows, and the
run's figures stay the same size (an 8,000-task chain once took ~40 s, all of it in a
timeline with a row per task: bench/bench_report.py)."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import orchestrator
from orchestrator.store.db import Store
from orchestrator.views.report import TIMELINE_ROWS, kind_sections, write_report

from conftest import PlanDir, run_orch

TESTS = str(Path(__file__).parent)
ENGINE = str(Path(orchestrator.__file__).parent)
SIZES = (60, 120, 240)  # all past TIMELINE_ROWS: the figures' size is fixed from there on


def chain(pdir: PlanDir, n: int) -> Path:
    """A finished chain of n tasks, each recording a finding its kind makes a section of."""
    lines = [f"name: chain{n}", "tasks:"]
    for i in range(n):
        lines.append(f'  - {{id: t{i}, kind: "helpers_tasks:Reported"')
        lines[-1] += f", needs: [t{i - 1}]}}" if i else "}"
    plan = pdir.write("\n".join(lines) + "\n", name=f"chain{n}.yaml")
    r = run_orch("run", plan, "-q", env={"PYTHONPATH": TESTS})
    assert r.returncode == 0, r.stderr
    return pdir.store_path(f"chain{n}")


def png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk
    return width, height


class Cost:
    """What one report cost, counted: SQL statements, and lines of the engine's own code run
    (a line event per line and per turn of a loop: a scan of every row for each task shows
    as a count growing with the square of the plan)."""

    def __init__(self) -> None:
        self.queries = 0
        self.lines = 0

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return self._local if frame.f_code.co_filename.startswith(ENGINE) else None

    def of(self, store_path: Path, out: Path, run_id: int | None) -> None:
        store = Store.open(store_path, create=False)
        store.conn.set_trace_callback(lambda _: setattr(self, "queries", self.queries + 1))
        sys.settrace(self._global)
        try:
            write_report(store, out, kind_sections, run_id)
        finally:
            sys.settrace(None)
            store.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    pdir = PlanDir(tmp_path_factory.mktemp("chains"))
    return {n: chain(pdir, n) for n in SIZES}


@pytest.mark.parametrize("run_id", [None, 1], ids=["today", "run 1 replayed"])
def test_a_report_costs_the_same_per_task_however_long_the_plan(
    stores: dict[int, Path], tmp_path: Path, run_id: int | None
) -> None:
    costs = {}
    for n, store in stores.items():
        costs[n] = Cost()
        costs[n].of(store, tmp_path / str(n), run_id)
    small, mid, big = (costs[n] for n in SIZES)
    # Queries: a fixed number, none per task.
    assert small.queries == mid.queries == big.queries, [c.queries for c in costs.values()]
    # Lines per task more, from 60 to 120 tasks and from 120 to 240: the same when the cost
    # is linear; twice as many when each task scans every other (quadratic).
    first = (mid.lines - small.lines) / (SIZES[1] - SIZES[0])
    second = (big.lines - mid.lines) / (SIZES[2] - SIZES[1])
    assert second <= first * 1.1, (first, second)
    # The run's figures: as large for 240 tasks as for 60 (a row per task was 35,000 px a
    # thousand tasks); the timeline says which tasks it shows instead.
    sizes = {n: png_size(tmp_path / str(n) / "timeline.png") for n in SIZES}
    # Within a few pixels: the tight bounding box follows its labels' text (a duration of
    # 9.9s against 10s moved one edge by a pixel in CI), never the number of tasks.
    for axis in (0, 1):
        side = [size[axis] for size in sizes.values()]
        assert max(side) - min(side) <= 8, sizes
    assert (tmp_path / "240" / "durations.png").exists()
    page = (tmp_path / "240" / "report.html").read_text()
    assert f"240 tasks: a row each would be unreadable, so this shows {TIMELINE_ROWS}" in page
