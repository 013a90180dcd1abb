"""`orch report`: one self-contained HTML page and its figures as PNG files beside it.

The page opens offline: figures are inlined as data: URIs, the style is inline, and a
Content-Security-Policy forbids every fetch (a finding is text a process printed; it is
escaped, never markup; a kind's Markdown goes through `markdown_html`, which escapes all of its
text). The engine draws what it knows, whatever the plan does: the run's timeline and the board
with findings (today's, or with `--run N` each task as run N left it). A kind adds sections from
its own findings through `Task.report` (bench.serve's curves, analyze.compare's comparison), so
the engine knows nothing of benchmarks. matplotlib (~0.5 s) is imported only when a kind draws
a figure (kinds/sections.py's `pyplot`): for `orch report`, or a task's report resource of the
MCP server.
"""

from __future__ import annotations

import base64
import functools
import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.durations import format_duration
from orchestrator.core.errors import UsageError
from orchestrator.core.findings import Finding, summarize
from orchestrator.core.safeopen import write_atomically
from orchestrator.core.status import Status
from orchestrator.core.terminal import clean
from orchestrator.kinds.sections import Figure, Section, png_of, pyplot, safe_name
from orchestrator.store.db import Store, decode, runs_dir
from orchestrator.views.sectionfaults import SectionFailure, SectionsOf, sections_or_failure

if TYPE_CHECKING:
    from orchestrator.store.rows import FindingRow, RunRow, TodoRow, TransitionRow

# Colours of a task's attempt by how it ended; colour-blind safe (Okabe-Ito).
OUTCOME_COLOURS: dict[str, str] = {
    Status.COMPLETED: "#009E73",
    Status.FAILED: "#D55E00",
    Status.INTERRUPTED: "#E69F00",
    Status.IN_PROGRESS: "#56B4E9",
    Status.BLOCKED: "#555555",
    Status.SKIPPED: "#8C8C8C",
}


def kind_sections(kind: str, findings: Mapping[str, Finding]) -> Sequence[Section]:
    """What a task's kind adds to the report from its findings (`Task.report`)."""
    from orchestrator.kinds import registry

    try:
        cls = registry.resolve(kind)
    except registry.UnknownKind:
        return ()  # a kind not installed here: the board still shows its findings
    return cls.report(findings) if hasattr(cls, "report") else ()


@dataclass(frozen=True)
class Attempt:
    task_id: str
    attempt: int
    start: float
    end: float | None  # None: still running (or the run died; the board says which)
    outcome: str


def attempts_of(transitions: Sequence[TransitionRow]) -> tuple[list[Attempt], list[Attempt]]:
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


# A bar per task reads well up to this many rows (a figure ~14 inches tall); past it, a row
# per task costs a tick label each and a PNG hundreds of thousands of pixels tall (8,000 tasks
# took ~40 s), and no one reads it. Then the timeline draws the tasks that matter and says so,
# and a histogram shows every attempt.
TIMELINE_ROWS = 40


def with_unlisted(order: Sequence[str], attempts: Sequence[Attempt]) -> list[str]:
    """`order` and then any task that ran but is no longer on the board (removed from the
    plan since): it still ran, so it gets a row."""
    known = set(order)  # a set: `in order` on a list made this quadratic in the plan's size
    return [*order, *dict.fromkeys(a.task_id for a in attempts if a.task_id not in known)]


def timeline_rows(order: Sequence[str], attempts: Sequence[Attempt], limit: int) -> list[str]:
    """The tasks the timeline draws, in plan order: all of them up to `limit`; past it, first
    every task with an attempt that did not complete (failed, interrupted, still running: what
    a person looks for), then the slowest by time spent in attempts, up to `limit`."""
    if len(order) <= limit:
        return list(order)
    spent: dict[str, float] = {}
    trouble: set[str] = set()
    for a in attempts:
        if a.end is not None:
            spent[a.task_id] = spent.get(a.task_id, 0.0) + a.end - a.start
        if a.outcome != Status.COMPLETED:
            trouble.add(a.task_id)
    ranked = sorted(spent.keys() | trouble, key=lambda t: (t not in trouble, -spent.get(t, 0.0)))
    chosen = set(ranked[:limit])
    return [t for t in order if t in chosen]


