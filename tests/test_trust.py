"""A finding never chooses what runs (orchestrator/plan/trust.py): the params that name code refuse
`${tasks.ID.findings.KEY}` at load, with the line, and at run time; shell text takes a finding
as an argument, never as the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.kinds import registry
from orchestrator.plan.templating import Ref
from orchestrator.plan.trust import CODE_ENV, choosing_code, command_findings

from conftest import PlanDir, run_orch

X = "${tasks.probe.findings.x}"
FOUND = [Ref("x", "probe")]


@pytest.mark.parametrize(
    ("text", "chooses"),
    [
        (f"echo {X}", False),
        (f'echo "{X}" > out.txt', False),
        (f"cat > {X}", False),  # a redirect's target is a file, not a command
        (f"grep -e {X} file", False),  # grep's -e is a pattern
        (f"FOO={X} ls", False),
        (f"echo ok; echo {X}", False),
        (f"{X} --help", True),
        (f'"{X}"', True),
        (f"ls; {X}", True),
        (f"ls\n{X} now", True),
        (f"true && {X}", True),
        (f"ls | {X}", True),
        (f"echo $({X})", True),
        (f"echo `{X}`", True),
        (f"if true; then {X}; fi", True),
        (f"sudo -n {X}", False),  # -n is sudo's option word: the command follows it
        (f"sudo {X}", True),
        (f"env {X}", True),
        (f"xargs {X} < list", True),
        (f"(( {X} + 1 ))", False),  # arithmetic: a number, not a command
        (f"echo $(( {X} * 2 )); {X}", True),
        (f"a=(1 2); echo $(( a[{X}] ))", False),
        (f"cat <<EOF\n{X}\nEOF\necho done", False),  # a here-document's body is data ...
        (f"bash <<EOF\n{X}\nEOF", True),  # ... unless a shell reads it
        (f"cat <<-'END'\n\t{X}\n\tEND\n{X}", True),
        (f'eval "echo {X}"', False),  # eval reads its words as a command
        (f'eval "{X} now"', True),
        (f"bash -c {X}", True),
        (f'bash -c "echo {X}"', False),
        (f'sh -c "ls; {X}"', True),
        (f"/usr/bin/python3 -c {X}", True),
        (f"PATH={X} ls", True),
        (f"LD_PRELOAD={X} ls", True),
        (f"/opt/{X}/bin/tool", True),
        (f"echo 'unbalanced {X}", True),  # no words to trust: counted as a command
        ("$${tasks.probe.findings.x} --help", False),  # a literal, no reference
        ("${vars.tool} --help", False),  # the operator's own word
    ],
)
def test_a_finding_in_command_position_is_found(text: str, chooses: bool) -> None:
    assert command_findings(text) == (FOUND if chooses else []), text


def test_each_kind_refuses_findings_in_the_params_that_name_code() -> None:
    """python's function, what python.install installs and runs, server.launch's program,
    systemd.start's unit, shell argv[0] and code-choosing env; data params stay open."""
    cases = [
        ("python", {"function": X, "args": {"a": X}}, ["function"]),
        ("python.install", {"requirement": X, "venv": X}, ["requirement", "venv"]),
        ("server.launch", {"launcher": [X], "model": X, "port": 1}, ["launcher"]),
        ("systemd.start", {"unit": X}, ["unit"]),
        ("systemd.stop", {"unit": X}, []),
        ("shell", {"command": [X, "-v"]}, ["command"]),
        ("shell", {"command": ["echo", X]}, []),
        ("shell", {"command": ["bash", "-c", X]}, ["command"]),
        ("shell", {"command": ["bash", "-c", f"echo {X}"]}, []),
        ("shell", {"command": ["python3", "-c", f"print({X})"]}, ["command"]),
        ("shell", {"command": ["sudo", X]}, ["command"]),
        ("shell", {"command": ["env", f"LD_PRELOAD={X}", "ls"]}, ["command"]),
        ("shell", {"command": ["env", f"NAME={X}", "ls", X]}, []),
        ("shell", {"command": "echo hi", "env": {"LD_PRELOAD": X, "NAME": X}}, ["env"]),
        ("shell", {"command": "echo hi", "env": {X: "1"}}, ["env"]),
        ("bench.serve", {"url": X, "dataset": X}, []),
    ]  # fmt: skip
    for kind, params, refused in cases:
        cls = registry.resolve(kind)
        assert [key for key, _ in choosing_code(cls, params)] == refused, kind
    check = registry.resolve("python.package", registry.PRECONDITION_GROUP)
    assert [k for k, _ in choosing_code(check, {"package": X})] == ["package"]


