"""What a command prints, without click: lines for a person (cleaned), the board, its JSON.

Both front doors print through here: the shortcut (shortcut.py), which answers before click is
imported, and cli.py; so the two cannot print a board or a warning differently.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from orchestrator.views.snapshot import Snapshot

NOTHING_TO_DO = (
    "nothing to do: the plan is unchanged and every task is done (--rerun ID to run one again)"
)


def echo(text: str, stream: TextIO | None = None) -> None:
    """One line (or several) and a flush: a board shown before a long wait is seen at once."""
    stream = stream or sys.stdout
    stream.write(f"{text}\n")
    stream.flush()


def say(text: str, err: bool = False, one_line: bool = False) -> None:
    """Print a line for a person: through `clean`, so no text from outside (a path, a task's
    id or output, a store's value) acts on the terminal or reads as another. Not for JSON
    (its own escaping) nor for a board, whose colours are its own escapes (views clean each
    value they draw). `one_line`: a row of a listing, which no value may break in two."""
    from orchestrator.core.terminal import clean

    echo(clean(text, multiline=not one_line), sys.stderr if err else sys.stdout)


def warn(text: str) -> None:
    say(f"orch: {text}", err=True)


def show(
    snap: Snapshot, as_json: bool, todowrite: bool = False, stream: TextIO | None = None
) -> None:
    from orchestrator.core.terminal import use_color

    stream = stream or sys.stdout
    echo(board_text(snap, as_json, todowrite, use_color(stream)), stream)


def board_text(snap: Snapshot, as_json: bool, todowrite: bool, color: bool) -> str:
    """The board, its JSON, or the todowrite list, as text."""
    from orchestrator.views import board

    if todowrite:
        return json.dumps(board.todowrite(snap.rows, snap.findings), indent=2)
    if as_json:
        return json.dumps(snap.as_json(), indent=2)
    return board.render_board(snap, color=color)