def run_figures(
    order: Sequence[str],
    attempts: Sequence[Attempt],
    marks: Sequence[Attempt],
    run_start: float,
    run_end: float | None,
) -> list[Figure]:
    """The run's own figures: its timeline, and past TIMELINE_ROWS tasks the durations of
    every attempt beside a timeline of the tasks that matter (its caption says which)."""
    order = with_unlisted(order, [*attempts, *marks])
    if len(order) <= TIMELINE_ROWS:
        return [timeline(order, attempts, marks, run_start, run_end)]
    rows = timeline_rows(order, attempts, TIMELINE_ROWS)
    shown = set(rows)
    caption = (
        f"{len(order)} tasks: a row each would be unreadable, so this shows {len(rows)} of them"
        ", in plan order: every task with an attempt that did not complete, then those whose "
        "attempts took longest. Each bar is one attempt; colour: how it ended. "
        "durations.png shows how long every attempt of every task took."
    )
    return [
        timeline(
            rows,
            [a for a in attempts if a.task_id in shown],
            [m for m in marks if m.task_id in shown],
            run_start,
            run_end,
            caption,
            last_seen=_last_seen(attempts, marks, run_start),  # the whole run's axis
        ),
        durations(attempts),
    ]


def _last_seen(attempts: Sequence[Attempt], marks: Sequence[Attempt], run_start: float) -> float:
    return max([a.end or a.start for a in attempts] + [m.start for m in marks] + [run_start])


