"""The analysis in `orch report`: its Markdown rendered as HTML, every character of it escaped,
wide tables scrolling in a box of their own."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import bench_doc

from orchestrator.core.findings import Finding
from orchestrator.kinds.sections import Section
from orchestrator.store.db import Store
from orchestrator.views.report import markdown_html, write_report

import browser
from conftest import PlanDir, run_orch

ANALYSIS = """\
# analyze: speculative decoding against the baseline

Baseline **vllm tiny** (vllm, max_running_requests 8): 94 tok/s; see `orch report PLAN`.
A second line of the same paragraph, \\* not a list.

| candidate | verdict | speed-up |
| --- | :---: | ---: |
| eagle3 | speculation *pays* | 1.3x |
| a \\| b | short row |

## Provenance

- **baseline** (vllm tiny): run #1
  - rejected at concurrency 4: unstable
- **eagle3**: run #1
  continued lazily

3. third
4. fourth

```
$ orch logs plan analyze | head
<b>not bold</b>
```
"""


def test_the_analysis_markdown_becomes_html() -> None:
    got = markdown_html(ANALYSIS, shift=2).replace("\n", "")
    assert "<h3>analyze: speculative decoding against the baseline</h3>" in got
    assert "<h4>Provenance</h4>" in got
    assert (
        "<p>Baseline <strong>vllm tiny</strong> (vllm, max_running_requests 8): 94 tok/s; see "
        "<code>orch report PLAN</code>.A second line of the same paragraph, * not a list.</p>"
    ) in got
    assert (
        '<div class="scroll"><table><thead><tr><th>candidate</th>'
        '<th style="text-align:center">verdict</th><th style="text-align:right">speed-up</th>'
        "</tr></thead><tbody><tr><td>eagle3</td>"
        '<td style="text-align:center">speculation <em>pays</em></td>'
        '<td style="text-align:right">1.3x</td></tr>'
        '<tr><td>a | b</td><td style="text-align:center">short row</td>'
        '<td style="text-align:right"></td></tr></tbody></table></div>'
    ) in got
    assert (
        "<ul><li><strong>baseline</strong> (vllm tiny): run #1"
        "<ul><li>rejected at concurrency 4: unstable</li></ul></li>"
        "<li><strong>eagle3</strong>: run #1continued lazily</li></ul>"
    ) in got
    assert '<ol start="3"><li>third</li><li>fourth</li></ol>' in got
    assert (
        "<pre><code>$ orch logs plan analyze | head&lt;b&gt;not bold&lt;/b&gt;</code></pre>"
    ) in got
    assert "|" not in got.replace("a | b", "").replace("analyze | head", "")  # no raw table


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        ("snake_case_name and _em_", "<p>snake_case_name and <em>em</em></p>"),
        ("2 * 3 * 4", "<p>2 * 3 * 4</p>"),
        ("`a ``b`` c`", "<p><code>a ``b`` c</code></p>"),
        (
            '[docs](https://x.org/?a=1&b="2)',
            '<p><a href="https://x.org/?a=1&amp;b=%222">docs</a></p>',
        ),
        ("[click](javascript:alert(1))", "<p>[click](javascript:alert(1))</p>"),
        ("[x](data:text/html,hi)", "<p>[x](data:text/html,hi)</p>"),
        (
            "![x](https://tracker.example/p.png)",
            '<p>!<a href="https://tracker.example/p.png">x</a></p>',
        ),
        ("<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
        ("a\x1b[31mred\x00\x7f\x9b", "<p>a\\x1b[31mred\\x00\\x7f\\x9b</p>"),
        ("> quoted **x**", "<blockquote><p>quoted <strong>x</strong></p></blockquote>"),
        ("a\u2028b", "<p>a\\u2028b</p>"),  # a line separator is shown as its escape, not a break
    ],
)
def test_inline_markdown_and_hostile_text(markdown: str, html: str) -> None:
    assert markdown_html(markdown).replace("\n", "") == html


# The only markup markdown-it writes here: these tags, these attributes; anything else is
# escaped text (no raw HTML, no image, no link but http(s)).
OWN_MARKUP = re.compile(
    r"</?(?:h[1-6]|p|ul|li|ol|table|thead|tbody|tr|pre|code|strong|em|blockquote|div)>"
    r'|<hr />|<br />|<ol start="\d+">|<div class="scroll">|<code class="language-[^"<>]*">'
    r'|<t[hd](?: style="text-align:(?:left|center|right)")?>|</t[hd]>'
    r'|<a href="(?:https?://[^"<>]*)?">|</a>'  # an empty href goes nowhere
)
PIECES = [
    *"<>&\"'`*_-|#>[]():/\\ \n\t.1aZ!",
    "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\r",
    "javascript:", "https://", "<script>", "</script>", "```", "| --- |", "- ", "1. ",
    "  ", "**", "&amp;", "&#x3c;", "\"><svg onload=alert(1)>", "![i](",
]  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), max_size=60).map("".join))
def test_any_text_gives_only_the_converters_markup(text: str) -> None:
    got = markdown_html(text, shift=2)
    rest = OWN_MARKUP.sub("", got)
    assert "<" not in rest and ">" not in rest, rest
    # every & begins an entity the renderer writes
    assert re.fullmatch(r"(?:[^&]|&(?:amp|lt|gt|quot);)*", rest, re.S), rest
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", got)  # control characters shown


@pytest.mark.parametrize(
    "text",
    [
        "> " * 5000 + "x",  # nested quotes
        "- " * 5000 + "x",  # nested lists
        "**a " * 5000 + "b" + " c**" * 5000,  # nested emphasis
        "*a " * 30000,  # openers without closers: each must not scan the rest
        "_a_b " * 30000,
        "`` " + "``` a " * 20000,  # code spans that never close
        "[" * 5000 + "x" + "](https://a)" * 5000,
    ],
    ids=["quotes", "lists", "emphasis", "openers", "underscores", "ticks", "links"],
)
def test_hostile_nesting_and_size_neither_fail_nor_hang(text: str) -> None:
    started = time.monotonic()
    got = markdown_html(text)
    assert time.monotonic() - started < 5
    # Deeper than maxNesting (16) markdown-it leaves the rest out: bounded, never a crash.
    assert got.count("<blockquote>") <= 16 and got.count("<ul>") <= 16


@pytest.fixture
def hostile_compare(pdir: PlanDir) -> Path:
    """analyze.compare of a candidate whose label (a result document's: text from outside)
    is markup, control characters and TeX."""
    base, cand = pdir.root / "base.json", pdir.root / "cand.json"
    base.write_text(json.dumps(bench_doc("vllm tiny", "bench_base", 1.0)))
    label = "<script>alert(1)</script>\x1b[31m\x07 $\\frac{ <img src=x onerror=alert(2)>"
    cand.write_text(json.dumps(bench_doc(label, "bench_spec", 1.3)))
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: analyze
            kind: analyze.compare
            params: {{baseline: {base}, candidates: {{eagle3: {cand}}}}}
    """)
    r = run_orch("run", plan)
    assert r.returncode == 0, r.stderr
    return plan


