"""`orch report`: one self-contained HTML page and its figures as PNG files beside it.

The page opens offline: figures are inlined as data: URIs, the style is inline, and a
Content-Security-Policy forbids every fetch (a finding is text a process printed; it is
escaped, never markup). The engine draws what it knows, whatever the plan does: the run's
timeline and the board with findings. A kind adds sections from its own findings through
`Task.report` (bench.serve's curves, analyze.compare's comparison), so the engine knows nothing
of benchmarks. matplotlib is imported only here and only by `orch report` (~0.5 s).
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .durations import format_duration
from .errors import UsageError
from .findings import Finding
from .status import Status
from .store import Store, runs_dir

# Colours of a task's attempt by how it ended; colour-blind safe (Okabe-Ito).
OUTCOME_COLOURS: dict[str, str] = {
    Status.COMPLETED: "#009E73",
    Status.FAILED: "#D55E00",
    Status.INTERRUPTED: "#E69F00",
    Status.IN_PROGRESS: "#56B4E9",
    Status.BLOCKED: "#555555",
    Status.SKIPPED: "#8C8C8C",
}


@dataclass(frozen=True)
class Figure:
    """One chart: written as `<name>.png` and inlined in the page."""

    name: str
    title: str
    png: bytes
    caption: str = ""


@dataclass(frozen=True)
class Section:
    """What a kind adds to the report for one task: figures, and text shown as it is."""

    title: str
    figures: Sequence[Figure] = ()
    text: str = ""
    notes: Sequence[str] = field(default_factory=tuple)  # one line each, above the figures


def kind_sections(kind: str, findings: Mapping[str, Finding]) -> Sequence[Section]:
    """What a task's kind adds to the report from its findings (`Task.report`)."""
    from . import registry

    try:
        cls = registry.resolve(kind)
    except registry.UnknownKind:
        return ()  # a kind not installed here: the board still shows its findings
    return cls.report(findings) if hasattr(cls, "report") else ()


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_of(figure: Any) -> bytes:
    """The matplotlib figure as PNG bytes; the figure is closed (no state kept between charts)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(figure)
    return buffer.getvalue()


def safe_name(text: str) -> str:
    """A file stem from a task id or title: letters, digits, `._-`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:100] or "figure"


@dataclass(frozen=True)
class Attempt:
    task_id: str
    attempt: int
    start: float
    end: float | None  # None: still running (or the run died; the board says which)
    outcome: str


def attempts_of(transitions: Sequence[Any]) -> tuple[list[Attempt], list[Attempt]]:
    """(attempts that ran, tasks that were skipped or blocked without running) from a run's
    transitions, oldest first: an attempt runs from its in_progress to its next transition."""
    ran: list[Attempt] = []
    marks: list[Attempt] = []
    open_: dict[str, tuple[int, float]] = {}
    for t in transitions:
        task, to, at = t["task_id"], t["to_status"], t["at"]
        if to == Status.IN_PROGRESS:
            open_[task] = (t["attempt"] or 0, at)
        elif task in open_:
            attempt, start = open_.pop(task)
            ran.append(Attempt(task, attempt, start, at, to))
        elif to in (Status.SKIPPED, Status.BLOCKED):
            marks.append(Attempt(task, t["attempt"] or 0, at, at, to))
    ran += [Attempt(task, a, start, None, Status.IN_PROGRESS) for task, (a, start) in open_.items()]
    return sorted(ran, key=lambda a: a.start), marks


def timeline(
    order: Sequence[str],
    attempts: Sequence[Attempt],
    marks: Sequence[Attempt],
    run_start: float,
    run_end: float | None,
) -> Figure:
    """Each task's attempts as bars on the run's clock; failures in their colour, gaps between
    attempts (retry delays, waits for preconditions) visible as gaps, skips and blocks as marks."""
    plt = pyplot()
    rows = {task: i for i, task in enumerate(order)}
    end = run_end or max([a.end or a.start for a in attempts] + [run_start + 1.0])
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.32 * max(len(rows), 1)))
    for a in attempts:
        stop = a.end if a.end is not None else end
        ax.barh(
            rows[a.task_id],
            max(stop - a.start, (end - run_start) * 0.003),
            left=a.start - run_start,
            color=OUTCOME_COLOURS.get(a.outcome, "#000000"),
            edgecolor="black",
            linewidth=0.4,
            height=0.6,
        )
    for m in marks:
        ax.plot(
            m.start - run_start,
            rows[m.task_id],
            marker="x",
            linestyle="",
            color=OUTCOME_COLOURS[m.outcome],
            markersize=7,
        )
    ax.set_yticks(range(len(order)), order, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_xlim(0, max(end - run_start, 1.0) * 1.02)
    ax.grid(axis="x", alpha=0.3)
    shown = {a.outcome for a in attempts} | {m.outcome for m in marks}
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=OUTCOME_COLOURS[s]) for s in OUTCOME_COLOURS if s in shown
    ]
    ax.legend(
        handles,
        [str(s).replace("_", " ") for s in OUTCOME_COLOURS if s in shown],
        loc="lower right",
        fontsize=7,
    )
    fig.tight_layout()
    return Figure(
        "timeline",
        "Timeline",
        png_of(fig),
        "each bar is one attempt of a task; colour: how it ended; x: skipped or "
        "blocked without running",
    )


