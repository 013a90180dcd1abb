"""The fleet view of `orch report`: one self-contained HTML page and its PNGs, drawn from the
`orch.fleet/v1` document that `orch fleet status --json` prints.

What it adds to the single-host page: a host x task board, a timeline with one row per host,
and each numeric finding compared across hosts, with the hosts that stand out named (a
robust z-score: one slow GPU among many is found, and the spread of the rest does not hide
it). The page opens offline, as `views/report.py`'s does (its style, escaping and inlined
figures are reused): every string of the document is hostile text, escaped wherever it goes.
matplotlib is imported only when a figure is drawn (`kinds.sections.pyplot`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.core.durations import format_duration
from orchestrator.core.safeopen import write_atomically
from orchestrator.core.terminal import clean, plural
from orchestrator.kinds.sections import Figure, png_of, pyplot, safe_name
from orchestrator.views.report import _STYLE, _e, _figure_html

# Robust z-score (Iglewicz & Hoaglin): 0.6745 makes the MAD of normal data estimate sigma.
_Z_SCALE = 0.6745
_Z_LIMIT = 3.5
_FLAT_TOLERANCE = 0.10  # with MAD 0: how far from the median (of |median|) a value may be

# Okabe-Ito, as the single-host timeline: how a task ended.
_COMPLETED, _FAILED, _OTHER = "#009E73", "#D55E00", "#56B4E9"
_DOT, _OUTLIER = "#0072B2", "#D55E00"

# The board's cells: a glyph beside the word, so status reads without colour.
_GLYPHS: dict[str, str] = {
    "completed": "✓",
    "failed": "✗",
    "error": "✗",
    "pending": "·",
    "skipped": "↷",
    "running": "▶",
    "in_progress": "▶",
    "waiting": "⏸",
    "awaiting_approval": "⏸",
    "blocked": "⊘",
    "refused": "⊘",
    "interrupted": "⚠",
    "stopped": "■",
    "unreachable": "⚡",
    "unreadable": "?",
}

_FLEET_STYLE = """
.error,.unreachable,.refused,.unreadable{color:#b3470b}.pending,.skipped{color:#777}
.running,.in_progress,.waiting,.awaiting_approval{color:#0a6fa8}
td.cell{white-space:nowrap}.note{color:#555;font-size:12px}
"""


# --- outliers ----------------------------------------------------------------------------------


def _spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, median absolute deviation) of `values` (not empty)."""
    median = statistics.median(values)
    return median, statistics.median(abs(v - median) for v in values)


def outliers(values: Mapping[str, float]) -> dict[str, float]:
    """Which hosts' values are outliers, each mapped to its robust z-score.

    With fewer than 3 (finite) values nothing is an outlier: two hosts that disagree do not
    say which one is off. Otherwise, from the median and the median absolute deviation (MAD)
    of the values, a host's robust z-score is 0.6745 * (x - median) / MAD (Iglewicz & Hoaglin),
    and it is an outlier when |z| > 3.5. The median and the MAD ignore a few extreme values,
    so a slow host cannot widen the spread that would excuse it, and no more than half of
    the hosts are ever flagged. When the MAD is 0 (most hosts agree exactly), a value is an
    outlier when it differs from the median by more than 10% of |median| (by anything when
    the median is 0), and its z is reported as +inf or -inf. Values that are not finite (NaN,
    inf) are not judged. Scaling every value by the same positive factor flags the same hosts.
    """
    finite = {host: v for host, v in values.items() if math.isfinite(v)}
    if len(finite) < 3:
        return {}
    median, mad = _spread(list(finite.values()))
    found: dict[str, float] = {}
    for host, v in finite.items():
        if mad == 0:
            # 10 * |d| > |m| rather than |d| > 0.1 * |m|: exact for integers, so a scaled
            # fleet is judged the same.
            if 10 * abs(v - median) > abs(median):
                found[host] = math.copysign(math.inf, v - median)
        else:
            z = _Z_SCALE * ((v - median) / mad)  # the ratio first: unchanged by scaling
            if abs(z) > _Z_LIMIT:
                found[host] = z
    return found


def _usual_range(values: Sequence[float]) -> tuple[float, float] | None:
    """The values `outliers` lets pass (its bounds), for the strip plot's band."""
    if len(values) < 3:
        return None
    median, mad = _spread(values)
    reach = _Z_LIMIT * mad / _Z_SCALE if mad else _FLAT_TOLERANCE * abs(median)
    return median - reach, median + reach


# --- comparisons -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One numeric finding of one task, across the hosts that recorded it (in host order)."""

    task: str
    key: str
    unit: str | None
    values: dict[str, float]  # host -> value
    median: float
    low: tuple[str, float]  # (host, value): the first host with the lowest value
    high: tuple[str, float]
    outliers: dict[str, float]  # host -> robust z-score (`outliers`)
    note: str | None = None  # e.g. hosts left out because their unit differs


def _mappings(value: object) -> list[Mapping[str, Any]]:
    """The mappings of a list from the document; anything else in it is ignored."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _roll(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    roll = doc.get("roll")
    return roll if isinstance(roll, Mapping) else {}


def _hosts(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _mappings(doc.get("hosts"))


def _name(host: Mapping[str, Any]) -> str:
    return str(host.get("host", "?"))


def _number(value: object) -> float | None:
    """A finding's value as a float when it is a finite number (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def _unit(value: object) -> str | None:
    return None if value is None else str(value)


def compare_findings(doc: Mapping[str, Any]) -> list[Comparison]:
    """Every (task, finding key) with a numeric value on at least 2 hosts, in the plan's task
    order as first seen in the document, then the keys' order.

    Strings, bools and nulls are not compared. A finding recorded with different units on
    different hosts is compared across the hosts with its most common unit only (the first
    seen on a tie); `note` names the hosts left out."""
    # task -> key -> [(host, value, unit)]; dicts keep the order things are first seen in.
    seen: dict[str, dict[str, dict[str, tuple[float, str | None]]]] = {}
    for host in _hosts(doc):
        name = _name(host)
        for task in _mappings(host.get("tasks")):
            keys = seen.setdefault(str(task.get("id", "?")), {})
            for finding in _mappings(task.get("findings")):
                number = _number(finding.get("value"))
                if number is not None:  # a key recorded twice on a host: the last counts
                    keys.setdefault(str(finding.get("key", "?")), {})[name] = (
                        number,
                        _unit(finding.get("unit")),
                    )
    found: list[Comparison] = []
    for task_id, keys in seen.items():
        for key, by_host in keys.items():
            units = Counter(unit for _, unit in by_host.values())
            unit = units.most_common(1)[0][0] if units else None
            values = {h: v for h, (v, u) in by_host.items() if u == unit}
            if len(values) < 2:
                continue
            note = None
            if len(units) > 1:
                others = [f"{h} ({u or 'no unit'})" for h, (_, u) in by_host.items() if u != unit]
                note = (
                    f"units differ: compared the {len(values)} hosts in {unit or 'no unit'}; "
                    f"left out {plural(len(others), 'host')}: {', '.join(others)}"
                )
            found.append(
                Comparison(
                    task=task_id,
                    key=key,
                    unit=unit,
                    values=values,
                    median=statistics.median(values.values()),
                    low=min(values.items(), key=lambda item: item[1]),
                    high=max(values.items(), key=lambda item: item[1]),
                    outliers=outliers(values),
                    note=note,
                )
            )
    return found


# --- figures -----------------------------------------------------------------------------------


def _label(text: str, limit: int = 40) -> str:
    """Document text as a matplotlib label: one line, bounded, and `$` shown as a dollar
    (an even number of them would otherwise be parsed as mathtext, and may not parse)."""
    text = clean(text, multiline=False)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("$", r"\$")


def _ts(value: object) -> float | None:
    """An ISO 8601 time from the document as a POSIX timestamp; None when absent or invalid."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _host_label(host: Mapping[str, Any]) -> str:
    """`web1 (canary)`, `web2 · batch 1`: the batches read down the timeline's rows."""
    if host.get("canary"):
        return f"{_label(_name(host), 30)} (canary)"
    return f"{_label(_name(host), 30)} · batch {_label(str(host.get('batch', '?')), 8)}"


def _task_colour(status: object) -> str:
    return {"completed": _COMPLETED, "failed": _FAILED}.get(str(status), _OTHER)


@dataclass(frozen=True)
class _Bar:
    row: int
    task: str
    start: float
    end: float | None  # None: not ended (still running, or the host's orch died)
    status: str


def timeline_figure(doc: Mapping[str, Any]) -> Figure | None:
    """One row per host (in the document's order, top to bottom), each task a bar from its
    start to its end on the roll's clock, coloured by how it ended (completed, failed,
    anything else); dashed lines between batches. None when no task has recorded times.

    The clock starts at the roll's start, or at the earliest task when a host's clock put
    one earlier (hosts' clocks may differ from the controller's)."""
    hosts = _hosts(doc)
    bars: list[_Bar] = []
    for row, host in enumerate(hosts):
        for task in _mappings(host.get("tasks")):
            start = _ts(task.get("started_at"))
            if start is not None:
                end = _ts(task.get("ended_at"))
                status = str(task.get("status"))
                bars.append(_Bar(row, str(task.get("id", "?")), start, end, status))
    if not bars:
        return None
    roll = _roll(doc)
    roll_start, roll_end = _ts(roll.get("started_at")), _ts(roll.get("ended_at"))
    origin = min([b.start for b in bars] + ([roll_start] if roll_start is not None else []))
    seen = [b.start if b.end is None else b.end for b in bars]
    seen += [roll_end] if roll_end is not None else []
    span = max(max(seen) - origin, 1e-3)
    scale, unit = (3600.0, "h") if span >= 7200 else (60.0, "min") if span >= 300 else (1.0, "s")

    n = len(hosts)
    font = 8.0 if n < 16 else 6.0 if n < 60 else 5.0
    row_in = 0.3 if n < 16 else 0.16
    width_in, height_in = 10.0, min(1.3 + row_in * n, 26.0)  # 200 hosts: ~2900 px, not 4000
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    # Whether a task's id fits in its bar: the axes' share of the width (after the host
    # labels), a character's width at the label's size, and the bar's height in points.
    axes_in = width_in * 0.78
    inner = font - 1
    bar_pt = 0.65 * (height_in - 1.0) / max(n, 1) * 72
    for b in bars:
        stop = b.end if b.end is not None else origin + span
        left, width = (b.start - origin) / scale, max(stop - b.start, span * 0.003) / scale
        ax.barh(
            b.row,
            width,
            left=left,
            height=0.65,
            color=_task_colour(b.status),
            edgecolor="black",
            linewidth=0.3,
        )
        text = _label(b.task, 24)
        if width * scale / span * axes_in > (len(text) * 0.6 * inner + 4) / 72 and bar_pt >= inner:
            ax.text(
                left + width / 2,
                b.row,
                text,
                ha="center",
                va="center",
                fontsize=inner,
                color="white" if b.status in ("completed", "failed") else "black",
                clip_on=True,
            )
    timed = {b.row for b in bars}
    for row, host in enumerate(hosts):
        if row not in timed:  # not run (yet), unreachable, refused: say so on its row
            state = _label(str(host.get("state", "")), 20)
            detail = host.get("detail")
            words = f"{state}: {_label(str(detail), 60)}" if detail else state
            ax.text(0, row, f" {words}", va="center", fontsize=inner, color="#555", style="italic")
        if row and host.get("batch") != hosts[row - 1].get("batch"):
            ax.axhline(row - 0.5, color="#999", linestyle="--", linewidth=0.6)
    ax.set_yticks(range(n), [_host_label(h) for h in hosts], fontsize=font)
    ax.set_ylim(n - 0.5, -0.5)  # the first host on top
    ax.set_xlim(0, span / scale * 1.02)
    ax.set_xlabel(f"{unit} since the roll started", fontsize=font + 1)
    ax.tick_params(axis="x", labelsize=font)
    ax.grid(axis="x", alpha=0.3)
    shown = {_task_colour(b.status) for b in bars}
    legend = [(c, w) for c, w in [(_COMPLETED, "completed"), (_FAILED, "failed")] if c in shown]
    if _OTHER in shown:
        legend.append((_OTHER, "other (running, interrupted, ...)"))
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=c) for c, _ in legend],
        [w for _, w in legend],
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),  # above the axes: it hides no bar
        ncol=len(legend),
        fontsize=7,
        frameon=False,
        borderaxespad=0.3,
    )
    fig.tight_layout()
    return Figure(
        "fleet-timeline",
        "Timeline",
        png_of(fig),
        "one row per host, top to bottom in roll order; each bar is a task on the roll's "
        "clock; dashed lines separate batches",
    )


