"""Text shown to a person goes through one function, `clean` (issue 39): control characters as
`\\xNN`, bidi controls and invisible format characters as `\\uXXXX` (Trojan Source,
CVE-2021-42574), in every command and every message; `--json` and `orch logs --raw` stay exact.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.errors import UsageError
from orchestrator.core.terminal import clean

from conftest import ORCH, PlanDir, run_orch

# OSC title and BEL, CSI clear screen, C1 CSI, a right-to-left override, the four isolates, a
# zero-width space, a line separator, a BOM: each would act, or read as something else.
PAYLOAD = (
    "\x1b]0;PWN\x07 \x1b[2J \x9b1m A\u202eB \u2066\u2067\u2068\u2069 z\u200bw l\u2028s \ufeffbom"
)
RAW = ["\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200b"]
RAW += ["\u2028", "\ufeff"]
SHOWN = ["\\x1b]0;PWN\\x07", "\\u202e", "\\u2066\\u2067\\u2068\\u2069", "\\u200b", "\\u2028"]
SHOWN += ["\\ufeff"]
ESCAPED_CATEGORIES = {"Cf", "Zl", "Zp", "Cs"}
VAR = "A\u202eB\u2066C\u2069\u200bD"


def orch_bytes(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """`orch ARGS` with stdout and stderr as bytes: what reaches the terminal, exactly."""
    return subprocess.run(
        [ORCH, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "LANG": "C.UTF-8"},
    )


def assert_shown_escaped(done: subprocess.CompletedProcess[bytes], *shown: str) -> str:
    """No character of RAW in stdout or stderr, each of `shown` in one of them."""
    for name, stream in (("stdout", done.stdout), ("stderr", done.stderr)):
        for char in RAW:
            assert char.encode() not in stream, (name, repr(char), stream)
    text = (done.stdout + done.stderr).decode()
    for escape in shown:
        assert escape in text, (escape, text)
    return text


# --- the function ----------------------------------------------------------------------------

ESCAPE = re.compile(r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})")


def unescape(shown: str) -> str:
    return ESCAPE.sub(lambda m: chr(int(next(g for g in m.groups() if g), 16)), shown)


hostile_text = st.text(
    st.one_of(
        st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Cs"]),
        st.characters(codec="utf-8"),
        st.characters(),
    )
)


@given(hostile_text, st.booleans())
def test_clean_leaves_nothing_that_acts_or_hides_and_each_escape_reads_back(
    text: str, multiline: bool
) -> None:
    """No Cc but tab and newline (and those only when multiline), no Cf, Zl, Zp or Cs in what
    clean gives; without a backslash in the input (one it cannot tell from an escape), the
    escapes read back to the input: each character has its own."""
    shown = clean(text, multiline)
    for char in shown:
        category = unicodedata.category(char)
        assert category not in ESCAPED_CATEGORIES, repr(char)
        assert category != "Cc" or (multiline and char in "\t\n"), repr(char)
    if "\\" not in text and multiline:
        assert unescape(shown) == text.replace("\r\n", "\n")


def test_clean_escapes_exactly_this_pythons_format_characters() -> None:
    """Held against the unicodedata of the Python that runs it: every Cf, Zl, Zp and Cs code
    point is escaped; whatever else is escaped is a control character, or unassigned here (a
    format character of a later Unicode)."""
    missed, extra = [], []
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        escaped = clean(char) != char
        if category in ESCAPED_CATEGORIES and not escaped:
            missed.append(hex(code))
        if escaped and category not in (*ESCAPED_CATEGORIES, "Cc", "Cn"):
            extra.append(hex(code))
    assert not missed and not extra, (missed[:20], extra[:20])
    assert clean("\u00ad\u202e\U000e0041") == "\\u00ad\\u202e\\U000e0041"  # \u, \U: fixed width


# --- every command ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose finding, note, output, error, transition reason and argv hold PAYLOAD, and
    so do its paths (the store's in the board's headline, the logs' in its failure tail)."""
    root = tmp_path_factory.mktemp("shown") / f"dir{PAYLOAD}"
    root.mkdir()
    plan = root / "plan.yaml"
    plan.write_text(
        "name: t\nvars: {v: x}\ntasks:\n"
        "  - {id: src, kind: python, params: {function: 'json:loads', "
        f"args: {{s: {json.dumps(json.dumps(PAYLOAD))}}}}}}}\n"
        "  - {id: out, kind: shell, params: {command: [python3, -c, "
        "'import sys; sys.stdout.buffer.write(sys.argv[1].encode()); sys.exit(3)', "
        f"{json.dumps(PAYLOAD)}]}}}}\n"
        "  - {id: err, kind: python, params: {function: 'codecs:encode', "
        f"args: {{obj: x, encoding: {json.dumps(PAYLOAD)}}}}}}}\n"
    )
    # The run's argv, in `orch history`: YAML (a --var's value) takes no control character.
    assert orch_bytes("run", plan, "--keep-going", "--var", f"v={VAR}").returncode == 1
    assert orch_bytes("todo", "note", plan, "src", PAYLOAD).returncode == 0
    return plan


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("events",),
        ("events", "-n", "3"),
        ("history",),
        ("history", "--transitions"),
        ("history", "--task", "err"),
    ],
)
def test_commands_show_every_payload_escaped(hostile: Path, args: tuple[str, ...]) -> None:
    """The board (findings, the note, the failure tail: error and output), the event feed,
    the run list (its argv) and the transitions (their reasons) print none of the payload's
    characters, in a pipe, and show their escapes."""
    done = orch_bytes(*args, hostile)
    if args == ("history",):  # the runs: their argv
        assert_shown_escaped(done, "A\\u202eB\\u2066C\\u2069\\u200bD")
        return
    shown = assert_shown_escaped(done, *SHOWN)
    if args == ("status",):  # the failure tail: the error, the output's last lines, the log
        assert "err failed: LookupError: unknown encoding: \\x1b]0;PWN" in shown
        assert "    | \\x1b]0;PWN\\x07" in shown
        assert re.search(r"full log: .*/dir\\x1b\]0;PWN.*/out\.log", shown)


