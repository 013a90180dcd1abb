"""Terminal facts shared by the board and the run log."""

from __future__ import annotations

import os
import re
from typing import TextIO


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 task`, `2 tasks`, `0 tasks`; `many` where adding an s is wrong (process, processes)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def terminal_width(fallback: int = 100) -> int:
    """Columns of the terminal on stdout (or $COLUMNS), as shutil.get_terminal_size gives them;
    written out because importing shutil (bz2, lzma) costs ~2 ms of every `orch status`."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(1).columns
        except OSError:  # not a terminal
            columns = 0
    return columns or fallback


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, never when NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


# Whole escape sequences first, so no parameter bytes are left to be read as text by a later
# sequence; then single control characters. Once every ESC is gone, what is left is plain text.
_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor moves, screen clears
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"  # any other ESC x, or a lone ESC
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 but tab and newline, DEL, C1
)
_BREAKS = re.compile(r"[\t\n]")


def clean(text: str, multiline: bool = True) -> str:
    """`text` (a finding, a note, an error, a process's output) safe to print on a terminal:
    every control sequence and control character removed; tabs and newlines kept when
    `multiline`, else each made a space (one value cannot forge a line of its own)."""
    text = _CONTROLS.sub("", text)
    return text if multiline else _BREAKS.sub(" ", text)
