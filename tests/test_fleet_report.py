"""The fleet report: which hosts stand out, what is compared across hosts, and the page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.fleet.report import (
    compare_findings,
    findings_figure,
    outliers,
    timeline_figure,
    write_fleet_report,
)

PNG = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert(1)</script>"


def task(
    tid: str,
    status: str = "completed",
    start: str | None = None,
    end: str | None = None,
    findings: list[dict[str, Any]] | None = None,
    last_error: str | None = None,
) -> dict[str, Any]:
    return {
        "id": tid,
        "status": status,
        "attempts": 1 if start else 0,
        "started_at": start,
        "ended_at": end,
        "duration_s": None,
        "last_error": last_error,
        "findings": findings or [],
    }


def finding(
    key: str, value: Any, unit: str | None = None, note: str | None = None
) -> dict[str, Any]:
    return {"key": key, "value": value, "unit": unit, "note": note}


def host(
    name: str, batch: int, tasks: list[dict[str, Any]], state: str = "completed"
) -> dict[str, Any]:
    return {
        "host": name,
        "batch": batch,
        "canary": batch == 0,
        "state": state,
        "detail": None,
        "started_at": None,
        "ended_at": None,
        "tasks": tasks,
    }


def doc_of(hosts: list[dict[str, Any]], **roll: Any) -> dict[str, Any]:
    return {
        "schema": "orch.fleet/v1",
        "plan": "migration",
        "record": "plans/.orch/migration.fleet.db",
        "roll": {
            "id": 1,
            "state": "completed",
            "started_at": "2026-12-05T06:50:00+00:00",
            "ended_at": "2026-12-05T06:52:00+00:00",
            "canary": 1,
            "serial": "1",
            "inventory": "inv.yml",
            "build": "0.1.0+abc123",
            "approved_by": "root@vm",
            "approved_at": "2026-12-05T06:51:00+00:00",
            "note": None,
            "detail": None,
            **roll,
        },
        "hosts": hosts,
    }


def at(seconds: int) -> str:
    return f"2026-12-05T06:{50 + seconds // 60:02d}:{seconds % 60:02d}+00:00"


def timed_host(name: str, batch: int, tok_s: float, note: str | None = None) -> dict[str, Any]:
    """A host that stopped prod, installed and benchmarked: `tok_s` its throughput."""
    base = 10 * batch
    return host(
        name,
        batch,
        [
            task("stop_prod", start=at(base), end=at(base + 1)),
            task("install", start=at(base + 1), end=at(base + 5)),
            task(
                "bench",
                start=at(base + 5),
                end=at(base + 9),
                findings=[
                    finding("tok_s", tok_s, "tok/s", note),
                    finding("engine", "vllm"),
                    finding("stable", True),
                ],
            ),
        ],
    )


# --- outliers ----------------------------------------------------------------------------------


def test_a_clear_outlier_among_five_hosts_is_found_with_its_sign() -> None:
    slow = outliers({"a": 810.0, "b": 812.0, "c": 805.0, "d": 815.0, "e": 400.0})
    assert list(slow) == ["e"] and slow["e"] < -3.5
    fast = outliers({"a": 810.0, "b": 812.0, "c": 805.0, "d": 815.0, "e": 1600.0})
    assert list(fast) == ["e"] and fast["e"] > 3.5


def test_one_of_three_hosts_forty_percent_off_is_found() -> None:
    found = outliers({"web1": 100.0, "web2": 101.0, "web3": 60.0})
    assert list(found) == ["web3"] and found["web3"] < 0


def test_equal_values_and_two_hosts_have_no_outlier() -> None:
    assert outliers({"a": 5.0, "b": 5.0, "c": 5.0, "d": 5.0}) == {}
    assert outliers({"a": 1.0, "b": 1000.0}) == {}
    assert outliers({}) == {}


def test_with_mad_zero_only_a_value_ten_percent_off_the_median_is_an_outlier() -> None:
    assert outliers({"a": 100.0, "b": 100.0, "c": 100.0, "d": 95.0}) == {}
    assert outliers({"a": 100.0, "b": 100.0, "c": 100.0, "d": 80.0}) == {"d": -math.inf}
    assert outliers({"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.001}) == {"d": math.inf}


def test_values_that_are_not_finite_are_not_judged() -> None:
    assert outliers({"a": 1.0, "b": math.nan, "c": 1.1}) == {}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(10**6), 10**6), min_size=3, max_size=50))
def test_outliers_flag_at_most_half_and_do_not_depend_on_scale(ints: list[int]) -> None:
    values = {f"h{i}": float(v) for i, v in enumerate(ints)}
    found = outliers(values)
    assert len(found) <= len(values) / 2
    assert outliers({h: v * 3.0 for h, v in values.items()}).keys() == found.keys()


# --- comparisons -------------------------------------------------------------------------------


def test_numeric_findings_are_compared_across_hosts_and_the_rest_ignored() -> None:
    doc = doc_of(
        [
            host("a", 0, [task("t", findings=[finding("x", 1), finding("s", "yes")])]),
            host("b", 1, [task("t", findings=[finding("x", 3.0), finding("flag", True)])]),
            host(
                "c",
                1,
                [task("t", findings=[finding("x", 2.0), finding("only_here", 9.0)]), task("u")],
            ),
            host("d", 1, [task("t", findings=[finding("x", None)])]),
            host("e", 2, [], state="pending"),
        ]
    )
    (c,) = compare_findings(doc)
    assert (c.task, c.key, c.unit) == ("t", "x", None)
    assert c.values == {"a": 1.0, "b": 3.0, "c": 2.0}
    assert c.median == 2.0 and c.low == ("a", 1.0) and c.high == ("b", 3.0)
    assert c.outliers == {} and c.note is None


def test_comparisons_follow_the_plan_order() -> None:
    both = [finding("y", 1.0), finding("x", 2.0)]
    doc = doc_of(
        [host(h, 0, [task("first", findings=both), task("second", findings=both)]) for h in "ab"]
    )
    assert [(c.task, c.key) for c in compare_findings(doc)] == [
        ("first", "y"),
        ("first", "x"),
        ("second", "y"),
        ("second", "x"),
    ]


def test_a_finding_in_different_units_compares_the_hosts_of_the_common_unit() -> None:
    doc = doc_of(
        [
            host("a", 0, [task("t", findings=[finding("lat", 20.0, "ms")])]),
            host("b", 1, [task("t", findings=[finding("lat", 0.021, "s")])]),
            host("c", 1, [task("t", findings=[finding("lat", 22.0, "ms")])]),
            host("d", 1, [task("t", findings=[finding("lat", 21.0, "ms")])]),
        ]
    )
    (c,) = compare_findings(doc)
    assert c.unit == "ms" and c.values == {"a": 20.0, "c": 22.0, "d": 21.0}
    assert c.note is not None and "b (s)" in c.note and "ms" in c.note
    # One host per unit: nothing left to compare.
    split = doc_of(
        [
            host("a", 0, [task("t", findings=[finding("lat", 20.0, "ms")])]),
            host("b", 1, [task("t", findings=[finding("lat", 0.021, "s")])]),
        ]
    )
    assert compare_findings(split) == []


# --- figures and the page ----------------------------------------------------------------------


def test_no_times_no_timeline() -> None:
    doc = doc_of([host(h, i, [task("a"), task("b")], state="pending") for i, h in enumerate("xyz")])
    assert timeline_figure(doc) is None
    assert timeline_figure(doc_of([])) is None


def test_timeline_and_strip_of_many_hosts_are_pngs_of_bounded_size() -> None:
    hosts = [timed_host(f"gpu{i:03d}", 1 + i // 50, 800.0 + i % 7) for i in range(200)]
    hosts[17]["tasks"][2]["findings"][0]["value"] = 90.0
    hosts.append(host("down$1$", 9, [], state="unreachable"))  # mathtext-looking name
    doc = doc_of(hosts)
    timeline = timeline_figure(doc)
    assert timeline is not None and timeline.png.startswith(PNG)
    (c,) = compare_findings(doc)
    assert list(c.outliers) == ["gpu017"]
    strip = findings_figure(c)
    assert strip.png.startswith(PNG) and strip.name == "fleet-bench-tok_s"


def test_the_page_shows_hosts_tasks_outliers_and_escapes_the_document(tmp_path: Path) -> None:
    doc = doc_of(
        [
            timed_host("web1", 0, 812.5),
            timed_host("web2", 1, 808.0, note=HOSTILE),
            timed_host(HOSTILE, 1, 61.0),
        ],
        detail=HOSTILE,
    )
    doc["hosts"][1]["tasks"][1]["status"] = "failed"
    doc["hosts"][1]["tasks"][1]["last_error"] = f'exit 1 "{HOSTILE}"'
    page, pngs = write_fleet_report(doc, tmp_path / "out")
    text = page.read_text(encoding="utf-8")
    assert page == tmp_path / "out" / "fleet.html"
    assert "Fleet: migration roll #1" in text
    for name in ("web1", "web2", "stop_prod", "install", "bench"):
        assert name in text
    # The slow host is named among the outliers in the findings table.
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    findings = text.split("Findings across hosts", 1)[1]
    outlier_cell = findings.split("</tr>")[1]
    assert f"{escaped}: 61 tok/s, z=" in outlier_cell
    assert "<script" not in text.lower() and escaped in text
    assert "data:image/png;base64," in text and "http" not in text.replace("http-equiv", "")
    assert [p.name for p in pngs] == ["fleet-timeline.png", "fleet-bench-tok_s.png"]
    for png in pngs:
        assert png.parent == page.parent and png.read_bytes().startswith(PNG)


def test_the_page_says_when_nothing_is_compared(tmp_path: Path) -> None:
    doc = doc_of([host(h, i, [task("a")], state="pending") for i, h in enumerate("xyz")])
    page, pngs = write_fleet_report(doc, tmp_path)
    text = page.read_text(encoding="utf-8")
    assert pngs == [] and "Nothing to compare" in text and "No task has recorded times" in text