def test_logs_escape_and_raw_gives_the_bytes(hostile: Path) -> None:
    """`orch logs` shows the output escaped; `--raw` prints the log's bytes as they are."""
    assert_shown_escaped(orch_bytes("logs", hostile, "out"), *SHOWN)
    assert_shown_escaped(orch_bytes("logs", hostile, "out", "--path"), *SHOWN)
    raw = orch_bytes("logs", hostile, "out", "--raw")
    assert raw.returncode == 0 and PAYLOAD.encode() in raw.stdout


def test_json_is_exact_and_ascii(hostile: Path) -> None:
    """--json keeps each value exact for a program, and is ASCII (json.dumps' ensure_ascii):
    a person reading it raw sees `\\u202e`, never the character."""
    for args in (("status", "--json"), ("history", "--json"), ("events", "--json")):
        done = orch_bytes(*args, hostile)
        assert done.stdout.isascii(), args
    status = json.loads(orch_bytes("status", hostile, "--json").stdout)
    tasks = {t["id"]: t for t in status["tasks"]}
    found = {(f["key"], f["author"]): f["value"] for f in tasks["src"]["findings"]}
    assert found == {("result", None): PAYLOAD, ("note", "person"): PAYLOAD}
    assert tasks["err"]["last_error"] == f"LookupError: unknown encoding: {PAYLOAD}"
    # (The tail is cut in lines as str.splitlines does: at U+2028 too.)
    assert PAYLOAD.split("\u2028")[0] in tasks["out"]["output_tail"]


# --- refusals --------------------------------------------------------------------------------


def test_refusals_quote_what_was_typed_escaped(pdir: PlanDir) -> None:
    """A --var with a hostile name, a missing plan whose path holds ESC, click's own usage
    errors (an extra argument, an unknown command): exit 2, escaped."""
    plan = pdir.write(
        "name: t\nvars: {v: 1}\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n"
    )
    cases = [
        ("validate", plan, "--var", f"{PAYLOAD}=1"),
        ("run", pdir.root / f"missing{PAYLOAD}.yaml"),
        ("status", pdir.root / f"missing{PAYLOAD}.yaml"),
        ("validate", plan, f"extra{PAYLOAD}"),
        (f"bogus{PAYLOAD}",),
        (f"--bogus{PAYLOAD}",),
    ]
    for args in cases:
        done = orch_bytes(*args, cwd=pdir.root)
        assert done.returncode == 2, (args, done.stderr)
        assert_shown_escaped(done, *SHOWN)


def test_a_damaged_stores_text_is_quoted_escaped_and_cut(pdir: PlanDir) -> None:
    """A store damaged with hostile text (a status no orch writes; bytes that are not UTF-8,
    which sqlite3 quotes "with text '...'"): refused, exit 2, the text escaped and cut short."""
    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    assert run_orch("run", plan).returncode == 0
    store = pdir.store_path()
    long_tail = "y" * 5000
    for column, value, commands in (
        ("status", PAYLOAD + long_tail, ("status", "history")),  # checked at every open
        ("reason", PAYLOAD.encode() + b"\xff\xfe" + long_tail.encode(), ("status",)),
    ):
        damaged = pdir.root / f"{column}.db"
        damaged.write_bytes(store.read_bytes())
        with sqlite3.connect(damaged) as conn:
            conn.execute(f"UPDATE todos SET {column} = CAST(? AS TEXT)", (value,))
        for command in commands:
            done = orch_bytes(command, "--store", damaged)
            assert done.returncode == 2, done.stderr
            text = assert_shown_escaped(done, "\\x1b]0;PWN\\x07")
            assert "is damaged" in text and len(text) < 1000, text


def test_mcp_tool_errors_are_escaped() -> None:
    """What an MCP host shows its person of orch's refusals: escaped too."""
    pytest.importorskip("mcp")
    from mcp.server.mcpserver.exceptions import ToolError

    from orchestrator.agent.server import guarded

    def refuse() -> None:
        raise UsageError(f"no task {PAYLOAD}")

    with pytest.raises(ToolError) as caught:
        guarded(refuse)
    message = str(caught.value)
    assert not any(char in message for char in RAW) and "\\u202e" in message
