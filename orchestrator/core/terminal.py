"""Terminal facts shared by the board and the run log."""

from __future__ import annotations

import functools
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


# What a terminal acts on: C0 but tab and newline, DEL, C1. With ESC (and CSI, 0x9b) shown as
# text, no escape sequence is left: the rest of one is plain characters.
_CONTROL_CLASS = "\x00-\x08\x0b-\x1f\x7f-\x9f"
_CONTROLS = re.compile(f"[{_CONTROL_CLASS}]")
# What a terminal draws as something else, or as nothing: the format characters (Unicode's Cf:
# bidi embeddings, overrides and isolates, zero-width spaces and joiners, the BOM, the soft
# hyphen, tag characters) and the line and paragraph separators (Zl, Zp), which can make a
# value read as another (Trojan Source, CVE-2021-42574); and lone surrogates (Cs: an
# undecodable byte of a file name), which cannot be printed at all. Written out, not built
# from unicodedata (a scan of every code point: ~100 ms of each `orch status`); Unicode 15's
# Cf is in, and tests/test_shown_text.py holds these against the Python that runs them.
_INVISIBLE_BMP = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
)
_INVISIBLE_ASTRAL = frozenset(
    chr(c)
    for first, last in (
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    )
    for c in range(first, last + 1)
)
_BREAKS = re.compile(r"[\t\n]")


@functools.cache
def _shown_escaped() -> re.Pattern[str]:
    """Every character `clean` escapes, but past the BMP any character (the few there are
    sorted out by _escaped): a class of BMP items alone is one table lookup a character, and
    astral ranges in it would make it five times slower. Compiled at the first text that is
    not ASCII (~0.3 ms: not on every start)."""
    return re.compile(f"[{_CONTROL_CLASS}{_INVISIBLE_BMP}\U00010000-\U0010ffff]")


def _escaped(m: re.Match[str]) -> str:
    # One fixed-length form per character, so each escape is unique and reads back.
    char = m.group()
    code = ord(char)
    if code < 0xA0:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}" if char in _INVISIBLE_ASTRAL else char


def clean(text: str, multiline: bool = True) -> str:
    """`text` (a finding, a note, an error, a path, a process's output) safe to show a person,
    on a terminal or in a pipe: every control character shown escaped, as journalctl does
    (`\\x1b]0;title\\x07`), so nothing it carries can set a title, write the clipboard, clear
    the screen or overwrite a line, and what was there stays visible; every bidi control and
    invisible format character shown as `\\u202e`, as git and GitHub warn of them, so no value
    displays as another. A CR before a newline is dropped (CRLF output). Tabs and newlines
    kept when `multiline`, else each made a space (one value cannot forge a line of its own).
    Every text orch shows a person goes through here; `--json` and `orch logs --raw` give
    the exact value."""
    text = text.replace("\r\n", "\n")
    # isascii() is O(1): ASCII text holds no format character, and the small class is cheaper.
    text = (_CONTROLS if text.isascii() else _shown_escaped()).sub(_escaped, text)
    return text if multiline else _BREAKS.sub(" ", text)
