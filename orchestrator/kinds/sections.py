"""What a task kind adds to `orch report` (Task.report): sections of Markdown text, notes and
figures, and the helpers a kind draws its figures with (matplotlib, imported on first use).
The report page (views/report.py) renders them; kinds import this, never the page."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One chart: written as `<name>.png` and inlined in the page."""

    name: str
    title: str
    png: bytes
    caption: str = ""


@dataclass(frozen=True)
class Section:
    """What a kind adds to the report for one task: figures, and text in Markdown (rendered
    by `markdown_html`: headings, pipe tables, lists, paragraphs, code; never raw HTML)."""

    title: str  # the kind's heading, shown under the task's own title
    figures: Sequence[Figure] = ()
    text: str = ""  # Markdown, as the kind writes it to its log (analyze.compare's report)
    notes: Sequence[str] = field(default_factory=tuple)  # one line each, above the figures
    # The answer a person opens the report for (a verdict, a capacity): one line each, plain
    # text. The page gathers every section's at its top, each linked to its section.
    headline: Sequence[str] = field(default_factory=tuple)


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
