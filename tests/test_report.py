"""`orch report`: the page, its figures, and how a real browser shows them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.findings import Finding
from orchestrator.kinds.sections import Section
from orchestrator.views.report import attempts_of
from orchestrator.views.sectionfaults import sections_or_failure
from tasks.benchmark.serve import BenchServe

from browser import blankness, check_page
from conftest import PlanDir, run_orch


def level(c: int, tok_s: float, tpot: float, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    got: dict[str, Any] = {
        "concurrency": c,
        "achieved_concurrency": c * 0.97,
        "output_tok_s": tok_s,
        "tpot_ms": tpot,
        "ttft_ms": 20.0 + c,
        "windows": 3,
        "stable": True,
        "spread": 0.04,
        "interval": {
            "output_tok_s": [tok_s * 0.96, tok_s * 1.03],
            "tpot_ms": [tpot * 0.98, tpot * 1.02],
        },
        "ttft": {"mean": 21.0 + c, "p50": 20.0 + c, "p90": 30.0 + c, "p99": 40.0 + c},
        "tpot": {"mean": tpot, "p50": tpot, "p90": tpot * 1.2, "p99": tpot * 1.5},
    }
    if spec:
        got["spec"] = spec
    return got


def bench_doc(
    label: str, task: str, speed: float, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "schema": "orch.bench/v2",
        "label": label,
        "source": {"run": 1, "task": task, "at": "2026-12-03T12:00:00+00:00"},
        "levels": [level(c, 100 * c * speed / (1 + c / 16), 7.0 / speed, spec) for c in (1, 4, 16)],
        "server": {"engine": "vllm", "version": "0.32.0"},
        "benchmark": {"tool": "orch bench.serve", "output_tokens": 64, "requests": 32},
    }


@pytest.fixture
def compared(pdir: PlanDir) -> Path:
    """A finished plan: a flaky step that failed once, a skip, a hostile finding, and an
    analyze.compare of two constructed benchmark results."""
    spec = {"accept_length": 2.2, "draft_tokens": 3, "acceptance": 0.4, "alpha": 0.55}
    base, cand = pdir.root / "base.json", pdir.root / "cand.json"
    base.write_text(json.dumps(bench_doc("vllm tiny", "bench_base", 1.0)))
    cand.write_text(json.dumps(bench_doc("eagle3", "bench_spec", 1.3, spec)))
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: flaky
            kind: shell
            retries: {{attempts: 2, delay: 200ms}}
            params: {{command: "echo x >> {pdir.root}/n; [ $(wc -l < {pdir.root}/n) -ge 2 ]"}}
          - id: hostile
            kind: shell
            params:
              command: [echo, "::finding html='<script>alert(1)</script><img src=x>'"]
          - {{id: never, kind: shell, when: "false", params: {{command: "true"}}}}
          - id: analyze
            kind: analyze.compare
            params: {{baseline: {base}, candidates: {{eagle3: {cand}}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    return plan


def test_the_report_has_the_timeline_board_and_every_kinds_figures(compared: Path) -> None:
    r = run_orch("report", compared, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    page = Path(out["report"])
    names = sorted(Path(f).name for f in out["figures"])
    assert names == [
        "compare-acceptance.png",
        "compare-latency.png",
        "compare-speed.png",
        "compare-throughput.png",
        "timeline.png",
    ]
    for figure in out["figures"]:
        assert blankness(Path(figure).read_bytes()) > 0.01, figure
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 5  # inlined: the page stands alone
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x&gt;" in text
    assert "<script>" not in text and "src=x" not in text.replace("src=x&gt;", "")
    assert "default-src 'none'" in text  # nothing is ever fetched, even from a finding
    assert "eagle3" in text and "Analysis: baseline and candidates" in text


def test_attempts_of_a_retried_task_are_two_bars_and_a_skip_is_a_mark(compared: Path) -> None:
    import sqlite3

    with sqlite3.connect(compared.parent / ".orch" / "t.db") as conn:
        conn.row_factory = sqlite3.Row
        moves = conn.execute("SELECT * FROM transitions ORDER BY seq").fetchall()
    ran, marks = attempts_of(moves)
    flaky = [(a.attempt, a.outcome) for a in ran if a.task_id == "flaky"]
    assert flaky == [(1, "failed"), (2, "completed")]
    assert [(m.task_id, m.outcome) for m in marks] == [("never", "skipped")]
    first, second = (a for a in ran if a.task_id == "flaky")
    assert first.end is not None and second.start - first.end >= 0.2  # the retry delay shows


def test_report_without_a_run_or_of_a_missing_run_is_a_usage_error(pdir: PlanDir) -> None:
    plan = pdir.write("name: t\ntasks: [{id: a, kind: shell, params: {command: 'true'}}]\n")
    assert run_orch("run", plan).returncode == 0
    r = run_orch("report", plan, "--run", "99")
    assert r.returncode == 2 and "has no run #99 (runs: 1-1)" in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_serve_draws_its_own_result_and_says_when_it_cannot(tmp_path: Path) -> None:
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps(bench_doc("vllm tiny", "bench_base", 1.0)))
    (section,) = BenchServe.report({"result": Finding("result", str(doc))})
    assert [f.name for f in section.figures] == [
        "bench_base-throughput",
        "bench_base-speed",
        "bench_base-latency",
    ]  # no spec: no tau
    doc.unlink()
    (section,) = BenchServe.report({"result": Finding("result", str(doc))})
    assert not section.figures and "cannot be read" in section.notes[0]


def test_the_report_renders_in_a_real_browser(compared: Path, tmp_path: Path) -> None:
    r = run_orch("report", compared, "--json")
    view = check_page(Path(json.loads(r.stdout)["report"]), tmp_path)
    assert view.title == "orch report: t"
    assert len(view.images) == 5


def test_a_kind_whose_report_fails_gets_its_section_said_failed_not_the_page(
    pdir: PlanDir,
) -> None:
    """One kind's report raises (quoting a secret and markup), another's returns a string:
    the page is written all the same, with the board and the healthy kind's section; each
    failed section names its kind and the error, masked and escaped; stderr names them; exit 1.
    """
    tests = str(Path(__file__).parent)
    plan = pdir.write("""
        name: t
        vars:
          token: {env: ORCH_TEST_TOKEN}
        tasks:
          - {id: fine, kind: "helpers_tasks:Reported"}
          - {id: broken, kind: "helpers_tasks:BrokenReport"}
          - {id: garbage, kind: "helpers_tasks:GarbageReport"}
    """)
    token = "sk-rep0rt-T0KEN-42"
    env = {"ORCH_TEST_TOKEN": token, "PYTHONPATH": tests}
    assert run_orch("run", plan, env=env).returncode == 0
    r = run_orch("report", plan, "--json", env=env)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    page = Path(json.loads(r.stdout)["report"])
    html = page.read_text()
    assert "Reported fine" in html and "the healthy section" in html  # the rest as usual
    assert all(f"<td>{task}</td>" in html for task in ("fine", "broken", "garbage"))  # board
    assert token not in html + r.stdout + r.stderr
    assert (
        "helpers_tasks:BrokenReport.report() failed: RuntimeError: &lt;b&gt;no&lt;/b&gt; "
        "access with ***" in html
    )
    assert "helpers_tasks:GarbageReport.report() failed: TypeError: report() returned str" in html
    # What those tasks were run to answer is missing: the answers at the top say so.
    top = html[: html.index("<h2>Board")]
    for kind in ("BrokenReport", "GarbageReport"):
        assert f"<li>no answer: helpers_tasks:{kind}.report() failed</li>" in top
    for task, kind in (("broken", "BrokenReport"), ("garbage", "GarbageReport")):
        assert f"the report section of {task} (kind helpers_tasks:{kind}) failed" in r.stderr
    assert "access with ***" in r.stderr
    failed = json.loads(r.stdout)["failed"]
    assert [f["task"] for f in failed] == ["broken", "garbage"]


def test_the_page_opens_with_the_answers_linked_to_sections_headed_by_task_titles(
    pdir: PlanDir, tmp_path: Path
) -> None:
    """Two tasks of one kind (whose sections share the kind's heading) give verdicts; the page
    opens with both, each under its task's title and linked to its section, before the
    timeline and the board; each section is headed by its task's title. A section with no
    headline is not among the answers."""
    plan = pdir.write("""
        name: t
        tasks:
          - {id: step, kind: shell, params: {command: "true"}}
          - id: eagle
            title: "EAGLE-3 against the baseline"
            kind: "helpers_tasks:Answered"
            needs: [step]
            params: {verdict: "eagle3 pays: 1.31x"}
          - id: ngram
            title: "n-gram drafting against the baseline"
            kind: "helpers_tasks:Answered"
            needs: [step]
            params: {verdict: "ngram does not pay"}
          - {id: fine, title: "A quiet step", kind: "helpers_tasks:Reported"}
    """)
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    assert run_orch("run", plan, env=env).returncode == 0
    r = run_orch("report", plan, "--json", env=env)
    assert r.returncode == 0, r.stderr
    page = Path(json.loads(r.stdout)["report"])
    text = page.read_text()
    answers = text[text.index('<h2 id="answers">') : text.index("</div>", text.index("answers"))]
    assert text.index('id="answers"') < text.index('alt="Timeline"') < text.index("<h2>Board")
    for task, title, verdict in (
        ("eagle", "EAGLE-3 against the baseline", "verdict: eagle3 pays: 1.31x"),
        ("ngram", "n-gram drafting against the baseline", "verdict: ngram does not pay"),
    ):
        assert f'<h3><a href="#task-{task}">{title}</a></h3><ul>\n<li>{verdict}</li>' in answers
        assert "<li>capacity: 12 req/s</li>" in answers
        # The section itself: after the board, headed by the task's title at that anchor.
        heading = f'<h2 id="task-{task}">{title}</h2>'
        assert text.count(heading) == 1 and text.index(heading) > text.index("<h2>Board")
    assert "A quiet step" not in answers and '<h2 id="task-fine">A quiet step</h2>' in text
    # The kind's shared heading is under each title, not a heading of its own.
    assert "<h2>Analysis: baseline and candidates</h2>" not in text
    assert text.count('<p class="kind">Analysis: baseline and candidates · task ') == 2
    check_page(page, tmp_path)  # as a real browser draws it: no error, the timeline shown


def test_a_headline_given_as_one_string_is_the_kinds_error_not_a_line_a_letter() -> None:
    def sections(kind: str, findings: object) -> list[Section]:
        return [Section("Verdict", headline="pays")]  # type: ignore[arg-type]

    got, failure = sections_or_failure(sections, "t", "k", {})
    assert failure is not None and "holds something not text or PNG" in failure.error
    assert got == [failure.section()]