def test_a_finding_that_names_the_function_is_refused_with_its_line(pdir: PlanDir) -> None:
    """The hostile campaign's case: `probe` prints fn=os:system and a command; the python task
    would call os.system with it. validate and run refuse it at its line (exit 2, nothing
    runs, no traceback); the same finding as an argument to a function the plan names runs."""
    touched = pdir.root / "touched"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: probe
            kind: shell
            params: {{command: "echo ::finding fn=os:system"}}
          - id: call
            kind: python
            needs: [probe]
            params:
              function: "${{tasks.probe.findings.fn}}"
              args: {{command: "touch {touched}"}}
    """)
    for command in ("validate", "run"):
        r = run_orch(command, plan)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert "plan.yaml:11:" in r.stderr, r.stderr
        assert "${tasks.probe.findings.fn}: a finding cannot choose what runs" in r.stderr
        assert "'function' names code" in r.stderr and "Traceback" not in r.stderr
    assert not touched.exists()
    ok = pdir.write("""
        name: t
        tasks:
          - id: probe
            kind: shell
            params: {command: "echo ::finding word=hello"}
          - id: call
            kind: python
            needs: [probe]
            params: {function: "os.path:basename", args: {p: "${tasks.probe.findings.word}"}}
    """)
    r = run_orch("run", ok)
    assert r.returncode == 0, r.stderr


def test_a_task_added_through_the_store_is_refused_when_it_starts(pdir: PlanDir) -> None:
    """`orch todo add` with a finding in command position: refused at once, or, if it got into
    the store, refused when it would start; either way the command never runs."""
    plan = pdir.write("""
        name: t
        tasks:
          - id: probe
            kind: shell
            params: {command: "echo ::finding tool=touch"}
    """)
    assert run_orch("run", plan).returncode == 0
    added = run_orch(
        "todo", "add", plan, "evil", "--kind", "shell", "--needs", "probe",
        "--param", "command=${tasks.probe.findings.tool} " + str(pdir.root / "touched"),
    )  # fmt: skip
    if added.returncode == 0:
        r = run_orch("run", plan)
        assert r.returncode != 0 and "a finding cannot be the command" in r.stdout + r.stderr
    else:
        assert added.returncode == 2 and "a finding cannot be the command" in added.stderr
    assert not (pdir.root / "touched").exists()


@given(
    before=st.sampled_from(
        ["", "; ", "&& ", "| ", "$(", "`", "; sudo ", "&& env A=1 ", "; if true; then ", "\n"]
    ),
    prefix=st.text(alphabet="abc/._-", max_size=6),
)
def test_a_finding_that_starts_a_command_is_always_found(before: str, prefix: str) -> None:
    """Whatever stands before it, a finding in the first word of a command is found."""
    text = f"ls {before}{prefix}{X} arg"
    if before == "":
        text = f"{prefix}{X} arg"
    assert command_findings(text) == FOUND, text


@given(arg=st.text(alphabet="abc -_./=", max_size=12))
def test_a_finding_after_a_plain_command_is_an_argument(arg: str) -> None:
    """`echo ... FINDING`: never a command, whatever plain words come between."""
    if "=" in arg.split(" ")[0]:
        return  # NAME=... before echo is an assignment; covered above
    assert command_findings(f"echo {arg} {X}") == []


def test_every_code_choosing_env_name_is_refused() -> None:
    shell = registry.resolve("shell")
    for name in sorted(CODE_ENV):
        assert choosing_code(shell, {"command": "true", "env": {name: X}}), name
        assert command_findings(f"{name}={X} true") == FOUND, name


def test_the_kinds_reference_says_where_findings_may_go() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs/kinds.md").read_text()
    assert "| `function` | str | required | refused: names code |" in doc
    assert "| `command` | str \\| list[str] | required | an argument, never the command" in doc
