"""bench.serve's measurement: windows repeated until stable, and artifacts caught before a level
counts, against the real stub server (tests/openai_stub.py) through `orch run`."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tasks.benchmark.params import BenchParams, Outcome
from tasks.benchmark.serve import pinned
from tasks.benchmark.windows import spread, summarize_level, window_problems

from conftest import PlanDir, free_port, run_orch
from test_servers import findings, no_server_left, stub_plan

__all__ = ["no_server_left"]  # the autouse fixture: no server process outlives a test


def bench_plan(stub_args: str, **bench: Any) -> str:
    params = {
        "server": "launch",
        "concurrency": [1, 4],
        "requests": 8,
        "warmup": 1,
        "output_tokens": 12,
        "input_words": 6,
        **bench,
    }
    return stub_plan(
        free_port(),
        stub_args=stub_args,
        extra=f"""
      - id: bench
        kind: bench.serve
        needs: [launch]
        params: {json.dumps(params)}
    """,
    )


def result_of(plan: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(str(findings(plan, "bench")["result"])).read_text())
    return data


def test_levels_are_repeated_until_the_last_windows_agree(pdir: PlanDir) -> None:
    plan = pdir.write(bench_plan("--child", stability=0.5, min_windows=3, max_windows=6))
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    assert "c=1 window 3: " in r.stderr and "agree within" in r.stderr  # progress per window
    result = result_of(plan)
    assert result["schema"] == "orch.bench/v2"
    assert result["source"]["task"] == "bench" and result["source"]["run"] == 1
    assert result["benchmark"]["min_windows"] == 3 and result["benchmark"]["stability"] == 0.5
    for level in result["levels"]:
        assert level["stable"] is True and level["windows"] == 3 == len(level["per_window"])
        values = [w["output_tok_s"] for w in level["per_window"]]
        lo, hi = level["interval"]["output_tok_s"]
        assert (lo, hi) == (min(values), max(values))
        assert level["output_tok_s"] == sorted(values)[1]  # the median of three
        assert level["completed"] == 3 * 8 and level["output_tokens"] == 3 * 8 * 12
        assert level["spread"] <= 0.5 and level["rejected"] == []
    note = next(f["note"] for f in _rows(plan) if f["key"] == "c4.output_tok_s")
    assert note.startswith("median of 3 windows, ")


def test_a_level_that_never_settles_is_kept_and_marked_unstable(pdir: PlanDir) -> None:
    # Every request slower than the last: consecutive windows never agree within 1%.
    plan = pdir.write(
        bench_plan(
            "--drift", concurrency=[2], requests=4, stability=0.01, min_windows=2, max_windows=4
        )
    )
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    (level,) = result_of(plan)["levels"]
    assert level["stable"] is False and level["windows"] == 4  # every clean window kept
    assert level["spread"] > 0.01
    falling = [w["output_tok_s"] for w in level["per_window"]]
    assert falling == sorted(falling, reverse=True)
    note = next(f["note"] for f in _rows(plan) if f["key"] == "c2.output_tok_s")
    assert note.startswith("UNSTABLE, windows differ by up to ")


def test_a_window_with_errors_is_thrown_away_and_measured_again(pdir: PlanDir) -> None:
    plan = pdir.write(
        bench_plan(
            "--fail-streams 2",
            concurrency=[1],
            requests=4,
            warmup=0,
            stability=0.9,
            min_windows=3,
            max_windows=5,
        )
    )
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    (level,) = result_of(plan)["levels"]
    assert level["rejected"] == [
        'window 1: 1 of 4 requests failed (HTTP 500: {"error": "injected failure"})'
    ]
    assert level["windows"] == 3 and level["errors"] == 0  # the kept windows are clean
    got = findings(plan, "bench")
    assert got["c1.rejected_windows"] == 1
    note = next(f["note"] for f in _rows(plan) if f["key"] == "c1.rejected_windows")
    assert note == "1 thrown away: errors (1)"  # the board counts; the log has each reason
    log = run_orch("logs", plan, "bench", cwd=pdir.root).stdout
    assert 'thrown away at c=1: window 1: 1 of 4 requests failed (HTTP 500: {"error"' in log


def test_too_few_clean_windows_fail_the_level_with_the_reasons(pdir: PlanDir) -> None:
    plan = pdir.write(
        bench_plan(
            '--fail-streams "1,5,9"',
            concurrency=[1],
            requests=4,
            warmup=0,
            min_windows=2,
            max_windows=3,
        )
    )
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1
    error = pdir.todo("bench")["last_error"]
    assert error.startswith(
        "c=1: only 0 clean window(s) of 3, 2 needed: window 1: 1 of 4 requests failed"
    ), error


def test_tokens_all_sent_at_once_are_measured_again_then_kept_without_token_timing(
    pdir: PlanDir,
) -> None:
    """Windows whose answers come in one burst are measured again; when every window does,
    the last ones are kept for throughput, with no TTFT or TPOT (never a TPOT of 0) and a note
    that says why. A window with another problem as well is never kept."""
    plan = pdir.write(bench_plan("--burst", min_windows=1, max_windows=2))
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 0, r.stderr
    assert (
        "c=1 window 1 thrown away: 8 of 8 answers arrived with most of their tokens together"
        in r.stderr
        and "c=1 window 2 thrown away" in r.stderr
    )
    assert "c=1: token timing not observed in 1 of the 1 windows kept" in r.stderr
    found = findings(plan, "bench")
    assert "c1.tpot_ms" not in found and "c1.ttft_p50_ms" not in found
    board = json.loads(run_orch("status", plan, "--json", cwd=pdir.root).stdout)["tasks"]
    bench = next(t for t in board if t["id"] == "bench")
    note = next(f["note"] for f in bench["findings"] if f["key"] == "c1.output_tok_s")
    assert "token timing not observed in 1 of them: TTFT/TPOT left out" in note
    failing = ",".join(str(i) for i in range(2, 40, 4))  # one request of each window fails
    other = PlanDir(pdir.root / "errors")
    other.root.mkdir()
    plan = other.write(
        bench_plan(f'--burst --fail-streams "{failing}"', min_windows=1, max_windows=2)
    )
    r = run_orch("run", plan, cwd=other.root)
    assert r.returncode == 1, r.stderr
    assert "only 0 clean window(s) of 2" in (other.todo("bench")["last_error"] or ""), r.stderr


def test_answers_shorter_than_asked_fail_the_level_naming_the_numbers(pdir: PlanDir) -> None:
    plan = pdir.write(bench_plan("--short 5"))
    r = run_orch("run", plan, cwd=pdir.root)
    assert r.returncode == 1
    error = pdir.todo("bench")["last_error"]
    assert error.startswith(
        "c=1: 8 of 8 answers were shorter than asked (median 5 of 12 "
        "tokens) although ignore_eos is set"
    ), error


# --- the checks on constructed windows -----------------------------------------------------------


def outcome(ttft: float, latency: float, tokens: int = 4, asked: int = 4) -> Outcome:
    itl = [] if latency <= ttft else [(latency - ttft) / (tokens - 1)] * (tokens - 1)
    return Outcome(ok=True, ttft=ttft, latency=latency, itl=itl, output_tokens=tokens, asked=asked)


def test_one_unobserved_answer_in_ten_is_left_out_of_the_latency_figures() -> None:
    p = BenchParams(url="http://x", requests=10)
    window = [outcome(0.1, 0.4) for _ in range(9)] + [outcome(0.3, 0.3)]
    level = summarize_level(1, window, 4.0)
    assert level["unobserved"] == 1 and window_problems(level, window, 1, p) == ([], None)
    assert level["tpot_ms"] == pytest.approx(100.0)  # (0.4 - 0.1) / 3, the burst left out
    assert level["ttft_ms"] == pytest.approx(100.0)
    assert level["e2e"]["p99"] > 0 and level["output_tokens"] == 40  # throughput counts it
    two = window[:8] + [outcome(0.3, 0.3)] * 2
    problems, fatal = window_problems(summarize_level(1, two, 4.0), two, 1, p)
    assert fatal is None and len(problems) == 1
    assert problems[0].startswith("2 of 10 answers arrived with most of their tokens together")


def test_one_unobserved_answer_in_a_small_window_does_not_throw_it_away() -> None:
    p = BenchParams(url="http://x", requests=8)
    window = [outcome(0.1, 0.4) for _ in range(7)] + [outcome(0.3, 0.3)]
    assert window_problems(summarize_level(1, window, 4.0), window, 1, p) == ([], None)
    two = window[:6] + [outcome(0.3, 0.3)] * 2
    assert len(window_problems(summarize_level(1, two, 4.0), two, 1, p)[0]) == 1


def test_window_problems_retry_transient_and_fail_systematic_faults() -> None:
    p = BenchParams(url="http://x", requests=8)
    failed = Outcome(ok=False, error="HTTP 503: busy")
    good = [outcome(0.1, 0.4) for _ in range(7)]
    problems, fatal = window_problems(
        summarize_level(4, [*good, failed], 0.5), [*good, failed], 4, p
    )
    assert fatal is None and problems == ["1 of 8 requests failed (HTTP 503: busy)"]
    # Requests one after another although 4 were asked: achieved 0.4 of 4.
    slow = [outcome(0.1, 0.4) for _ in range(8)]
    problems, fatal = window_problems(summarize_level(4, slow, 8.0), slow, 4, p)
    assert problems == ["0.40 requests in flight on average, 4 asked: the load was not applied"]
    _, fatal = window_problems(summarize_level(4, [failed], 1.0), [failed], 4, p)
    assert fatal == "every request failed: HTTP 503: busy"
    short = [outcome(0.1, 0.4, tokens=4, asked=8) for _ in range(8)]
    _, fatal = window_problems(summarize_level(4, short, 0.8), short, 4, p)
    assert fatal is not None and fatal.startswith("8 of 8 answers were shorter than asked")
    loose = BenchParams(url="http://x", requests=8, ignore_eos=False)  # stopping early is fine
    assert window_problems(summarize_level(4, short, 0.8), short, 4, loose) == ([], None)


def test_spread_is_the_largest_deviation_from_the_mean() -> None:
    assert spread([100.0, 100.0, 100.0]) == 0.0
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.1)
    assert spread([100.0, 100.0, 130.0]) == pytest.approx(20 / 110)  # mean 110


def _rows(plan: Path) -> list[dict[str, Any]]:
    doc = json.loads(run_orch("status", plan, "--json").stdout)
    (row,) = [t for t in doc["tasks"] if t["id"] == "bench"]
    return list(row["findings"])


def test_the_load_generator_is_pinned_while_it_measures_and_released_after() -> None:
    """`cpus` puts the measuring thread (and threads it starts, as asyncio's to_thread) on those
    CPUs only, and gives it its CPUs back after; CPUs the host lacks are said, not fatal."""
    everywhere = os.sched_getaffinity(0)
    first = min(everywhere)
    seen: list[set[int]] = []
    with pinned([first, 100_000]) as problem:
        assert problem is None
        assert os.sched_getaffinity(0) == {first}
        child = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        child.start()
        child.join()
    assert seen == [{first}]
    assert os.sched_getaffinity(0) == everywhere
    with pinned([100_000]) as problem:
        assert problem is not None and "100000" in problem and "not pinned" in problem
        assert os.sched_getaffinity(0) == everywhere
    with pinned(None) as problem:
        assert problem is None and os.sched_getaffinity(0) == everywhere
