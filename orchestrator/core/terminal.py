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


# C0 but tab and newline, DEL, C1: what a terminal acts on. With ESC (and CSI, 0x9b) shown as
# text, no escape sequence is left: the rest of one is plain characters.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BREAKS = re.compile(r"[\t\n]")


def _escaped(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def clean(text: str, multiline: bool = True) -> str:
    """`text` (a finding, a note, an error, a process's output) safe to print, on a terminal or
    in a pipe: every control character shown escaped, as journalctl does (`\\x1b]0;title\\x07`),
    so nothing it carries can set a title, write the clipboard, clear the screen or overwrite
    a line, and what was there stays visible; a CR before a newline is dropped (CRLF output).
    Tabs and newlines kept when `multiline`, else each made a space (one value cannot forge a
    line of its own)."""
    text = _CONTROLS.sub(_escaped, text.replace("\r\n", "\n"))
    return text if multiline else _BREAKS.sub(" ", text)
