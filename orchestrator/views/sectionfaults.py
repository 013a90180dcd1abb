"""A kind's report section that fails, without taking the report down with it.

`Task.report` is a plugin's code run on the store's findings: one that raises, or returns
something other than Sections, would cost the operator the whole page (the timeline, the
board, every other kind's figures) for one kind's bug. Instead its section says which kind
failed and why, the rest of the page is as usual, and the caller is told (`orch report` names
it on stderr and exits 1, as for a failed task). The error's text is masked (redact.py): it
may quote a finding or a token the kind read; the page escapes it as it does all the store's
text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.findings import Finding
from orchestrator.core.redact import mask
from orchestrator.kinds.sections import Figure, Section

SectionsOf = Callable[[str, Mapping[str, Finding]], Sequence[Section]]


@dataclass(frozen=True)
class SectionFailure:
    """One task's section that its kind could not make."""

    task_id: str
    kind: str
    error: str  # masked

    def __str__(self) -> str:
        return f"the report section of {self.task_id} (kind {self.kind}) failed: {self.error}"

    def section(self) -> Section:
        """What the page shows in its place."""
        return Section(
            f"{self.task_id}: the {self.kind} section failed",
            notes=(f"{self.kind}.report() failed: {self.error}",),
            # Among the answers at the top: whatever this task was run to answer is missing.
            headline=(f"no answer: {self.kind}.report() failed",),
        )


def sections_or_failure(
    sections_of: SectionsOf, task_id: str, kind: str, findings: Mapping[str, Finding]
) -> tuple[list[Section], SectionFailure | None]:
    """The kind's sections for this task, or a section saying it failed and the failure."""
    try:
        return _checked(sections_of(kind, findings)), None
    except Exception as exc:  # any bug of a plugin's; Ctrl-C still stops the report
        failure = SectionFailure(task_id, kind, mask(f"{type(exc).__name__}: {exc}"))
        return [failure.section()], failure


def _checked(got: object) -> list[Section]:
    """`got` as Sections the page can render, or TypeError saying what it was."""
    if isinstance(got, str | bytes | Mapping) or not isinstance(got, Iterable):
        raise TypeError(f"report() returned {type(got).__name__}, not a sequence of Section")
    sections = list(got)  # a generator's own error raised here, inside the guard
    for s in sections:
        if not isinstance(s, Section):
            raise TypeError(f"report() returned a {type(s).__name__} among its sections")
        if (
            not isinstance(s.text, str)
            or not all(isinstance(f, Figure) and isinstance(f.png, bytes) for f in s.figures)
            or isinstance(s.headline, str)  # one line per item: a str would be one a letter
            or not all(isinstance(h, str) for h in s.headline)
        ):
            raise TypeError(f"report()'s section {s.title!r} holds something not text or PNG")
    return sections