SectionsOf = Callable[[str, Mapping[str, Finding]], Sequence[Section]]


def write_report(
    store: Store, out_dir: Path, sections_of: SectionsOf, run_id: int | None = None
) -> tuple[Path, list[Path]]:
    """Write `out_dir/report.html` and a PNG per figure; returns their paths.

    `sections_of(kind, findings)` asks a task's kind for its sections (the CLI resolves kinds;
    a kind that is not installed here adds nothing)."""
    runs = store.runs(limit=1_000_000)
    if not runs:
        raise UsageError(f"{store.path} has no run yet: run the plan first")
    run = next((r for r in runs if r["id"] == run_id), None) if run_id else runs[0]
    if run is None:
        raise UsageError(f"{store.path} has no run #{run_id} (runs: 1-{runs[0]['id']})")
    todos = store.todos()
    findings = store.findings()
    moves = [t for t in store.transitions(limit=10_000_000) if t["run_id"] == run["id"]]
    ran, marks = attempts_of(moves)
    figures = (
        [timeline([t["id"] for t in todos], ran, marks, run["started_at"], run["ended_at"])]
        if moves
        else []
    )
    sections = []
    for t in todos:
        if found := findings.get(t["id"]):
            sections += [(t["id"], s) for s in sections_of(t["kind"], {f.key: f for f in found})]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for fig in figures + [f for _, s in sections for f in s.figures]:
        files.append(out_dir / f"{fig.name}.png")
        files[-1].write_bytes(fig.png)
    page = out_dir / "report.html"
    page.write_text(_page(store, run, todos, findings, figures, sections))
    return page, files


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;
vertical-align:top;text-align:left}th{background:#f5f5f5}figure{margin:1em 0}
img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:12px}
pre{background:#f8f8f8;padding:1em;overflow-x:auto;font-size:12px}
.completed{color:#00704f}.failed,.blocked{color:#b3470b}.interrupted{color:#9a6a00}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds") if ts else "-"


def _figure_html(fig: Figure) -> str:
    data = base64.b64encode(fig.png).decode()
    return (
        f'<figure><img alt="{_e(fig.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(fig.title)}{': ' + _e(fig.caption) if fig.caption else ''}"
        f" ({_e(fig.name)}.png)</figcaption></figure>"
    )


def _finding_text(f: Finding) -> str:
    text = f"{f.key}={f.value}" + (f" {f.unit}" if f.unit else "")
    return text + (f" ({f.note})" if f.note else "")


def _page(
    store: Store,
    run: Any,
    todos: Sequence[Any],
    findings: Mapping[str, list[Finding]],
    figures: Sequence[Figure],
    sections: Sequence[tuple[str, Section]],
) -> str:
    plan = store.plan_name() or store.path.stem
    took = (
        format_duration(run["ended_at"] - run["started_at"])
        if run["ended_at"]
        else "still running or died"
    )
    rows = []
    for t in todos:
        took_t = (
            format_duration(t["ended_at"] - t["started_at"])
            if t["ended_at"] and t["started_at"]
            else ""
        )
        found = "<br>".join(_e(_finding_text(f)) for f in findings.get(t["id"], []))
        why = _e(t["last_error"] or t["reason"] or "")
        rows.append(
            f"<tr><td>{_e(t['id'])}</td><td>{_e(t['title'])}</td>"
            f'<td class="{_e(t["status"])}">{_e(t["status"])}</td>'
            f"<td>{t['attempts']}</td><td>{_e(took_t)}</td><td>{found}</td>"
            f"<td>{why}</td></tr>"
        )
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        f"<title>orch report: {_e(plan)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(plan)}: run #{run['id']} {_e(run['outcome'] or 'running')}</h1>",
        f"<p>started {_e(_when(run['started_at']))}, {_e(took)}; host {_e(run['host'])}; "
        f"store {_e(store.path)}; logs {_e(runs_dir(store.path) / str(run['id']))}</p>",
        *(_figure_html(f) for f in figures),
        "<h2>Board</h2><table><tr><th>task</th><th>title</th><th>status</th><th>attempts</th>"
        "<th>took</th><th>findings</th><th>why</th></tr>",
        *rows,
        "</table>",
    ]
    for task_id, s in sections:
        parts.append(f'<h2 id="{_e(task_id)}">{_e(s.title)}</h2>')
        parts += [f"<p>{_e(n)}</p>" for n in s.notes]
        parts += [_figure_html(f) for f in s.figures]
        if s.text:
            parts.append(f"<pre>{_e(s.text)}</pre>")
    parts.append(
        f"<p><small>made by orch report at {_e(_when(datetime.now().timestamp()))}"
        "</small></p></body></html>"
    )
    return "\n".join(parts)
