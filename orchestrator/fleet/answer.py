"""What a host answers, as a schema: the one JSON line `host.py` writes on its stdout, read by
the controller (`roll.judge`) and, for its board, kept in the record and read back from it
(`record.py`), through the same models.

A host is another machine: its line is input. Nothing of it is used before it validates, and
the types are strict (a "0" is not an exit code, a `true` not a count), so what the controller
judges, stores and shows is what the schema says. What does not validate is said in a few
words, host text escaped and cut (`explain`), never a traceback.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

from orchestrator.core.findings import FindingValue
from orchestrator.core.status import RunOutcome, Status
from orchestrator.core.terminal import clean
from orchestrator.fleet.folder import MAX_FILES

# A board of a thousand tasks with their findings is well under 1 MiB; far more is no answer
# orch writes, and is not parsed.
MAX_ANSWER = 8 * 2**20  # characters
MAX_SAID = 300  # characters of host text (or of a reason about it) in a one-line message

# A value from the document as the reason shows it: a few items, a few dozen characters, built
# without ever writing out a huge string first.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 40
_REPR.maxlist = _REPR.maxdict = 4
_REPR.maxlevel = 2

# A time as orch writes it in the record (seconds since the epoch), within what a clock can
# show: a float out of range would make formatting it raise.
Timestamp = Annotated[float, Field(ge=0, le=4e10)]


class _Strict(BaseModel):
    # forbid: the host is the controller's build (host.py checks it), so an unknown key is a
    # sign of a broken answer; no NaN or infinity: JSON has none, and the record would not
    # read back what it wrote. Built when first used: the host imports this module for the
    # field names alone (host.py), and builds none of these.
    model_config = ConfigDict(
        strict=True, extra="forbid", allow_inf_nan=False, frozen=True, defer_build=True
    )


class Finding(_Strict):
    key: str
    value: FindingValue
    unit: str | None = None
    note: str | None = None


class BoardTask(_Strict):
    """A task as the host's orch reported it: what the controller keeps of it (no output tail,
    no log). `id` and `status` are what the board needs; the rest may be absent."""

    id: str
    status: Status
    attempts: int = Field(0, ge=0)
    started_at: str | None = None  # ISO 8601, the host's clock
    ended_at: str | None = None
    duration_s: float | None = None
    last_error: str | None = None
    role: str | None = None  # a compensation or a `finally` task: not the plan's own flow
    findings: list[Finding] = []


class RunResult(_Strict):
    exit_code: int
    outcome: RunOutcome
    run: int | None = None
    store: str | None = None


Sha256 = Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class Ran(_Strict):
    """The plan ran there (or had nothing left to do): its run, its board, and the plan's
    files it holds (name -> sha256: what need not be sent again)."""

    result: RunResult
    board: list[BoardTask]
    build: str
    files: dict[str, Sha256] = Field({}, max_length=MAX_FILES)


class Missing(_Strict):
    """Files the payload sent by digest alone that the host does not hold (any more): the
    controller sends them whole."""

    missing: list[str] = Field(min_length=1, max_length=MAX_FILES)
    build: str


class Progress(_Strict):
    """A running host's tasks as its store has them now (progress.py's answer)."""

    progress: list[BoardTask] = Field(max_length=100_000)


_PROGRESS: TypeAdapter[Progress] = TypeAdapter(Progress)


def read_progress(stdout: str) -> list[BoardTask] | None:
    """The tasks of a progress answer's last line; None for anything that is not one (a
    progress answer is a hint: what does not validate is ignored, the host's own answer says
    the rest)."""
    line = last_answer_line(stdout)
    if line is None or len(line) > MAX_ANSWER:
        return None
    try:
        return _PROGRESS.validate_json(line).progress
    except ValidationError:
        return None


def progress_of(board: Sequence[BoardTask]) -> dict[str, Any]:
    """A running host's plan tasks done (completed or skipped), of how many, and what it runs
    now; its compensations and `finally` tasks are not counted."""
    flow = [t for t in board if t.role is None]
    return {
        "done": sum(t.status.done for t in flow),
        "total": len(flow),
        "running": [t.id for t in board if t.status is Status.IN_PROGRESS],
    }


def progress_line(board: Sequence[BoardTask]) -> str:
    """`2/5 done, at bench`."""
    p = progress_of(board)
    return f"{p['done']}/{p['total']} done" + (
        f", at {', '.join(p['running'])}" if p["running"] else ""
    )


class _Words(BaseModel):
    # May come from another build (the build check and the payload's reading come first):
    # only the words are read, anything beside them ignored.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, defer_build=True)


class Refused(_Words):
    refused: str
    build: str | None = None


class Errored(_Words):
    error: str
    exit_code: int | None = None


@dataclass(frozen=True)
class Unreadable:
    """An answer that is not one: `reason` says what, in a few words."""

    reason: str


def _kind(doc: Any) -> str:
    """Which answer a document is, by its key (as host.py writes them); anything that is not
    an object is read as `ran`, whose schema then says so."""
    if isinstance(doc, dict):
        for key, kind in (("refused", "refused"), ("error", "errored"), ("missing", "missing")):
            if key in doc:
                return kind
    return "ran"


Answer = Annotated[
    Annotated[Ran, Tag("ran")]
    | Annotated[Refused, Tag("refused")]
    | Annotated[Errored, Tag("errored")]
    | Annotated[Missing, Tag("missing")],
    Discriminator(_kind),
]
_ANSWER: TypeAdapter[Ran | Refused | Errored | Missing] = TypeAdapter(Answer)
BOARD: TypeAdapter[list[BoardTask]] = TypeAdapter(list[BoardTask])


def last_answer_line(stdout: str) -> str | None:
    """A host command's stdout's last non-empty line: its answer (what a `python` task prints
    goes to stderr there, so noise before it is not its orch's). None when there is none."""
    lines = [line for line in stdout.split("\n") if line.strip()]
    return lines[-1] if lines else None


def read_answer(stdout: str) -> Ran | Refused | Errored | Missing | Unreadable | None:
    """The host's answer (its stdout's last non-empty line); None when there is no line."""
    if (line := last_answer_line(stdout)) is None:
        return None
    if len(line) > MAX_ANSWER:
        return Unreadable(f"an answer of {len(line):,} characters (at most {MAX_ANSWER:,})")
    try:
        return _ANSWER.validate_json(line)
    except ValidationError as exc:
        return Unreadable(explain(exc, tagged=True))


def explain(exc: ValidationError, tagged: bool = False) -> str:
    """The first problem of `exc` in a few words, where it is and what was there:
    `board[2].status: 'weird' should be 'pending', ... or 'waiting'`. `tagged`: the first
    step of each place is the answer's kind (`ran`), not a key of the document."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = _place(first["loc"][1:] if tagged else first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return one_line(_problem(first, where) + more)


def _problem(error: ErrorDetails, where: str) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "json_invalid":  # the line itself, or a column of the record holding JSON
        said = f"not JSON ({(error.get('ctx') or {}).get('error', msg)})"
        return said if where == _TOP else f"{where}: {said}"
    if kind == "missing":
        return f"{where}: missing"
    if kind == "extra_forbidden":
        return f"{where}: not a key this answer has"
    shown = _REPR.repr(error["input"])
    for lead in ("Input should be ", "Value error, should be "):
        if msg.startswith(lead):
            return f"{where}: {shown} should be {msg.removeprefix(lead)}"
    return f"{where}: {shown}: {msg}"


_TOP = "the answer"


def _place(loc: Sequence[int | str]) -> str:
    """`board[2].status`; the answer itself when the place is its top."""
    text = ""
    for step in loc:
        text += f"[{step}]" if isinstance(step, int) else f".{_REPR.repr(step)[1:-1]}"
    return text.lstrip(".") or _TOP


def one_line(text: str, limit: int = MAX_SAID) -> str:
    """Host text (or a message carrying it) as one line of a message: control characters shown
    escaped, cut to `limit` characters."""
    text = clean(text, multiline=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"
