"""A finding reaches a process only as data (orchestrator/plan/trust.py): never in shell text,
argv, a command precondition or a param that names code, whatever stands around it; as an
environment variable's value, a `python` task's args or a typed param, it is passed as one
value. Refused at load with the line and the rewrite, and again when a task starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import TemplateError
from orchestrator.kinds import registry
from orchestrator.plan.templating import Ref, env_text, resolve
from orchestrator.plan.trust import CODE_ENV, chooses_code, choosing_code

from conftest import PlanDir, run_orch

X = "${tasks.probe.findings.x}"
SHELL = registry.resolve("shell")
COMMAND = registry.resolve("command", registry.PRECONDITION_GROUP)

# The contexts of the third hostile round (issue 39): each ran the finding as code under the
# command-word reader. Shell text, then argv; `F` stands for the finding.
SHELL_CONTEXTS = [
    "timeout 5 F",
    "nice -n 5 F",
    "env -i F",
    "exec -a n F",
    "stdbuf -oL F",
    "flock -n /dev/null F",
    "echo F | bash",
    "bash <<EOF\nF\nEOF",
    "bash F",
    "find . -maxdepth 0 -exec F \\;",
    "trap 'F' EXIT",
    "coproc F\nwait",
    "cat <(F)",
    "bash <<< F",
    "sh -ec F",
    "X=F; $X",
    "a=(1); echo $(( a[F] ))",
    "echo F",  # an argument once; now no finding is in shell text at all
    'printf "%s\\n" "F"',
]
ARGV_CONTEXTS = [
    ["timeout", "9", "sh", "-c", "F"],
    ["python3", "-Sc", "F"],
    ["perl", "-E", "F"],
    ["bash", "-ec", "F"],
    ["xargs", "-0", "sh", "-c", "F"],
    ["echo", "F"],
]


def _with(context: str | list[str], value: str) -> str | list[str]:
    if isinstance(context, str):
        return context.replace("F", value)
    return [item.replace("F", value) for item in context]


@pytest.mark.parametrize(
    "command", [*SHELL_CONTEXTS, *ARGV_CONTEXTS], ids=lambda c: json.dumps(c)[:40]
)
def test_a_finding_in_shell_text_or_argv_is_refused_wherever_it_stands(command: object) -> None:
    chosen = choosing_code(SHELL, {"command": _with(command, X)})  # type: ignore[arg-type]
    assert [key for key, _ in chosen] == ["command"], command
    assert 'env: {X: "${tasks.probe.findings.x}"}, then read "$X"' in chosen[0][1]


def test_each_kind_refuses_findings_where_code_is_parsed_and_takes_them_as_data() -> None:
    """python's function, what python.install installs, server.launch's program and flags,
    systemd.start's unit, every part of shell text and argv, env names and code-choosing env
    values are refused; env values, python args and typed data params are not."""
    cases = [
        ("python", {"function": X, "args": {"a": X, "b": [X]}}, ["function"]),
        ("python.install", {"requirement": X, "venv": X}, ["requirement", "venv"]),
        ("server.launch", {"launcher": [X], "model": X, "port": 1}, ["launcher"]),
        ("server.launch", {"extra_args": ["--x", X], "model": "m", "port": 1}, ["extra_args"]),
        ("systemd.start", {"unit": X}, ["unit"]),
        ("systemd.stop", {"unit": X}, []),
        ("shell", {"command": "true", "env": {"NAME": X}, "cwd": X}, []),
        ("shell", {"command": "true", "env": {"LD_PRELOAD": X, "NAME": X}}, ["env"]),
        ("shell", {"command": "true", "env": {X: "1"}}, ["env"]),
        ("shell", {"command": "true", "env": {f"A{X}": "1"}}, ["env"]),
        ("shell", {"command": "true", "paths": {"LOG": f"logs/{X}"}}, []),
        ("bench.serve", {"url": X, "dataset": X}, []),
    ]  # fmt: skip
    for kind, params, refused in cases:
        cls = registry.resolve(kind)
        assert [key for key, _ in choosing_code(cls, params)] == refused, (kind, params)
    check = registry.resolve("python.package", registry.PRECONDITION_GROUP)
    assert [k for k, _ in choosing_code(check, {"package": X})] == ["package"]
    assert [k for k, _ in choosing_code(COMMAND, {"command": f"test {X}"})] == ["command"]
    assert choosing_code(COMMAND, {"command": 'test "$X"', "env": {"X": X}}) == []


def test_every_code_choosing_env_name_is_refused() -> None:
    for name in sorted(CODE_ENV) + ["LD_AUDIT", "LD_LIBRARY_PATH", "BASH_FUNC_ls%%"]:
        assert chooses_code(name), name
        assert choosing_code(SHELL, {"command": "true", "env": {name: X}}), name
    assert not chooses_code("SIZE") and not chooses_code("MY_LD_THING")


def _payload(context: str | list[str], script: Path) -> str:
    """What a hostile finding would hold in this context to run `script`."""
    if "python3" in context:
        return f"__import__('os').system('{script}')"
    if "perl" in context:
        return f"system('{script}')"
    return f"$({script})" if "a[F]" in context else str(script)


def test_a_plan_written_the_old_way_is_refused_with_its_line_and_nothing_runs(
    pdir: PlanDir,
) -> None:
    """Every context of the hostile round in one plan: each is named on its own line with the
    rewrite, exit 2, no traceback, nothing runs. The same text written literally in a plan
    (the finding's payload in its place) runs the payload in every context but the arguments
    (`echo F`): the contexts are real."""
    contexts: list[str | list[str]] = [*SHELL_CONTEXTS, *ARGV_CONTEXTS]
    arguments = {"echo F", 'printf "%s\\n" "F"', json.dumps(["echo", "F"])}
    literal, hostile = ["name: t", "tasks:"], ["name: t", "tasks:"]
    hostile += ["  - {id: probe, kind: python, params: {function: 'builtins:str'}}"]
    executing = []
    for n, context in enumerate(contexts):
        script = pdir.root / f"mk{n}"
        script.write_text(f"#!/bin/sh\n/usr/bin/touch {pdir.root}/ran-{n}\n")
        script.chmod(0o755)
        if (context if isinstance(context, str) else json.dumps(context)) not in arguments:
            executing.append(n)
        runs = _with(context, _payload(context, script))
        literal += [f"  - {{id: t{n}, kind: shell, params: {{command: {json.dumps(runs)}}}}}"]
        hostile += [
            f"  - {{id: t{n}, kind: shell, needs: [probe], "
            f"params: {{command: {json.dumps(_with(context, X))}}}}}"
        ]
    r = run_orch("run", pdir.write("\n".join(literal) + "\n", "literal.yaml"), "--keep-going")
    ran = sorted(int(p.name.split("-")[1]) for p in pdir.root.glob("ran-*"))
    assert ran == executing, (ran, r.stdout[-3000:])
    for p in pdir.root.glob("ran-*"):
        p.unlink()

    plan = pdir.write("\n".join(hostile) + "\n")
    for command in ("validate", "run"):
        r = run_orch(command, plan)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (command, r.stderr)
        for n in range(len(contexts)):
            assert f"plan.yaml:{4 + n}: task 't{n}': param 'command': {X}: a finding" in r.stderr
        assert r.stderr.count('then read "$X"') == len(contexts)
    assert not list(pdir.root.glob("ran-*"))


def test_a_finding_that_names_the_function_is_refused_with_its_line(pdir: PlanDir) -> None:
    """`probe` prints fn=os:system; the python task would call os.system with it. validate and
    run refuse it at its line (exit 2, nothing runs, no traceback); the same finding as an
    argument to a function the plan names runs."""
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
    """`orch todo add` with a finding in shell text: refused at once, or, if it got into the
    store, refused when it would start; either way the command never runs."""
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
        "--param", "command=timeout 5 ${tasks.probe.findings.tool} " + str(pdir.root / "touched"),
    )  # fmt: skip
    said = "a finding reaches a process only as data"
    if added.returncode == 0:
        r = run_orch("run", plan)
        assert r.returncode != 0 and said in r.stdout + r.stderr
    else:
        assert added.returncode == 2 and said in added.stderr
    assert not (pdir.root / "touched").exists()


# Text a finding may hold on its way through the environment: anything but `$`, a backquote
# and NUL (templating.env_text says why).
DATA = st.text(
    alphabet=st.characters(blacklist_characters="$`\x00", blacklist_categories=("Cs",)),
    max_size=40,
)


@settings(max_examples=200)
@given(
    before=st.text(max_size=20),
    after=st.text(max_size=20),
    argv=st.lists(st.text(max_size=8), max_size=4),
    at=st.integers(0, 4),
)
def test_a_finding_outside_a_data_position_is_never_accepted(
    before: str, after: str, argv: list[str], at: int
) -> None:
    """Whatever text or argv items stand around it, in shell text, argv, a command
    precondition or an env name, a finding is refused."""
    assume(not before.endswith("$"))  # `$${` is a literal `${`, no reference
    text = f"{before}{X}{after}"
    items = [*argv[:at], text, *argv[at:]]
    assert [k for k, _ in choosing_code(SHELL, {"command": text})] == ["command"]
    assert [k for k, _ in choosing_code(SHELL, {"command": items})] == ["command"]
    assert [k for k, _ in choosing_code(COMMAND, {"command": text})] == ["command"]
    assert [k for k, _ in choosing_code(SHELL, {"command": "true", "env": {text: "1"}})] == ["env"]


@settings(max_examples=200)
@given(value=DATA, name=st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True))
def test_a_finding_inside_a_data_position_is_passed_as_one_value(value: str, name: str) -> None:
    """As an env value (a name that chooses no code) or a python arg, a finding is accepted
    and reaches the process as exactly its text: one value, never split or re-read."""
    if chooses_code(name):
        return
    python = registry.resolve("python")
    assert choosing_code(SHELL, {"command": f'printf %s "${name}"', "env": {name: X}}) == []
    # typed params: checked against their type once substituted, never refused for a finding
    assert choosing_code(SHELL, {"command": "true", "grace": X, "cwd": X, "paths": {name: X}}) == []
    assert choosing_code(python, {"function": "m:f", "args": {"v": X, "w": [X]}}) == []
    lookup = {Ref("x", "probe"): value}.__getitem__
    assert resolve({name: X}, lookup, env_text) == {name: value}
    assert resolve({"v": X, "w": [X]}, lookup) == {"v": value, "w": [value]}


@given(value=st.text(max_size=20), at=st.integers(0, 20))
def test_a_finding_holding_a_substitution_never_reaches_an_environment(value: str, at: int) -> None:
    """`$` or a backquote anywhere: refused (bash arithmetic would run `$(...)`)."""
    for mark in ("$", "`", "\x00"):
        bad = value[:at] + mark + value[at:]
        with pytest.raises(TemplateError, match="cannot go into an environment variable"):
            env_text(Ref("x", "probe"), bad)
    assert env_text(Ref("x"), "$(a var is the operator's)") == "$(a var is the operator's)"


def test_hostile_text_through_the_environment_is_one_value_end_to_end(pdir: PlanDir) -> None:
    """Real findings (from a python task) through `env:` into bash text and into argv: the
    process sees each byte for byte as one value; arithmetic on one that holds `$(` is refused
    before anything starts, and its payload never runs."""
    values = ["two words", "a;b|c&d", "'\"\\", "x\ny", "*", "-n", "é ‮ z", "a[0]", "~root"]
    out = pdir.root / "out"
    out.mkdir()
    tasks = []
    for n, value in enumerate(values):
        tasks += [
            f"  - {{id: p{n}, kind: python, params: {{function: 'builtins:str', "
            f"args: {{object: {json.dumps(value)}}}}}}}",
            f"  - {{id: s{n}, kind: shell, needs: [p{n}], params: {{command: "
            f"'printf %s \"$V\" > {out}/s{n}', env: {{V: '${{tasks.p{n}.findings.result}}'}}}}}}",
            f"  - {{id: a{n}, kind: shell, needs: [p{n}], params: {{command: [python3, -c, "
            f'\'import os,sys; open(sys.argv[1], "w").write(os.environ["V"])\', {out}/a{n}], '
            f"env: {{V: '${{tasks.p{n}.findings.result}}'}}}}}}",
        ]
    tasks += [
        f"  - {{id: evil, kind: python, params: {{function: 'builtins:str', "
        f"args: {{object: 'a[$(touch {pdir.root}/pwned)]'}}}}}}",
        "  - {id: arith, kind: shell, needs: [evil], params: {command: 'echo $(( V ))', "
        "env: {V: '${tasks.evil.findings.result}'}}}",
    ]
    r = run_orch("run", pdir.write("name: t\ntasks:\n" + "\n".join(tasks) + "\n"), "--keep-going")
    assert r.returncode == 1, r.stderr
    for n, value in enumerate(values):
        assert (out / f"s{n}").read_text() == value, n
        assert (out / f"a{n}").read_text() == value, n
    statuses = pdir.statuses()
    assert statuses["arith"] == "failed" and not (pdir.root / "pwned").exists()
    assert "cannot go into an environment variable" in r.stdout + r.stderr


def test_the_kinds_reference_says_where_findings_may_go() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs/kinds.md").read_text()
    assert "| `function` | str | required | refused: names code |" in doc
    assert "| `command` | str \\| list[str] | required | refused: parsed as code" in doc
    assert "| `env` | dict[str, str] | `{}` | data, as a value" in doc


def test_a_finding_never_becomes_an_option_of_the_server_it_names(pdir: PlanDir) -> None:
    """server.launch's model and draft model from a finding (a drafter an earlier step
    trained) are values: `--trust-remote-code` there would be the server's flag, so the task
    fails before anything starts, naming the param."""
    found = "'${tasks.train.findings.result}'"
    for written in (
        f"model: {found}",
        f"model: m, speculative: {{algorithm: EAGLE3, draft_model: {found}}}",
    ):
        plan = pdir.write(f"""
            name: t
            tasks:
              - id: train
                kind: python
                params: {{function: "builtins:str", args: {{object: "--trust-remote-code"}}}}
              - id: launch
                kind: server.launch
                needs: [train]
                params: {{flavour: sglang, launcher: [/usr/bin/touch, {pdir.root}/started],
                          port: 1, {written}}}
        """)
        r = run_orch("run", plan)
        assert r.returncode == 1, r.stderr
        error = pdir.todo("launch")["last_error"]
        assert "model" in error and "starts with '-'" in error, error
        assert not (pdir.root / "started").exists()
        assert run_orch("reset", plan, "--yes").returncode == 0
