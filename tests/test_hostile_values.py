"""No value is ever code: hostile findings and vars against every bash context, paths built from
findings, and control sequences on the terminal (issue 9)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import TemplateError
from orchestrator.core.terminal import clean
from orchestrator.kinds.builtins import ShellTask
from orchestrator.plan.templating import INERT_MAX, Ref, inert_word, is_inert
from orchestrator.run.checks import Checks

from conftest import ORCH, PlanDir, run_orch

# Each context holds X where the value goes; all run in one script, each in its own subshell
# so that one context's syntax error does not stop the others.
CONTEXTS = [
    "[[ X -eq 0 ]]",
    "(( X ))",
    "echo $(( X + 1 ))",
    "declare -i n=X",
    "cat <<EOF\nX\nEOF",
    "cat <<1EOF\nX\n1EOF",
    "cat <<--EOF\nX\n-EOF",  # `<<-` with the delimiter -EOF
    'eval "echo X"',
    'echo "X"',
    "echo 'X'",
    "a=(1 2); echo $(( a[X] ))",
    "echo #X",
]
PAYLOADS = [
    "a[$(touch PWNED)]",
    "$(touch PWNED)",
    "`touch PWNED`",
    "x[$(touch PWNED)]+1",
    "1;touch PWNED",
    "1\ntouch PWNED",
    "EOF\ntouch PWNED",
    "1EOF\ntouch PWNED",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "a[`touch PWNED`]",
    "$(<PWNED)",
    "${x:=1}",
    "a[$(>PWNED)]",
    "$(>PWNED)",
    "`>PWNED`",
    "x[`>PWNED`]",
    "x=1",
    "~root",
    "*",
    "a b",
    "",
    "é",
    "0x1f",
    "-1",
    "PATH",
    "n",
    "1.5",
    "a,b",
    "@a%b+c:d",
]
SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+:,./-")
inert_text = st.text(alphabet=sorted(SAFE), min_size=1, max_size=40)
values = st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=40), inert_text)


def script(value_ref: str = "${vars.v}") -> str:
    """Every context in one bash script; the first line prints the spliced word as it arrives."""
    parts = [f"printf '[%s]\\n' {value_ref}"]
    parts += [f"( {c.replace('X', value_ref)}\n) >/dev/null 2>&1" for c in CONTEXTS]
    parts.append("(( V )) 2>/dev/null")  # the value through the environment
    return "\n".join(parts) + "\ntrue"


def resolve_params(tmp_path: Path, value: Any) -> dict[str, Any]:
    """The run's own resolve_params (the one call every task start goes through)."""
    checks = SimpleNamespace(
        lookup=lambda ref: value,
        home=tmp_path,
        log_dir=tmp_path / ".orch" / "t.runs" / "1",
    )
    params = {"command": script(), "env": {"V": "${vars.v}"}}
    return Checks.resolve_params(checks, ShellTask, params)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        values,
        st.integers(),
        st.floats(),
        st.booleans(),
        st.none(),
        st.lists(st.integers(), max_size=3),
    )
)
def test_inert_is_exactly_the_safe_set(value: Any) -> None:
    """A value passes exactly when its text is a non-empty word of the safe set within the bound
    (lists, dicts and None never); a refusal names the reference and the way out (env)."""
    text = (
        None
        if isinstance(value, list)
        else ("true" if value is True else "false" if value is False else str(value))
    )
    expected = text is not None and value is not None and set(text) <= SAFE and len(text) > 0
    try:
        word = inert_word(Ref("x", "probe"), value)
    except TemplateError as exc:
        assert not expected
        assert "${tasks.probe.findings.x}" in str(exc) and "in the environment" in str(exc)
        return
    assert expected and word == text


