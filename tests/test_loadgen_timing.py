"""bench.serve's token timing on constructed answers: which answers were timed token by token,
which windows' TTFT and TPOT count for a level, and what the findings then say (the paths
measure_level and BenchServe.run take, without a server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator import Context, Finding
from tasks.analysis.models import Level
from tasks.benchmark.level import merge_windows
from tasks.benchmark.params import UNOBSERVED, BenchParams, Outcome
from tasks.benchmark.serve import BenchServe
from tasks.benchmark.windows import Measured, Windows, summarize_level, window_problems

from helpers_tasks import FindingsSink


def streamed(arrivals: list[float], tokens: int | None = None) -> Outcome:
    """An answer whose token chunks arrived at these times after the send, as one_request
    records it: chunks of one read share a time (a gap of 0)."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    n = len(arrivals) if tokens is None else tokens
    return Outcome(
        ok=True, ttft=arrivals[0], latency=arrivals[-1], itl=gaps, output_tokens=n, asked=n
    )


def steady(ttft: float = 0.05, step: float = 0.02, chunks: int = 32) -> Outcome:
    """Token by token: one chunk a decode step."""
    return streamed([ttft + step * i for i in range(chunks)])


def burst(at: float = 0.7, chunks: int = 32) -> Outcome:
    """Every token in one read (TTFT = end-to-end)."""
    return streamed([at] * chunks)


def split_burst(at: float = 0.7, chunks: int = 32) -> Outcome:
    """The first chunk, then the rest in the next read 0.4 ms later: latency just above TTFT,
    a TPOT of 0.013 ms (the reported run's)."""
    return streamed([at] + [at + 0.0004] * (chunks - 1))


# --- which answers were timed token by token ---------------------------------------------------