_LABELLED = 15  # outliers named in a strip plot at most; the table names them all


def findings_figure(comparison: Comparison) -> Figure:
    """One finding across hosts: a dot per host at its value (spread up and down so equal
    values stay visible), the median as a line, the band `outliers` lets pass shaded, and the
    outliers in their colour, named."""
    c = comparison
    hosts = list(c.values)
    xs = [c.values[h] for h in hosts]
    n = len(hosts)
    # Golden-ratio jitter: deterministic (the same roll draws the same picture), evenly spread.
    ys = [((i * 0.6180339887) % 1.0 - 0.5) * 0.8 for i in range(n)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 2.4 if n <= 50 else 3.2))
    size = 36 if n <= 30 else 16 if n <= 100 else 9
    usual = _usual_range(xs)
    if usual is not None:
        ax.axvspan(*usual, color="#eeeeee", zorder=0, label="not an outlier")
    plain = [i for i, h in enumerate(hosts) if h not in c.outliers]
    odd = [i for i, h in enumerate(hosts) if h in c.outliers]
    ax.scatter([xs[i] for i in plain], [ys[i] for i in plain], s=size, color=_DOT, alpha=0.75)
    ax.axvline(c.median, color="black", linestyle="--", linewidth=1, label=f"median {c.median:.4g}")
    if odd:
        ax.scatter(
            [xs[i] for i in odd],
            [ys[i] for i in odd],
            s=size * 1.8,
            color=_OUTLIER,
            edgecolor="black",
            linewidth=0.6,
            label="outlier",
            zorder=3,
        )
        # The most extreme first; alternate above and below so neighbours' names do not meet.
        named = sorted(odd, key=lambda i: -abs(c.outliers[hosts[i]]))[:_LABELLED]
        for k, i in enumerate(named):
            ax.annotate(
                _label(hosts[i], 30),
                (xs[i], ys[i]),
                xytext=(4, 7 if k % 2 == 0 else -11),
                textcoords="offset points",
                fontsize=7,
                color=_OUTLIER,
            )
    low, high = min(xs), max(xs)
    pad = (high - low) * 0.08 or max(abs(high) * 0.05, 1.0)
    ax.set_xlim(low - pad, high + pad)  # the data, not the band, sets the axis
    ax.set_ylim(-0.6, 0.6)
    ax.set_yticks([])
    unit = f" ({_label(c.unit, 20)})" if c.unit else ""
    ax.set_xlabel(f"{_label(c.key)}{unit}", fontsize=8)
    ax.set_title(f"{_label(c.task)} · {_label(c.key)}: {n} hosts", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    more = len(odd) - _LABELLED
    return Figure(
        safe_name(f"fleet-{c.task}-{c.key}"),
        f"{c.task} · {c.key} across hosts",
        png_of(fig),
        "a dot per host; dashed: the median; shaded: the values no outlier test flags"
        + (f"; {more} more outliers named in the table" if more > 0 else ""),
    )


# --- the page ----------------------------------------------------------------------------------


def write_fleet_report(doc: Mapping[str, Any], out_dir: Path) -> tuple[Path, list[Path]]:
    """Write `out_dir/fleet.html` and each figure as a PNG beside it (`fleet-timeline.png`,
    `fleet-<task>-<key>.png`); returns (the page, the PNGs)."""
    comparisons = compare_findings(doc)
    timeline = timeline_figure(doc)
    strips: list[Figure] = []
    taken = {"fleet-timeline", "fleet"}
    for c in comparisons:
        fig = findings_figure(c)
        name, k = fig.name, 1
        while name in taken:  # two ids that safe_name makes one: never overwrite a PNG
            k += 1
            name = f"{fig.name}-{k}"
        taken.add(name)
        strips.append(Figure(name, fig.title, fig.png, fig.caption))
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = []
    for fig in ([timeline] if timeline else []) + strips:
        pngs.append(out_dir / f"{fig.name}.png")
        write_atomically(pngs[-1], fig.png)  # never through a link: core/safeopen.py
    page = out_dir / "fleet.html"
    write_atomically(page, _page(doc, timeline, list(zip(comparisons, strips, strict=True))))
    return page, pngs


def _num(value: float) -> str:
    return f"{value:.4g}"


def _status(word: object, extra: str = "") -> str:
    """A status as a board cell's content: glyph and word, coloured by a known class only."""
    text = str(word) if word is not None else "-"
    css = f' class="{text}"' if text in _GLYPHS else ""
    return f"<span{css}>{_GLYPHS.get(text, '?')} {_e(text)}{extra}</span>"


def _roll_html(doc: Mapping[str, Any]) -> list[str]:
    roll = _roll(doc)
    start, end = _ts(roll.get("started_at")), _ts(roll.get("ended_at"))
    took = ""
    if start is not None and end is not None and end >= start:
        took = f" (took {format_duration(end - start)})"
    undoes = roll.get("rollback_of")
    facts = [
        (f"rollback of roll #{_e(undoes)} " if undoes else "roll ") + _status(roll.get("state")),
        f"canary {_e(roll.get('canary'))}",
        f"serial {_e(roll.get('serial'))}",
        f"max-fail {_e(roll.get('max_fail', '0'))}",
        f"inventory {_e(roll.get('inventory'))}",
        f"build {_e(roll.get('build'))}",
        f"started {_e(roll.get('started_at') or '-')}",
        f"ended {_e(roll.get('ended_at') or '-')}{_e(took)}",
    ]
    if roll.get("approved_by"):
        facts.append(
            f"approved by {_e(roll['approved_by'])} at {_e(roll.get('approved_at') or '-')}"
        )
    parts = [f"<p>{' · '.join(facts)}</p>"]
    if roll.get("detail"):
        parts.append(f"<p><b>{_e(roll['detail'])}</b></p>")
    if roll.get("note"):
        parts.append(f"<p>note: {_e(roll['note'])}</p>")
    states = Counter(str(h.get("state")) for h in _hosts(doc))
    counts = ", ".join(f"{k} {_e(state)}" for state, k in states.items())
    parts.append(
        f"<p>{plural(sum(states.values()), 'host')}{': ' + counts if counts else ''}; "
        f"record {_e(doc.get('record', '-'))}</p>"
    )
    return parts


def _board_html(doc: Mapping[str, Any]) -> list[str]:
    hosts = _hosts(doc)
    tasks = list(
        dict.fromkeys(str(t.get("id", "?")) for h in hosts for t in _mappings(h.get("tasks")))
    )
    head = "".join(f"<th>{_e(t)}</th>" for t in tasks)
    rows = []
    for h in hosts:
        by_id = {str(t.get("id", "?")): t for t in _mappings(h.get("tasks"))}
        cells = []
        for task_id in tasks:
            t = by_id.get(task_id)
            if t is None:
                cells.append("<td></td>")
                continue
            attempts = t.get("attempts")
            extra = f" ×{attempts}" if isinstance(attempts, int) and attempts > 1 else ""
            why = f' title="{_e(t["last_error"])}"' if t.get("last_error") else ""
            cells.append(f'<td class="cell"{why}>{_status(t.get("status"), _e(extra))}</td>')
        batch = "canary" if h.get("canary") else _e(h.get("batch", "-"))
        rows.append(
            f"<tr><td>{_e(_name(h))}</td><td>{batch}</td>"
            f'<td class="cell">{_status(h.get("state"))}</td>'
            f"<td>{_e(h.get('detail') or '')}</td>{''.join(cells)}</tr>"
        )
    return [
        "<h2>Hosts</h2>",
        '<div class="scroll"><table><tr><th>host</th><th>batch</th><th>state</th>'
        f"<th>detail</th>{head}</tr>",
        *rows,
        "</table></div>",
    ]


def _findings_html(pairs: Sequence[tuple[Comparison, Figure]]) -> list[str]:
    parts = ["<h2>Findings across hosts</h2>"]
    if not pairs:
        return parts + [
            "<p>Nothing to compare: no task recorded a numeric finding on two or more hosts.</p>"
        ]
    parts.append(
        '<p class="note">An outlier: a robust z-score (0.6745 · (value − median) / MAD) '
        "beyond ±3.5; when most hosts agree exactly (MAD 0), more than 10% from the median "
        "(z shown as ±inf). Fewer than 3 hosts: no outliers.</p>"
    )
    rows = []
    for i, (c, _) in enumerate(pairs):
        unit = f" {c.unit}" if c.unit else ""
        odd = "<br>".join(
            _e(f"{h}: {_num(c.values[h])}{unit}, z={z:.1f}") for h, z in c.outliers.items()
        )
        rows.append(
            f'<tr><td>{_e(c.task)}</td><td><a href="#cmp-{i}">{_e(c.key)}</a></td>'
            f"<td>{_e(c.unit or '')}</td><td>{len(c.values)}</td><td>{_e(_num(c.median))}</td>"
            f"<td>{_e(f'{_num(c.low[1])} ({c.low[0]})')}</td>"
            f"<td>{_e(f'{_num(c.high[1])} ({c.high[0]})')}</td>"
            f"<td>{odd or 'none'}</td><td class=note>{_e(c.note or '')}</td></tr>"
        )
    parts += [
        '<div class="scroll"><table><tr><th>task</th><th>finding</th><th>unit</th>'
        "<th>n hosts</th><th>median</th><th>lowest (host)</th><th>highest (host)</th>"
        "<th>outliers</th><th>note</th></tr>",
        *rows,
        "</table></div>",
    ]
    for i, (c, fig) in enumerate(pairs):
        parts.append(f'<h3 id="cmp-{i}">{_e(c.task)} · {_e(c.key)}</h3>')
        if c.note:
            parts.append(f'<p class="note">{_e(c.note)}</p>')
        parts.append(_figure_html(fig))
    return parts


def _page(
    doc: Mapping[str, Any],
    timeline: Figure | None,
    pairs: Sequence[tuple[Comparison, Figure]],
) -> str:
    title = f"Fleet: {_e(doc.get('plan', '?'))} roll #{_e(_roll(doc).get('id', '?'))}"
    made = datetime.now().isoformat(sep=" ", timespec="seconds")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        # As the single-host page: nothing is fetched, whatever the document's text says.
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        f"<title>{title}</title><style>{_STYLE}{_FLEET_STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
        *_roll_html(doc),
        *_board_html(doc),
        "<h2>Timeline</h2>",
        _figure_html(timeline) if timeline else "<p>No task has recorded times yet.</p>",
        *_findings_html(pairs),
        f"<p><small>made by orch report at {_e(made)}</small></p></body></html>",
    ]
    return "\n".join(parts)