def test_inert_words_are_bounded() -> None:
    assert is_inert("a" * INERT_MAX) and not is_inert("a" * (INERT_MAX + 1)) and not is_inert("")


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.sampled_from(PAYLOADS), inert_text, st.text(max_size=20)))
def test_no_value_runs_as_code_in_any_bash_context(tmp_path: Path, value: str) -> None:
    """Refused before bash, or bash runs every context for real: the word arrives literally and
    no PWNED appears."""
    marker = tmp_path / "PWNED"
    try:
        params = resolve_params(tmp_path, value)
    except TemplateError:
        assert not is_inert(value)
        return
    assert is_inert(value)
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", params["command"]],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], **params["env"]},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"[{value}]"  # one literal word: no split, no glob
    assert not marker.exists()


@pytest.mark.parametrize("payload", ["a[$(touch PWNED)]", "1;touch PWNED", "EOF\ntouch PWNED"])
def test_findings_through_orch_run_never_reach_bash_as_code(pdir: PlanDir, payload: str) -> None:
    """End to end: a finding (any text, via a python task) spliced into any context of shell
    text is refused at load, nothing run; read from the environment in every context (but
    eval's, which runs data as code by the plan's own word), a payload holding `$` fails each
    task before bash starts and any other arrives as data: no PWNED either way."""

    def source() -> str:
        return (
            "name: t\ntasks:\n  - {id: src, kind: python, params: {function: 'json:loads', "
            f"args: {{s: {json.dumps(json.dumps(payload))}}}}}}}\n"
        )

    spliced = "\n".join(
        f"  - {{id: c{i}, kind: shell, needs: [src], params: {{command: "
        f"{json.dumps(c.replace('X', '${tasks.src.findings.result}'))}}}}}"
        for i, c in enumerate(CONTEXTS)
    )
    r = run_orch("run", pdir.write(source() + spliced + "\n"), cwd=pdir.root)
    assert r.returncode == 2 and r.stderr.count("reaches a process only as data") == len(CONTEXTS)
    assert not (pdir.root / ".orch").exists()
    read = [c.replace("X", "$V") for c in CONTEXTS if not c.startswith("eval")] + ["(( V ))"]
    tasks = "\n".join(
        f"  - {{id: c{i}, kind: shell, needs: [src], params: {{command: "
        # A subshell: bash would stop at a context's failing status (`(( 0 ))`) or an
        # arithmetic syntax error; what counts is that the value arrives as data.
        f"{json.dumps('set +e; ( ' + c + chr(10) + ') ; true')}, "
        "env: {V: '${tasks.src.findings.result}'}}}"
        for i, c in enumerate(read)
    )
    r = run_orch("run", pdir.write(source() + tasks + "\n"), "--keep-going", cwd=pdir.root)
    assert not (pdir.root / "PWNED").exists()
    shell = {k: v for k, v in pdir.statuses().items() if k != "src"}
    assert pdir.statuses()["src"] == "completed" and len(shell) == len(read)
    if "$" in payload:
        assert r.returncode == 1 and set(shell.values()) == {"failed"}
        assert "cannot go into an environment variable" in pdir.todo("c0")["last_error"]
        assert not list((pdir.root / ".orch").rglob("c0.log"))  # no bash was started
    else:
        assert r.returncode == 0, r.stderr
        assert set(shell.values()) == {"completed"}


def test_the_environment_carries_a_finding_exactly(pdir: PlanDir) -> None:
    """No shell reads an environment variable's value unless told to: the way out the
    refusals name carries the text of a finding exactly, quotes, blanks and newlines too."""
    text = "a[(x)] b;\n'q' \"r\" *"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: src
            kind: python
            params: {{function: 'json:loads', args: {{s: {json.dumps(json.dumps(text))}}}}}
          - id: use
            kind: shell
            needs: [src]
            params:
              command:
                - python3
                - -c
                - "import os, sys; open(sys.argv[1], 'w').write(os.environ['V'])"
                - "{pdir.root}/out"
              env: {{V: "${{tasks.src.findings.result}}"}}
    """)
    assert run_orch("run", plan).returncode == 0
    assert (pdir.root / "out").read_text() == text


# --- paths built from findings --------------------------------------------------------------


def path_plan(pdir: PlanDir, finding: str, cwd: str, name: str = "t") -> Path:
    return pdir.write(
        f"name: {name}\ntasks:\n"
        f"  - {{id: src, kind: python, params: {{function: 'json:loads', "
        f"args: {{s: {json.dumps(json.dumps(finding))}}}}}}}\n"
        f"  - {{id: use, kind: shell, needs: [src], params: {{command: 'pwd > {pdir.root}/cwd', "
        f"cwd: {json.dumps(cwd)}}}}}\n",
        f"{name}.yaml",
    )


def test_finding_climbing_out_of_the_plan_folder_is_refused(pdir: PlanDir) -> None:
    """`../../..` as a path param leads outside the plan's folder: refused, naming both."""
    r = run_orch("run", path_plan(pdir, "../../..", "${tasks.src.findings.result}"))
    assert r.returncode == 1
    error = pdir.todo("use")["last_error"]
    assert "param 'cwd'" in error and "'../../..'" in error and str(pdir.root) in error
    assert not (pdir.root / "cwd").exists()