def timeline(
    order: Sequence[str],
    attempts: Sequence[Attempt],
    marks: Sequence[Attempt],
    run_start: float,
    run_end: float | None,
    caption: str = "each bar is one attempt of a task; colour: how it ended; x: skipped or "
    "blocked without running",
    last_seen: float | None = None,
) -> Figure:
    """Each task's attempts as bars on the run's clock; failures in their colour, gaps between
    attempts (retry delays, waits for preconditions) visible as gaps, skips and blocks as marks.
    A row for each task of `order` (run_figures keeps them few)."""
    plt = pyplot()
    order = with_unlisted(order, [*attempts, *marks])
    rows = {task: i for i, task in enumerate(order)}
    if last_seen is None:
        last_seen = _last_seen(attempts, marks, run_start)
    # The axis is the run's length, however short (a 0.1 s run is not drawn on a 1 s axis); a
    # run with no recorded end (running, or died) lasts until the last thing it recorded.
    span = max((run_end or last_seen) - run_start, last_seen - run_start, 1e-3)
    # One more row's height for the legend above the plot (outside it: it hides nothing).
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.32 * max(len(rows), 1)))
    if attempts:  # one call for every bar: a call per bar costs ~1.5 ms
        ax.barh(
            [rows[a.task_id] for a in attempts],
            [
                max((a.end if a.end is not None else run_start + span) - a.start, span * 0.003)
                for a in attempts
            ],
            left=[a.start - run_start for a in attempts],
            color=[OUTCOME_COLOURS.get(a.outcome, "#000000") for a in attempts],
            edgecolor="black",
            linewidth=0.4,
            height=0.6,
        )
    for outcome in dict.fromkeys(m.outcome for m in marks):
        these = [m for m in marks if m.outcome == outcome]
        ax.plot(
            [m.start - run_start for m in these],
            [rows[m.task_id] for m in these],
            marker="x",
            linestyle="",
            color=OUTCOME_COLOURS[outcome],
            markersize=7,
        )
    ax.set_yticks(range(len(order)), order, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_xlim(0, span * 1.02)
    ax.grid(axis="x", alpha=0.3)
    _outcome_legend(ax, [a.outcome for a in [*attempts, *marks]])
    fig.tight_layout()
    return Figure("timeline", "Timeline", png_of(fig), caption)


def durations(attempts: Sequence[Attempt]) -> Figure:
    """How long every attempt that ended took, as a histogram coloured by how it ended: the
    whole run at a size that does not grow with the plan."""
    plt = pyplot()
    took: dict[str, list[float]] = {}  # by how the attempt ended
    for a in attempts:
        if a.end is not None:
            took.setdefault(a.outcome, []).append(max(a.end - a.start, 1e-6))
    every = [t for ts in took.values() for t in ts]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    low, high = min(every, default=1e-3), max(every, default=1.0)
    # Tasks of one plan may take 10 ms or an hour: log-spaced bins keep both visible.
    spread = high / low > 20
    bins: Any = [low * (high / low) ** (i / 30) for i in range(31)] if spread else 30
    if spread:
        ax.set_xscale("log")
    outcomes = [s for s in OUTCOME_COLOURS if s in took]
    if outcomes:
        ax.hist(
            [took[s] for s in outcomes],
            bins=bins,
            stacked=True,
            color=[OUTCOME_COLOURS[s] for s in outcomes],
        )
    ax.set_xlabel("seconds an attempt took" + (" (log scale)" if spread else ""))
    ax.set_ylabel("attempts")
    ax.grid(axis="y", alpha=0.3)
    _outcome_legend(ax, outcomes)
    fig.tight_layout()
    return Figure(
        "durations",
        "Attempt durations",
        png_of(fig),
        f"how long each of the run's {len(every)} ended attempts took, every task; "
        "colour: how it ended",
    )


def _outcome_legend(ax: Any, outcomes: Sequence[str]) -> None:
    """The colours of `outcomes`' legend above the axes, in one row: never over a bar or a
    mark."""
    plt = pyplot()
    shown = [s for s in OUTCOME_COLOURS if s in set(outcomes)]
    if shown:
        ax.legend(
            [plt.Rectangle((0, 0), 1, 1, color=OUTCOME_COLOURS[s]) for s in shown],
            [str(s).replace("_", " ") for s in shown],
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            ncol=len(shown),
            fontsize=7,
            frameon=False,
            borderaxespad=0.3,
        )


# --- the board: now, or as a past run left it --------------------------------------------------


@dataclass(frozen=True)
class BoardRow:
    """One task on the page's board, as the run shown left it."""

    task_id: str
    title: str
    kind: str | None
    status: str
    attempts: int
    took: float | None  # seconds its latest attempt ran; None: no attempt ended its last move
    why: str
    run_id: int | None  # the run that last moved it (None: an edit outside any run)
    findings: tuple[Finding, ...]


_EVERY_ROW = 2**62  # a LIMIT that is no limit: the report reads a store's whole history


def board_now(store: Store) -> list[BoardRow]:
    """Today's board: each task's latest status and its latest attempt's findings."""
    findings = store.findings()
    return [
        BoardRow(
            t["id"],
            t["title"],
            t["kind"],
            t["status"],
            t["attempts"] or 0,
            t["ended_at"] - t["started_at"] if t["ended_at"] and t["started_at"] else None,
            t["last_error"] or t["reason"] or "",
            t["run_id"],
            tuple(findings.get(t["id"], ())),
        )
        for t in store.todos()
    ]


def board_after(store: Store, run: RunRow) -> list[BoardRow]:
    """Each task as `run` left it, replayed from the store's transitions and findings.

    In the history: every row of that run and of earlier ones (run ids grow with time; a run
    that died is closed under its own id, before the next run does anything), and rows of no
    run (`orch forget`, notes, added todos) recorded before it ended. A task's state is its
    last such transition (status, attempt, reason); its findings are those of that attempt, as
    `Store.findings` picks them today. Shown: the tasks on the board now that existed then,
    and any task this run moved (one since removed from the plan included)."""
    n, end = run["id"], run["ended_at"]

    def in_history(row: TransitionRow | FindingRow) -> bool:
        if row["run_id"] is not None:
            return bool(row["run_id"] <= n)
        return end is None or row["at"] <= end

    moves, found = store.events_after(0, 0, limit=_EVERY_ROW)
    last: dict[str, TransitionRow] = {}
    started: dict[str, float] = {}
    took: dict[str, float | None] = {}
    moved_here: set[str] = set()
    for t in moves:
        if not in_history(t):
            continue
        task, to = t["task_id"], t["to_status"]
        if to == Status.IN_PROGRESS:
            started[task], took[task] = t["at"], None
        elif t["from_status"] == Status.IN_PROGRESS and task in started:
            took[task] = t["at"] - started.pop(task)
        elif t["from_status"] != to:  # pending again, skipped, blocked: no attempt ended here
            took[task] = None
        last[task] = t
        if t["run_id"] == n:
            moved_here.add(task)
    findings: dict[str, list[Finding]] = {}
    for f in found:
        state = last.get(f["task_id"])
        if state is None or not in_history(f) or f["attempt"] != state["attempt"]:
            continue
        if state["to_status"] == Status.PENDING and f["author"] is None:
            continue  # forgotten: its runs' findings are no longer its own (Store.findings)
        findings.setdefault(f["task_id"], []).append(
            Finding(f["key"], decode(f["value"]), f["unit"], f["note"], f["author"])
        )
    todos: dict[str, TodoRow] = {t["id"]: t for t in store.todos() if t["id"] in last}
    for task in moved_here - todos.keys():
        if (row := store.todo(task)) is not None:
            todos[task] = row
    return [
        BoardRow(
            task,
            t["title"],
            t["kind"],
            last[task]["to_status"],
            last[task]["attempt"] or 0,
            took.get(task),
            last[task]["reason"] or "",
            last[task]["run_id"],
            tuple(findings.get(task, ())),
        )
        for task, t in sorted(todos.items(), key=lambda item: item[1]["position"] or 0)
    ]


def write_report(
    store: Store,
    out_dir: Path,
    sections_of: SectionsOf,
    run_id: int | None = None,
    on_failure: Callable[[SectionFailure], None] = lambda _: None,
) -> tuple[Path, list[Path]]:
    """Write `out_dir/report.html` and a PNG per figure; returns their paths.

    `sections_of(kind, findings)` asks a task's kind for its sections (the CLI resolves kinds;
    a kind that is not installed here adds nothing); a kind that fails gets a section saying
    so, and `on_failure` is told. The board and the sections: today's board, or with
    `run_id`, each task as that run left it."""
    runs = store.runs(limit=1_000_000)
    if not runs:
        raise UsageError(f"{store.path} has no run yet: run the plan first")
    run = next((r for r in runs if r["id"] == run_id), None) if run_id else runs[0]
    if run is None:
        raise UsageError(f"{store.path} has no run #{run_id} (runs: 1-{runs[0]['id']})")
    # No --run: today's board (edits since the latest run included, as `orch status` shows);
    # --run N: the board as N left it, not today's under N's title.
    board = board_now(store) if run_id is None else board_after(store, run)
    moves = store.transitions(run_id=run["id"], limit=_EVERY_ROW)  # this run's alone
    ran, marks = attempts_of(moves)
    figures = (
        run_figures([b.task_id for b in board], ran, marks, run["started_at"], run["ended_at"])
        if moves
        else []
    )
    sections: list[Placed] = []
    anchors: set[str] = set()
    for b in board:
        if b.findings and b.kind:
            # A kind's failure is its section's, not the page's (sectionfaults.py).
            got, failure = sections_or_failure(
                sections_of, b.task_id, b.kind, {f.key: f for f in b.findings}
            )
            sections += [Placed(b, s, _anchor(b.task_id, anchors)) for s in got]
            if failure is not None:
                on_failure(failure)
    out_dir.mkdir(parents=True, exist_ok=True)  # orch's own <store>.report: checked by the CLI
    files = []
    # Each file is a new one renamed into place, never an existing one opened: a link planted
    # at report.html is refused, not written through (core/safeopen.py).
    for fig in figures + [f for p in sections for f in p.section.figures]:
        files.append(out_dir / f"{fig.name}.png")
        write_atomically(files[-1], fig.png)
    page = out_dir / "report.html"
    # utf-8 as the page's <meta charset> says, whatever the locale (write_atomically's text).
    replayed = None if run_id is None else runs[0]["id"]
    write_atomically(page, _page(store, run, replayed, board, figures, sections))
    return page, files


@dataclass(frozen=True)
class Placed:
    """A kind's section on the page: under its task's own title (two analyses are told apart
    by their tasks, not by the kind's heading), at an anchor the answers at the top link to."""

    task: BoardRow
    section: Section
    anchor: str


def _anchor(task_id: str, taken: set[str]) -> str:
    """A unique HTML id for a task's section: its id in letters, digits and `._-` (a store's
    text goes into no attribute unescaped), numbered when a kind gives one task several."""
    base = anchor = f"task-{safe_name(task_id)}"
    n = 1
    while anchor in taken:
        n += 1
        anchor = f"{base}-{n}"
    taken.add(anchor)
    return anchor


# --- Markdown, as kinds write their reports ----------------------------------------------------


def markdown_html(text: str, shift: int = 0) -> str:
    """`text` (Markdown: CommonMark and pipe tables, by markdown-it-py) as HTML. The text is
    the store's, so hostile: raw HTML in it is escaped, links are live only for http(s),
    control characters are shown escaped (`\x1b`) as `orch logs` shows them, and nesting is
    bounded (maxNesting). Headings go `shift` levels down (under the page's own); each table
    sits in a box that scrolls sideways rather than being cut off."""
    md = _markdown()
    tokens = md.parse(clean(text))
    for token in tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(int(token.tag[1]) + shift, 6)}"
    html: str = md.renderer.render(tokens, md.options, {})
    return html