def test_the_report_renders_the_analysis_and_escapes_it(hostile_compare: Path) -> None:
    r = run_orch("report", hostile_compare, "--json")
    assert r.returncode == 0, r.stderr  # the label's TeX drew as text, not an error
    out = json.loads(r.stdout)
    assert len(out["figures"]) == 4  # the timeline, throughput, speed, latency
    text = Path(out["report"]).read_text(encoding="utf-8")
    analysis = text[text.index('<div class="md">') :]
    assert "<h3>analyze: speculative decoding against the baseline</h3>" in analysis
    assert '<div class="scroll"><table>\n<thead>\n<tr>\n<th>candidate</th>' in analysis
    assert "<li><strong>baseline</strong> (vllm tiny): run #1" in analysis
    assert "| --- |" not in text and "<pre>" not in analysis  # not the raw Markdown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m\\x07 $\\frac{ &lt;img" in analysis
    assert "<script" not in text and "<img src=x" not in text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)


WIDE = (
    "| "
    + " | ".join(f"throughput_at_concurrency_{c}" for c in range(14))
    + " |\n|"
    + " --- |" * 14
    + "\n| "
    + " | ".join(f"{c}_tokens_per_second_median" for c in range(14))
    + " |\n"
)
PROBE = """JSON.stringify((() => {
  const boxes = Array.from(document.querySelectorAll('.md .scroll')).map(box => {
    const cells = box.querySelectorAll('th');
    const last = cells[cells.length - 1];
    const before = last.getBoundingClientRect().right > box.getBoundingClientRect().right;
    box.scrollLeft = box.scrollWidth;
    return {scroll: box.scrollWidth, client: box.clientWidth,
      overflow: getComputedStyle(box).overflowX, hiddenBefore: before,
      shownAfter: last.getBoundingClientRect().right <= box.getBoundingClientRect().right + 1,
      right: box.getBoundingClientRect().right, text: last.textContent};
  });
  return {page: document.documentElement.scrollWidth,
    view: document.documentElement.clientWidth, body: document.body.getBoundingClientRect().right,
    scripts: document.scripts.length, boxes};
})())"""


async def _measure(ws_url: str, url: str) -> dict[str, Any]:
    """browser.open_page's session, asking the page for its boxes' widths instead."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        cdp = browser._Cdp(ws, [], [0])
        target = await cdp.call("Target.createTarget", url="about:blank")
        attached = await cdp.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = cdp.page(attached["sessionId"])
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url)
        await page.wait_for("Page.loadEventFired")
        got = await page.call("Runtime.evaluate", expression=PROBE, returnByValue=True)
        measured: dict[str, Any] = json.loads(got["result"]["value"])
        return measured


@pytest.mark.skipif(browser.chromium() is None, reason="no chromium here")
def test_a_wide_table_scrolls_in_its_own_box_in_a_browser(
    pdir: PlanDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = pdir.write(
        "name: t\ntasks: [{id: a, kind: shell, params: {command: 'echo ::finding x=1'}}]\n"
    )
    assert run_orch("run", plan).returncode == 0

    def sections_of(kind: str, findings: Mapping[str, Finding]) -> list[Section]:
        return [Section("Analysis", text="# Wide\n\n" + WIDE + "\n<script>alert(1)</script>\n")]

    store = Store.open(pdir.store_path(), create=False)
    try:
        page, _ = write_report(store, pdir.root / "out", sections_of)
    finally:
        store.close()
    monkeypatch.setattr(browser, "_view", _measure)
    got: dict[str, Any] = browser.open_page(page.as_uri())  # type: ignore[assignment]
    assert got["scripts"] == 0
    assert got["page"] <= got["view"], "the page itself scrolls sideways"
    (box,) = got["boxes"]
    assert box["overflow"] == "auto" and box["scroll"] > box["client"] + 100, box
    assert box["right"] <= got["body"] + 1  # the box stays in the page's column
    assert box["hiddenBefore"] and box["shownAfter"], box  # the last column is reachable
    assert box["text"] == "throughput_at_concurrency_13"
