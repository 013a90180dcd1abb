"""`orch report --run N`: the board and the kinds' sections as run N left them, not today's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from orchestrator.core.findings import Finding
from orchestrator.kinds.sections import Section
from orchestrator.store.db import Store
from orchestrator.views.report import board_after, board_now, write_report

from conftest import PlanDir, run_orch


def board_of(page: Path) -> dict[str, tuple[str, str]]:
    """The page's board: task id -> (status, findings text)."""
    text = page.read_text()
    table = text[text.index("<h2>Board") : text.index("</table>")]
    rows = re.findall(
        r'<tr><td>([^<]*)</td><td>[^<]*</td><td class="[^"]*">([^<]*)</td>'
        r"(?:<td>[^<]*</td>){3}<td>(.*?)</td>",
        table,
    )
    return {task: (status, found) for task, status, found in rows}


@pytest.fixture
def two_runs(pdir: PlanDir) -> Path:
    """Run 1: `a` fails (finding value=run1), `b` is blocked; run 2: `a` completes
    (value=run2), then `b` (seen=run2)."""
    counter = pdir.root / "n"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            params:
              command: |
                n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}
                echo "::finding value=run$n"
                [ $n -ge 2 ]
          - id: b
            kind: shell
            needs: [a]
            params: {{command: "echo ::finding seen=$V", env: {{V: "${{tasks.a.findings.value}}"}}}}
    """)
    assert run_orch("run", plan).returncode != 0
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    return plan


def test_report_of_an_earlier_run_shows_the_board_as_that_run_left_it(
    two_runs: Path, tmp_path: Path
) -> None:
    r = run_orch("report", two_runs, "--run", "1", "-o", tmp_path / "one")
    assert r.returncode == 0, r.stderr
    page = tmp_path / "one" / "report.html"
    assert board_of(page) == {"a": ("failed", "value=run1"), "b": ("blocked", "")}
    text = page.read_text()
    assert "run2" not in text  # nothing of today's board under run 1's title
    assert "<h1>t: run #1 failed</h1>" in text
    assert "each task as run #1 left it" in text and "later runs (up to #2)" in text

    r = run_orch("report", two_runs, "-o", tmp_path / "now")
    assert r.returncode == 0, r.stderr
    now = tmp_path / "now" / "report.html"
    assert board_of(now) == {"a": ("completed", "value=run2"), "b": ("completed", "seen=run2")}
    assert "left it" not in now.read_text()  # today's board says nothing of a replay

    r = run_orch("report", two_runs, "--run", "2", "-o", tmp_path / "two")
    assert board_of(tmp_path / "two" / "report.html") == board_of(now)


def test_the_kinds_sections_are_drawn_from_that_runs_findings(
    two_runs: Path, tmp_path: Path
) -> None:
    asked: list[tuple[str, dict[str, object]]] = []

    def sections_of(kind: str, findings: Mapping[str, Finding]) -> list[Section]:
        asked.append((kind, {k: f.value for k, f in findings.items()}))
        return []

    store = Store.open(two_runs.parent / ".orch" / "t.db", create=False)
    try:
        write_report(store, tmp_path / "one", sections_of, run_id=1)
        assert asked == [("shell", {"value": "run1"})]  # b had no findings then
        asked.clear()
        write_report(store, tmp_path / "now", sections_of)
        assert asked == [("shell", {"value": "run2"}), ("shell", {"seen": "run2"})]
    finally:
        store.close()


def test_the_replay_of_the_latest_run_is_todays_board(two_runs: Path) -> None:
    """The replay and the store's own board agree where nothing happened since the run."""
    store = Store.open(two_runs.parent / ".orch" / "t.db", create=False)
    try:
        latest = store.runs(limit=1)[0]
        replayed, now = board_after(store, latest), board_now(store)
    finally:
        store.close()
    assert [b.task_id for b in replayed] == [b.task_id for b in now] == ["a", "b"]
    for got, want in zip(replayed, now, strict=True):
        assert (got.status, got.attempts, got.run_id, got.findings, got.why) == (
            want.status,
            want.attempts,
            want.run_id,
            want.findings,
            want.why,
        )
        assert got.took == pytest.approx(want.took, abs=0.05)


def test_a_task_forgotten_after_a_run_keeps_that_runs_findings_in_its_replay(
    two_runs: Path, tmp_path: Path
) -> None:
    assert run_orch("forget", two_runs, "b").returncode == 0
    r = run_orch("report", two_runs, "--run", "2", "-o", tmp_path / "two")
    assert r.returncode == 0, r.stderr
    assert board_of(tmp_path / "two" / "report.html")["b"] == ("completed", "seen=run2")
    r = run_orch("report", two_runs, "-o", tmp_path / "now")
    assert board_of(tmp_path / "now" / "report.html")["b"] == ("pending", "")