def test_an_answer_whose_tokens_arrived_together_is_not_timed_token_by_token() -> None:
    assert not steady().unobserved
    assert burst().unobserved  # all in one read
    split = split_burst()
    assert split.latency > split.ttft and split.unobserved
    # A burst split over four reads 0.3 ms apart: 30 us apart on average, a TPOT no engine
    # makes.
    reads = streamed([0.7] + [0.7 + 0.0003 * (i // 8 + 1) for i in range(31)])
    assert reads.unobserved
    # Three chunks streamed, then the other 29 at once: the answer's mean TPOT (19 ms for a
    # 20 ms decode step) still stands: timed.
    partly = streamed([0.05, 0.07, 0.09] + [0.65] * 29)
    assert not partly.unobserved
    # A client that falls behind and reads two chunks at a time still saw the decode.
    pairs = streamed([0.05 + 0.04 * (i // 2) for i in range(32)])
    assert not pairs.unobserved
    # Speculation: several tokens per chunk, one chunk per step.
    assert not streamed([0.05 + 0.02 * i for i in range(12)], tokens=40).unobserved
    assert not streamed([0.05]).unobserved  # one token: nothing to time after it
    assert not streamed([0.05, 0.0503]).unobserved  # two steps, 0.3 ms apart


def test_a_window_of_split_bursts_has_no_tpot_and_is_measured_again() -> None:
    """Without the rule the window's TPOT was 0.013 ms and the window counted."""
    p = BenchParams(url="http://x", requests=8)
    window = [split_burst() for _ in range(8)]
    figures = summarize_level(1, window, 8 * 0.7)
    assert figures["unobserved"] == 8
    assert figures["tpot_ms"] is None and figures["ttft"] == {} and figures["itl"] == {}
    assert figures["output_tokens"] == 8 * 32  # throughput still counts them
    problems, fatal = window_problems(figures, window, 1, p)
    assert fatal is None and len(problems) == 1 and UNOBSERVED in problems[0]
    assert problems[0].startswith("8 of 8 answers arrived with most of their tokens together")


# --- which windows' timing counts for the level --------------------------------------------------


P = BenchParams(url="http://x", requests=8, min_windows=3, max_windows=3, stability=0.5)


def measure(
    *windows: list[Outcome] | tuple[list[Outcome], float],
    p: BenchParams = P,
    concurrency: int = 1,
) -> Measured:
    """The windows one after another through the level's own bookkeeping, as measure_level
    feeds them; each window's duration has `concurrency` requests in flight on average, or
    as many as its (answers, in flight) pair says."""
    level = Windows(concurrency, p)
    for number, window in enumerate(windows, 1):
        outcomes, in_flight = window if isinstance(window, tuple) else (window, concurrency)
        duration = sum(o.latency for o in outcomes) / in_flight
        if (measured := level.add(number, outcomes, duration, None)) is not None:
            return measured
    return level.end()


def mostly_burst(ttft: float = 0.05, step: float = 0.005) -> list[Outcome]:
    """A window that passes every check but token timing: 7 bursts, and one answer observed
    (with a TPOT far from the clean windows')."""
    return [burst(at=0.05 + 31 * 0.02) for _ in range(7)] + [steady(ttft, step)]


def findings_of(levels: list[dict[str, Any]], tmp_path: Path) -> dict[str, Finding]:
    """What BenchServe.record leaves on the board for these levels."""
    sink = FindingsSink()
    ctx = Context("bench", 1, 1, tmp_path / "bench.log", None, sink)
    BenchServe(P).record(ctx, levels, {}, tmp_path / "bench.json")
    return sink.found


def test_a_window_kept_for_throughput_only_gives_no_ttft_or_tpot(tmp_path: Path) -> None:
    """One clean window (TPOT 20 ms) and two kept for throughput only, each with one observed
    answer (TPOT 5 ms, TTFT 0.3 s): the level's TTFT and TPOT are the clean window's alone,
    and the findings say from how many windows."""
    measured = measure([steady() for _ in range(8)], mostly_burst(0.3), mostly_burst(0.3))
    assert measured.timing_unobserved == 2 and len(measured.windows) == 3
    level = merge_windows(1, measured)
    assert level["tpot_ms"] == pytest.approx(20.0)
    assert level["interval"]["tpot_ms"] == pytest.approx([20.0, 20.0])
    assert level["ttft"]["p99"] == pytest.approx(50.0)  # the clean window's answers only
    assert level["itl"]["mean"] == pytest.approx(20.0)
    assert [w["tpot_ms"] for w in level["per_window"]][1:] == [None, None]
    assert level["completed"] == 24 and level["output_tokens"] == 24 * 32  # throughput: all
    Level.model_validate(level)  # the result analyze.compare reads
    found = findings_of([level], tmp_path)
    assert found["c1.tpot_ms"].value == 20.0
    assert found["c1.tpot_ms"].note == (
        f"median of 1 of 3 windows, 20-20; 2 window(s) left out: {UNOBSERVED}"
    )
    assert found["c1.ttft_p50_ms"].value == 50.0
    assert found["c1.ttft_p50_ms"].note == f"2 window(s) left out: {UNOBSERVED}"
    assert str(found["c1.output_tok_s"].note).endswith(
        f"; {UNOBSERVED} in 2 of them: TTFT/TPOT from the other 1"
    )


def test_a_level_whose_windows_were_all_untimed_has_no_ttft_or_tpot_findings(
    tmp_path: Path,
) -> None:
    """The note says TTFT/TPOT were left out, and they are: not taken from the few answers
    that were observed in windows kept for throughput only."""
    measured = measure(mostly_burst(), mostly_burst(), mostly_burst())
    assert measured.timing_unobserved == 3
    level = merge_windows(1, measured)
    assert level["tpot_ms"] is None and level["ttft_ms"] is None
    assert level["ttft"] == {} and level["tpot"] == {} and level["itl"] == {}
    assert "tpot_ms" not in level["interval"] and "ttft_ms" not in level["interval"]
    assert level["e2e"]["p50"] > 0 and level["output_tok_s"] > 0
    Level.model_validate(level)
    found = findings_of([level], tmp_path)
    assert "c1.tpot_ms" not in found and "c1.ttft_p50_ms" not in found
    assert str(found["c1.output_tok_s"].note).endswith(
        f"; {UNOBSERVED} in 3 of them: TTFT/TPOT left out"
    )


def test_answers_left_out_of_a_clean_level_are_said(tmp_path: Path) -> None:
    one_burst = [steady() for _ in range(7)] + [burst()]  # one in eight: the window counts
    level = merge_windows(1, measure(one_burst, one_burst, one_burst))
    assert level["timing_unobserved"] == 0 and level["unobserved"] == 3
    found = findings_of([level], tmp_path)
    assert found["c1.tpot_ms"].note == (
        "median of 3 windows, 20-20; 3 of 24 answers left out: their tokens arrived together"
    )
    clean = merge_windows(1, measure(*[[steady() for _ in range(8)]] * 3))
    found = findings_of([clean], tmp_path)
    assert found["c1.tpot_ms"].note == "median of 3 windows, 20-20"
    assert found["c1.ttft_p50_ms"].note is None


# --- windows thrown away, on the board -----------------------------------------------------------


def test_thrown_away_windows_are_counted_per_reason_on_the_board(tmp_path: Path) -> None:
    """A count per reason, not every window's reason joined (those stay in the result)."""
    p = BenchParams(url="http://x", requests=8, min_windows=2, max_windows=10, stability=0.5)
    clean = [steady() for _ in range(8)]
    failing = [*clean[:7], Outcome(ok=False, error="HTTP 500: " + "x" * 200)]
    untimed = [burst() for _ in range(8)]
    both = [*untimed[:7], failing[-1]]
    sequential = (clean, 1.0)  # one request in flight of the 4 asked
    measured = measure(
        failing, failing, sequential, untimed, both, failing, clean, clean, p=p, concurrency=4
    )
    level = merge_windows(4, measured)
    assert level["windows"] == 2 and len(level["rejected"]) == 6
    assert level["rejected"][0].startswith("window 1: 1 of 8 requests failed (HTTP 500: xxx")
    assert level["rejected"][2].startswith("window 3: 1.00 requests in flight on average")
    note = findings_of([level], tmp_path)["c4.rejected_windows"].note
    assert note == f"6 thrown away: errors (4), {UNOBSERVED} (2), load not applied (1)"


def test_windows_kept_for_throughput_are_said_among_those_thrown_away(tmp_path: Path) -> None:
    level = merge_windows(1, measure(mostly_burst(), mostly_burst(), mostly_burst()))
    note = findings_of([level], tmp_path)["c1.rejected_windows"].note
    assert note == f"3 thrown away: {UNOBSERVED} (3); 3 of them kept for throughput only"