@functools.cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt  # lazily: only `orch report` renders Markdown

    # No images: an offline page must not fetch what the store's text points at.
    md = MarkdownIt("commonmark", {"html": False, "maxNesting": 16}).enable("table")
    md.disable("image")
    md.validateLink = lambda url: url.strip().lower().startswith(("http://", "https://"))  # type: ignore[method-assign]

    def table_open(*_: Any) -> str:
        return '<div class="scroll"><table>\n'

    def table_close(*_: Any) -> str:
        return "</table></div>\n"

    md.add_render_rule("table_open", table_open)
    md.add_render_rule("table_close", table_close)
    return md


# --- the page ----------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;
vertical-align:top;text-align:left}th{background:#f5f5f5}figure{margin:1em 0}
img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:12px}
pre{background:#f8f8f8;padding:1em;overflow-x:auto;font-size:12px}
.completed{color:#00704f}.failed,.blocked{color:#b3470b}.interrupted{color:#9a6a00}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0}.scroll table{margin:0}
.md h3{font-size:1.1em}.md h4,.md h5,.md h6{font-size:1em}
.md p,.md li{overflow-wrap:anywhere}.md td.r,.md th.r{text-align:right}
.md td.c,.md th.c{text-align:center}.md code{background:#f3f3f3;padding:0 .2em;font-size:12px}
.md pre code{background:none;padding:0}.md blockquote{border-left:3px solid #ddd;margin-left:0;
padding-left:1em;color:#444}.past{background:#fff6e0;border:1px solid #e8c872;padding:.5em 1em}
.answers{background:#f3f8f5;border:1px solid #9ccfb8;padding:.2em 1em .6em}
.answers h2{margin-top:.5em}.answers h3{font-size:1em;margin:.8em 0 .2em}.answers ul{margin:0}
.kind{color:#555;font-size:12px;margin-top:-.4em}.headline{font-weight:600}
"""


def _e(value: object) -> str:
    """Text from the store as HTML text: control characters shown (`\\x1b`), markup escaped."""
    return html.escape(clean(str(value)), quote=True)


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
    return summarize([f])  # as the board writes it: true/false, 4 significant digits


def _answers(sections: Sequence[Placed]) -> list[str]:
    """What the page opens with: every section's headline (a verdict, a capacity), under its
    task's title, linked to the section; nothing when no kind gave one."""
    answered = [p for p in sections if p.section.headline]
    if not answered:
        return []
    parts = ['<div class="answers"><h2 id="answers">Answers</h2>']
    for p in answered:
        parts.append(f'<h3><a href="#{p.anchor}">{_e(p.task.title or p.task.task_id)}</a></h3><ul>')
        parts += [f"<li>{_e(h)}</li>" for h in p.section.headline]
        parts.append("</ul>")
    parts.append("</div>")
    return parts


def _page(
    store: Store,
    run: RunRow,
    replayed: int | None,  # the latest run's id when the board is replayed (board_after)
    board: Sequence[BoardRow],
    figures: Sequence[Figure],
    sections: Sequence[Placed],
) -> str:
    plan = store.plan_name() or store.path.stem
    took = (
        format_duration(run["ended_at"] - run["started_at"])
        if run["ended_at"]
        else "still running or died"
    )
    rows = []
    for b in board:
        found = "<br>".join(_e(_finding_text(f)) for f in b.findings)
        rows.append(
            f"<tr><td>{_e(b.task_id)}</td><td>{_e(b.title)}</td>"
            f'<td class="{_e(b.status)}">{_e(b.status)}</td>'
            f"<td>{b.attempts}</td>"
            f"<td>{_e(format_duration(b.took) if b.took is not None else '')}</td>"
            f"<td>{'' if b.run_id is None else '#' + str(b.run_id)}</td>"
            f"<td>{found}</td><td>{_e(b.why)}</td></tr>"
        )
    past = []
    if replayed is not None:
        later = (
            f"; later runs (up to #{replayed}) changed it since: <code>orch report</code> "
            "without <code>--run</code> shows today's board"
            if replayed != run["id"]
            else ""
        )
        past.append(
            f'<p class="past">The board and the sections below: each task as run #{run["id"]} '
            "left it, replayed from the store's transitions and findings up to its end"
            f"{later}. Why a pending task did not start is kept for today's board only.</p>"
        )
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        f"<title>orch report: {_e(plan)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(plan)}: run #{run['id']} {_e(run['outcome'] or 'running')}</h1>",
        f"<p>started {_e(_when(run['started_at']))}, {_e(took)}; host {_e(run['host'])}; "
        f"store {_e(store.path)}; logs {_e(runs_dir(store.path) / str(run['id']))}</p>",
        *past,
        *_answers(sections),
        *(_figure_html(f) for f in figures),
        "<h2>Board" + ("" if replayed is None else f" as run #{run['id']} left it") + "</h2>",
        '<div class="scroll"><table><tr><th>task</th><th>title</th><th>status</th>'
        "<th>attempts</th><th>took</th><th>run</th><th>findings</th><th>why</th></tr>",
        *rows,
        "</table></div>",
    ]
    for p in sections:
        s, task = p.section, p.task
        parts.append(f'<h2 id="{p.anchor}">{_e(task.title or task.task_id)}</h2>')
        where = f"task {_e(task.task_id)}, {_e(task.kind)}"
        parts.append(f'<p class="kind">{_e(s.title)} · {where}</p>')
        parts += [f'<p class="headline">{_e(h)}</p>' for h in s.headline]
        parts += [f"<p>{_e(n)}</p>" for n in s.notes]
        parts += [_figure_html(f) for f in s.figures]
        if s.text:  # the kind's Markdown; its headings under this section's <h2>
            parts.append(f'<div class="md">{markdown_html(s.text, shift=2)}</div>')
    parts.append(
        f"<p><small>made by orch report at {_e(_when(datetime.now().timestamp()))}"
        "</small></p></body></html>"
    )
    return "\n".join(parts)
