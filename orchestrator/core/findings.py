"""Findings: the measured facts tasks leave in the store, and the line form processes print.

Leaf module (no pydantic): the store and the board read findings on the fast `status` path.
"""

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

FindingValue = int | float | str | bool

FINDING_PREFIX = "::finding "
MAX_FINDING_LINE = 64 * 1024  # characters; a longer line is refused unread, not parsed
REJECTED_KEY = "rejected_finding"


class Finding(NamedTuple):
    """A measured fact a task leaves in the store: `throughput = 2370 tok/s`. (A NamedTuple,
    as the store's records are: `orch status` then never imports dataclasses.)"""

    key: str
    value: FindingValue
    unit: str | None = None
    note: str | None = None
    author: str | None = None  # None: the task's own attempt; else who noted it (agent, person)


def parse_finding_line(line: str) -> Finding | None:
    """A finding printed by a subprocess, or None if the line is not one.

    Form: `::finding KEY=VALUE [unit=UNIT] [note=TEXT]`, words quoted as in a shell, e.g.
    `echo "::finding throughput=2370 unit=tok/s note='peak at c=128'"`.

    A line over MAX_FINDING_LINE characters gives a `rejected_finding` whose value is the key
    it meant to set and whose note says why, so the loss shows on the board.
    """
    if not line.startswith(FINDING_PREFIX):
        return None
    if len(line) > MAX_FINDING_LINE:
        meant = re.match(r"[^\s=]{1,128}(?==)", line[len(FINDING_PREFIX) :])
        return Finding(
            REJECTED_KEY,
            meant.group() if meant else "",
            None,
            f"a ::finding line of {len(line):,} characters, over the limit of "
            f"{MAX_FINDING_LINE:,}; not recorded",
        )
    words = split_words(line[len(FINDING_PREFIX) :])
    if words is None:
        return None
    if not words or "=" not in words[0]:
        return None
    key, raw = words[0].split("=", 1)
    extras: dict[str, list[str]] = {}  # word lists, joined once: `+=` would be quadratic
    last = ""
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if sep and name in ("unit", "note"):
            extras[last := name] = [value]
        elif last == "note":  # `echo ::finding x=1 note=no speedup`: the shell ate the quotes
            extras["note"].append(word)
    unit, note = (" ".join(extras[k]) if k in extras else None for k in ("unit", "note"))
    return Finding(key, coerce_value(raw), unit, note)


def split_words(text: str) -> list[str] | None:
    """Words as `shlex.split` (POSIX, no comments) makes them, or None where it would raise
    (an open quote, a trailing backslash). One regex pass: shlex is quadratic on long lines."""
    if _QUOTING.search(text) is None:  # the common line: plain words
        return [w for w in _SPACE.split(text) if w]
    words: list[str] = []
    word: list[str] = []
    in_word = False  # a word may be empty: `''`
    for m in _PIECE.finditer(text):
        kind = m.lastgroup
        if kind == "space":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            continue
        in_word = True
        if kind == "bare":
            word.append(m.group())
        elif kind == "single":
            word.append(m.group()[1:-1])
        elif kind == "double":  # inside "...", a backslash escapes only `"` and itself
            word.append(_DOUBLE_ESCAPE.sub(r"\1", m.group()[1:-1]))
        elif kind == "escape":  # an escaped character outside quotes stands for itself
            word.append(m.group()[1])
        else:  # a quote never closed, or a backslash at the end
            return None
    if in_word:
        words.append("".join(word))
    return words


# shlex's whitespace is exactly these four; `\s` would also split at \f, \v and Unicode spaces.
# Possessive quantifiers: an unclosed quote fails in one pass, without backtracking.
_SPACE = re.compile(r"[ \t\r\n]+")
_QUOTING = re.compile(r"""['"\\]""")
_PIECE = re.compile(
    r"""(?P<space>[ \t\r\n]+)|(?P<bare>[^ \t\r\n'"\\]+)|(?P<single>'[^']*+')"""
    r"""|(?P<double>"(?:[^"\\]++|\\.)*+")|(?P<escape>\\.)|(?P<bad>.)""",
    re.DOTALL,
)
_DOUBLE_ESCAPE = re.compile(r'\\(["\\])')


def coerce_value(raw: str) -> FindingValue:
    """'42' -> 42, '0.42' -> 0.42; anything that would not print back the same stays text
    ('12.10', '1e5', '007', '1_000', 'nan', a 30-digit integer), so nothing is corrupted."""
    if _NUMBER.fullmatch(raw):
        if "." not in raw and _INT64_MIN <= (n := int(raw)) <= _INT64_MAX:
            return n
        if "." in raw and repr(f := float(raw)) == raw and math.isfinite(f):
            return f
    return raw


def checked(finding: Finding) -> Finding:
    """A finding the store can keep exactly: SQLite integers are 64-bit, and only plain
    scalars have a meaning on the board; a value outside that is kept as its text."""
    value = finding.value
    if isinstance(value, bool | str):
        return finding
    if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        return finding
    if isinstance(value, float) and math.isfinite(value):
        return finding
    return Finding(finding.key, str(value), finding.unit, finding.note, finding.author)


_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def summarize(findings: Sequence[Finding]) -> str:
    """Findings inline: `output_tok_s=2370 tok/s, accept_rate=0.42 (no speedup)`."""
    parts = []
    for f in findings:
        by = f"{f.author}: " if f.author else ""  # recorded by an agent or a person
        if f.author and f.key == "note":
            parts.append(f"{by}{f.value}")
            continue
        if isinstance(f.value, bool):
            value = "true" if f.value else "false"
        else:
            value = f"{f.value:.4g}" if isinstance(f.value, float) else str(f.value)
        text = f"{f.key}={value}{' ' + f.unit if f.unit else ''}"
        parts.append(by + (f"{text} ({f.note})" if f.note else text))
    return ", ".join(parts)