def test_finding_inside_its_folder_or_under_a_written_absolute_prefix_is_allowed(
    pdir: PlanDir, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Inside the plan's folder is fine, and so is anything under an absolute folder the plan
    itself wrote; `..` out of that written folder is not."""
    (pdir.root / "sub").mkdir()
    assert (
        run_orch(
            "run", path_plan(pdir, "sub", "${tasks.src.findings.result}"), cwd=pdir.root
        ).returncode
        == 0
    )
    assert (pdir.root / "cwd").read_text().strip() == str(pdir.root / "sub")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "deep").mkdir()
    plan = path_plan(pdir, "deep", f"{elsewhere}/${{tasks.src.findings.result}}", "abs")
    assert run_orch("run", plan).returncode == 0, pdir.todo("use", "abs")["last_error"]
    assert (pdir.root / "cwd").read_text().strip() == str(elsewhere / "deep")
    plan = path_plan(pdir, "../..", f"{elsewhere}/${{tasks.src.findings.result}}", "up")
    assert run_orch("run", plan).returncode == 1
    assert f"outside {elsewhere}" in pdir.todo("use", "up")["last_error"]


def test_symlink_out_of_the_plan_folder_is_refused(
    pdir: PlanDir, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A symlink inside the folder that points out of it is followed, and refused."""
    outside = tmp_path_factory.mktemp("outside")
    (pdir.root / "link").symlink_to(outside)
    r = run_orch("run", path_plan(pdir, "link", "${tasks.src.findings.result}"), cwd=pdir.root)
    assert r.returncode == 1
    assert f"leads to {outside}" in pdir.todo("use")["last_error"]
    assert not (pdir.root / "cwd").exists()


# --- control sequences on the terminal ------------------------------------------------------

NASTY = "\x1b]0;pwned\x07ok \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x1b[2J\x1b[31mred\x9b1m"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_clean_shows_every_control_character_escaped() -> None:
    """OSC titles and hyperlinks, CSI, C1, BEL, a lone CR: each control character is shown as
    `\\xNN`, so none acts and none hides; tabs and newlines stay (or become spaces)."""
    assert clean(NASTY) == (
        "\\x1b]0;pwned\\x07ok \\x1b]8;;http://evil\\x1b\\link\\x1b]8;;\\x1b\\ "
        "\\x1b[2J\\x1b[31mred\\x9b1m"
    )
    assert not CONTROL.search(clean(NASTY))
    assert clean("a\tb\nc\r\x00") == "a\tb\nc\\x0d\\x00" and clean("a\r\nb") == "a\nb"
    assert clean("a\tb\nc", multiline=False) == "a b c" and clean("end\x1b") == "end\\x1b"


@given(st.text())
def test_nothing_clean_gives_out_acts_on_a_terminal(text: str) -> None:
    out = clean(text, multiline=False)
    assert not CONTROL.search(out) and "\n" not in out and "\t" not in out


def test_findings_with_escapes_are_shown_escaped_on_the_terminal_exact_in_json(
    pdir: PlanDir,
) -> None:
    """`orch status` and the run log print no control character; `--json` keeps the value."""
    plan = pdir.write(
        "name: t\ntasks:\n"
        f"  - {{id: src, kind: python, params: {{function: 'json:loads', "
        f"args: {{s: {json.dumps(json.dumps(NASTY))}}}}}}}\n"
        "  - {id: bad, kind: shell, params: {command: [python3, -c, 'import sys; "
        f"print(sys.argv[1]); sys.exit(3)', {json.dumps(NASTY)}]}}}}\n"
    )
    run = run_orch("run", plan, "--keep-going")
    assert run.returncode == 1
    status = run_orch("status", plan)
    for text in (run.stderr, status.stdout + status.stderr):
        assert "x1b]0;pwned" in text  # shown escaped, inert (the run log's repr doubles \\)
        assert not CONTROL.search(text), repr(text)
    as_json = json.loads(run_orch("status", plan, "--json").stdout)
    tasks = {t["id"]: t for t in as_json["tasks"]}
    assert tasks["src"]["findings"][0]["value"] == NASTY
    assert "\x1b]0;pwned\x07" in tasks["bad"]["output_tail"]


def test_events_and_logs_show_control_characters_escaped_and_raw_gives_the_bytes(
    pdir: PlanDir,
) -> None:
    """OSC 52 (the clipboard), OSC 0 (the title), C1 CSI, BEL and a bare CR in a finding and in
    a task's output: `orch events`, `orch logs` and `orch status` print them as `\\xNN`, in a
    pipe too; `orch logs --raw` gives the log's bytes; --json keeps the value exact."""
    payload = "\x1b]52;c;cHduZWQ=\x07\x1b]0;title\x07\x9b2J\x07over\rwrite"
    plan = pdir.write(
        "name: t\ntasks:\n"
        "  - {id: src, kind: shell, params: {command: [python3, -c, "
        "'import sys; print(\"::finding k=\" + sys.argv[1]); print(sys.argv[1])', "
        f"{json.dumps(payload)}]}}}}\n"
    )
    assert run_orch("run", plan).returncode == 0
    shown = {
        args: run_orch(*args, plan, *extra).stdout
        for args, extra in (
            (("events",), ()),
            (("logs",), ("src",)),
            (("status",), ()),
        )
    }
    for args, text in shown.items():
        assert not CONTROL.search(text), (args, repr(text))
    assert "\\x1b]52;c;cHduZWQ=\\x07" in shown[("events",)]
    assert "\\x9b2J\\x07over\\x0dwrite" in shown[("logs",)]
    raw = subprocess.run(
        [str(ORCH), "logs", str(plan), "src", "--raw"], capture_output=True, check=True
    ).stdout
    assert payload.encode() in raw
    events = run_orch("events", plan, "--json").stdout.splitlines()
    values = [json.loads(line).get("value") for line in events]
    assert any(str(v).startswith("\x1b]52;c;cHduZWQ=\x07\x1b]0;title\x07\x9b2J") for v in values)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("app.log", True), ("../../../etc/passwd", False), ("sub/../../escape", False)],
)
def test_a_finding_used_as_a_path_in_a_command_is_confined_through_paths(
    pdir: PlanDir, name: str, ok: bool
) -> None:
    """`paths: {LOG: logs/${finding}}` hands the command a path that stays inside logs/, or
    the task fails before the command runs, saying where the finding led."""
    (pdir.root / "logs").mkdir()
    (pdir.root / "logs" / "app.log").write_text("inside\n")
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: probe
            kind: python
            params: {{function: "os.path:normpath", args: {{path: {json.dumps(name)}}}}}
          - id: read
            kind: shell
            needs: [probe]
            params:
              command: 'cat "$LOG"'
              paths: {{LOG: "logs/${{tasks.probe.findings.result}}"}}
    """)
    r = run_orch("run", plan, cwd=pdir.root)
    if ok:
        assert r.returncode == 0, r.stderr
        assert "inside" in next(pdir.root.rglob("read.log")).read_text()
    else:
        assert r.returncode == 1
        error = pdir.todo("read")["last_error"]
        assert "param 'paths.LOG'" in error and "outside" in error and "/logs" in error
        assert not list(pdir.root.rglob("read.log"))  # the command never ran
