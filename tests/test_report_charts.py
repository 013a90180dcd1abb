"""`orch report`'s charts: legends that hide no data, a timeline axis that fits the run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_report import bench_doc, level

import orchestrator.views.report as report
import tasks.analysis.plots as benchplots
from orchestrator.store.db import Store
from orchestrator.views.report import Attempt, kind_sections, timeline, write_report
from tasks.analysis.plots import bench_figures

from conftest import PlanDir, run_orch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every matplotlib figure the report draws, kept open (with its layout done) for a look
    before it becomes a PNG."""
    kept: list[Any] = []
    real = report.png_of

    def keep(figure: Any) -> bytes:
        figure.canvas.draw()  # the layout savefig would use, legends placed
        kept.append(figure)
        return b"png"

    monkeypatch.setattr(report, "png_of", keep)
    monkeypatch.setattr(benchplots, "png_of", keep)
    yield kept
    for figure in kept:
        real(figure)  # closes it


def covered(figure: Any) -> list[str]:
    """What any legend of `figure` lies over: plotted points, bars, annotations (display
    coordinates, as matplotlib drew them)."""
    renderer = figure.canvas.get_renderer()
    legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
    assert legends, "no legend drawn"
    hits = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in figure.axes:
            for line in ax.get_lines():
                points = line.get_transform().transform(line.get_xydata())
                hits += [f"{line.get_label()} at {p}" for p in points if box.contains(*p)]
            for collection in ax.collections:  # error bars
                for path in collection.get_paths():
                    vertices = collection.get_transform().transform(path.vertices)
                    hits += [f"error bar at {v}" for v in vertices if box.contains(*v)]
            for patch in ax.patches:  # the timeline's bars
                if box.overlaps(patch.get_window_extent(renderer)):
                    hits.append(f"bar {patch.get_window_extent(renderer)}")
            for text in ax.texts:  # c=N, acceptance labels
                if box.overlaps(text.get_window_extent(renderer)):
                    hits.append(f"label {text.get_text()!r}")
    return hits


def crowded(label: str, speed: float) -> dict[str, Any]:
    """A result whose points fill its chart's height from corner to corner."""
    spec = {"accept_length": 1.2 + speed, "draft_tokens": 3, "acceptance": 0.4}
    doc = bench_doc(label, label, speed)
    doc["levels"] = [
        level(c, 100.0 * speed, 7.0 / speed, spec) for c in (1, 2, 4, 6, 8, 10, 12, 14, 16)
    ]
    return doc


def test_no_legend_covers_a_benchmark_point(drawn: list[Any]) -> None:
    # Eight series spread over the whole height: every corner of the axes holds points.
    series = [(f"candidate {i}", crowded(f"c{i}", 0.6 + 0.2 * i)) for i in range(8)]
    names = [f.name for f in bench_figures("crowded", series)]
    assert names == [f"crowded-{n}" for n in ("throughput", "speed", "latency", "acceptance")]
    assert len(drawn) == 4
    for figure, name in zip(drawn, names, strict=True):
        assert covered(figure) == [], name


def test_no_legend_covers_the_timeline(pdir: PlanDir, drawn: list[Any]) -> None:
    """The last task skipped at the end of the run: its x lies in the lower right corner."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "sleep 0.3"}}
          - {id: b, kind: shell, needs: [a], params: {command: "exit 3"}, retries: {attempts: 2}}
          - {id: c, kind: shell, needs: [a], params: {command: "sleep 0.3"}}
          - {id: d, kind: shell, needs: [c], when: "false", params: {command: "true"}}
    """)
    run_orch("run", plan, "--keep-going")
    store = Store.open(pdir.store_path(), create=False)
    try:
        write_report(store, pdir.root / "out", kind_sections)
    finally:
        store.close()
    (figure,) = drawn
    assert covered(figure) == []


def test_a_dollar_in_a_label_is_drawn_as_it_is(drawn: list[Any]) -> None:
    """A label from a result document is text, not TeX: invalid mathtext failed the report."""
    label = r"cost $\frac{ and $5"
    bench_figures("d", [(label, crowded("x", 1.0))])
    texts = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert texts == [label.replace("$", r"\$")]  # shown as "cost $\frac{ and $5"


def test_the_timeline_of_a_short_run_spans_the_run(drawn: list[Any]) -> None:
    ran = [
        Attempt("a", 1, 100.0, 100.04, "completed"),
        Attempt("b", 1, 100.04, 100.09, "failed"),
    ]
    marks = [Attempt("c", 0, 100.09, 100.09, "skipped")]
    timeline(["a", "b", "c"], ran, marks, 100.0, 100.1)
    ax = drawn[0].axes[0]
    assert ax.get_xlim() == pytest.approx((0.0, 0.1), abs=0.005)
    # A run with no end recorded (it died): up to the last thing it recorded.
    timeline(["a", "b", "c"], ran, marks, 100.0, None)
    assert drawn[1].axes[0].get_xlim() == pytest.approx((0.0, 0.09), abs=0.005)


def test_the_demo_plans_timeline_fits_its_run(tmp_path: Path, drawn: list[Any]) -> None:
    plan = tmp_path / "demo.yaml"
    shutil.copy(ROOT / "plans" / "demo.yaml", plan)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    store = Store.open(tmp_path / ".orch" / "demo.db", create=False)
    try:
        (run,) = store.runs()
        write_report(store, tmp_path / "out", kind_sections)
    finally:
        store.close()
    length = run["ended_at"] - run["started_at"]
    (figure,) = drawn
    upper = figure.axes[0].get_xlim()[1]
    assert upper == pytest.approx(length, rel=0.05, abs=0.005), (upper, length)
