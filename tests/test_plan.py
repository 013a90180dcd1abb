"""Plan loading and validation: every problem at once, each with its file, line and a sentence.

Plans are real files in tmp_path. Error lines are marked in the YAML with a comment (`# <-E1`)
and found with line_of(), so each test checks the exact line the loader names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import cli
from orchestrator.core.durations import parse_duration
from orchestrator.core.errors import PlanError, PlanIssue, TaskTimeout, TemplateError
from orchestrator.kinds.builtins import _alarm
from orchestrator.plan.model import Plan, load_plan, parse_var, what_changed
from orchestrator.plan.templating import (
    Ref,
    compile_when,
    evaluate_when,
    inert_word,
    iter_refs,
    parse_ref,
    resolve,
)

ORCH = Path(sys.executable).parent / "orch"  # the console script of this very venv

# --- helpers -----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    """Write a dedented plan; its first line is line 1."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(path: Path, marker: str) -> int:
    """The 1-based line holding `marker`, which must occur exactly once."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    assert len(hits) == 1, f"marker {marker!r} on lines {hits}"
    return hits[0]


def errors(path: Path, overrides: dict[str, Any] | None = None) -> list[PlanIssue]:
    """The issues of a plan that must fail to load."""
    with pytest.raises(PlanError) as info:
        load_plan(path, overrides)
    assert info.value.issues, "a PlanError must name at least one problem"
    assert all(i.file == str(path) for i in info.value.issues)
    return info.value.issues


def expect(issues: list[PlanIssue], line: int, *words: str) -> PlanIssue:
    """The one issue on `line`, whose message holds every word."""
    at = [i for i in issues if i.line == line]
    assert len(at) == 1, f"expected one issue on line {line}, got {at} among {issues}"
    for word in words:
        assert word in at[0].message, f"{word!r} not in {at[0].message!r}"
    return at[0]


def only(path: Path, marker: str, *words: str, overrides: dict[str, Any] | None = None) -> None:
    """The plan has exactly one problem, on the marked line, saying `words`."""
    issues = errors(path, overrides)
    assert len(issues) == 1, issues
    expect(issues, line_of(path, marker), *words)


def one_task(tmp_path: Path, body: str, head: str = "") -> Path:
    """A plan `t` whose single task `a` has the given (4-space indented) YAML lines."""
    text = "name: t\n" + textwrap.dedent(head) + "tasks:\n  - id: a\n"
    text += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def run_orch(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script as a user runs it."""
    return subprocess.run(
        [str(ORCH), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )


GOOD = """
    name: demo
    description: three tasks
    vars: {port: 8000, model: /models/m, unused: 1}  # <-vars
    tasks:
      - id: serve
        kind: shell
        params: {command: "serve --port ${vars.port}"}
        needs: probe
        retries: 3
        timeout: 1h30m
        when: "${tasks.probe.findings.ok} == true"
      - id: fetch
        kind: shell
        params: {command: "fetch ${vars.model}"}
      - id: probe
        kind: python
        params: {function: "os:getcwd"}
        needs: [fetch]
"""


# --- a plan that loads --------------------------------------------------------------------------


def test_good_plan_loads_in_dependency_order(tmp_path: Path) -> None:
    """A valid plan loads: tasks in dependency order, ties in file order, shorthands expanded."""
    plan = load_plan(write(tmp_path, GOOD))
    assert isinstance(plan, Plan)
    assert (plan.name, plan.description) == ("demo", "three tasks")
    assert [t.id for t in plan.tasks] == ["fetch", "probe", "serve"]
    assert [t.position for t in plan.tasks] == [0, 1, 2]
    serve = plan.by_id["serve"]
    assert serve.spec.needs == ["probe"]  # a single string is a one-item list
    assert serve.spec.retries.attempts == 3  # an int is the number of attempts
    assert serve.spec.timeout == 5400.0
    assert serve.line == 5 and plan.by_id["probe"].line == 15
    assert plan.downstream("fetch") == ["fetch", "probe", "serve"]
    assert plan.dependents["probe"] == ["serve"]


def test_ties_keep_file_order(tmp_path: Path) -> None:
    """Among tasks ready together (at start or after a need), the one written first goes first."""
    tasks = "".join(
        f"  - {{id: {i}, kind: shell, params: {{command: 'true'}}{needs}}}\n"
        for i, needs in [
            ("z", ", needs: r"),
            ("m", ""),
            ("a", ", needs: r"),
            ("q", ""),
            ("b", ", needs: r"),
            ("r", ""),
        ]
    )
    plan = load_plan(write(tmp_path, "name: t\ntasks:\n" + tasks))
    assert [t.id for t in plan.tasks] == ["m", "q", "r", "z", "a", "b"]


def expected_order(needs: dict[str, list[str]]) -> list[str] | None:
    """What the order means, spelled out: again and again, of the tasks whose needs are all
    placed, the one written first; None if some task can never be placed (a cycle)."""
    order: list[str] = []
    while len(order) < len(needs):
        ready = [t for t in needs if t not in order and set(needs[t]) <= set(order)]
        if not ready:
            return None
        order.append(ready[0])  # `needs` is in file order
    return order


@settings(max_examples=200, deadline=None)
@given(
    edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=16),
    names=st.permutations([f"t{i}" for i in range(8)]),
)
def test_dependency_order_is_the_first_written_ready_task_each_time(
    edges: list[tuple[int, int]], names: list[str]
) -> None:
    """Any needs (a cycle now and then, a need written twice): among the tasks ready together
    the one written first goes first, or the cycle is named."""
    needs: dict[str, list[str]] = {name: [] for name in names}
    for task, need in edges:
        if task > need or len(edges) % 5 == 0:  # mostly a DAG
            needs[names[task]].append(names[need])
    lines = [
        f"  - {{id: {t}, kind: approve, params: {{message: m}}, needs: {n}}}"
        for t, n in needs.items()
    ]
    text = "name: t\ntasks:\n" + "\n".join(lines).replace("'", "") + "\n"
    expected = expected_order(needs)
    try:
        order = [t.id for t in load_plan(Path("plan.yaml"), text=text).tasks]
    except PlanError as exc:
        assert expected is None and "dependency cycle" in str(exc)
    else:
        assert order == expected


def test_long_chain_written_dependents_first_loads(tmp_path: Path) -> None:
    """A 1500-task chain, each task needing the next one, loads (no recursion limit)."""
    lines = ["name: chain", "tasks:"]
    for i in range(1500):
        needs = f", needs: [t{i + 1}]" if i < 1499 else ""
        lines.append(f"  - {{id: t{i}, kind: shell, params: {{command: 'true'}}{needs}}}")
    plan = load_plan(write(tmp_path, "\n".join(lines) + "\n"))
    assert plan.tasks[0].id == "t1499" and plan.tasks[-1].id == "t0"


def test_spec_hash_covers_the_vars_a_task_uses(tmp_path: Path) -> None:
    """The spec hash changes with a var the task uses, not with one it does not use."""
    base = load_plan(write(tmp_path, GOOD))
    other_port = load_plan(tmp_path / "plan.yaml", {"port": 9000})
    unused = load_plan(tmp_path / "plan.yaml", {"unused": 2})
    assert other_port.by_id["serve"].spec_hash != base.by_id["serve"].spec_hash
    assert other_port.by_id["fetch"].spec_hash == base.by_id["fetch"].spec_hash
    assert all(unused.by_id[t].spec_hash == base.by_id[t].spec_hash for t in base.by_id)
    assert base.by_id["serve"].fingerprint["vars"] == {"port": 8000}
    changed = what_changed(base.by_id["serve"].fingerprint, other_port.by_id["serve"].fingerprint)
    assert changed == ["vars.port: 8000 -> 9000"]


# Spec hashes are stored: a loader change that alters one marks every task of a store stale.
PINNED = """
name: pinned
vars:
  port: 8000
  ratio: 0.5
  flags: [a, b]
  token: {env: ORCH_PIN_UNSET_TOKEN, default: s3cret}
  shell: &shell {kind: shell, timeout: 30s}
tasks:
  - id: fetch
    <<: *shell
    params: {command: "echo fetch ${vars.port}", env: {TOKEN: "${vars.token}"}}
  - id: serve
    kind: python
    needs: fetch
    when: "${tasks.fetch.findings.ok} == true"
    preconditions:
      - {kind: command, command: "true", wait: 5s}
    params:
      function: "bench_noop:noop"
      args:
        port: "${vars.port}"
        ratio: "${vars.ratio}"
        flag: yes
        none: ~
        n: 0x1f
        at: 2024-01-02
    on_failure: {id: undo, kind: shell, params: {command: [echo, undo]}}
  - id: t1
    kind: python
    params: {function: "bench_noop:noop"}
    needs: serve
finally:
  - {id: tidy, kind: shell, params: {command: [echo, "${vars.port}"]}}
"""


def test_spec_hashes_are_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hashes (and one fingerprint as stored) of a plan with merges, a secret, typed YAML
    values, preconditions, `when` and guards, as computed before loading was sped up."""
    monkeypatch.delenv("ORCH_PIN_UNSET_TOKEN", raising=False)
    (tmp_path / "bench_noop.py").write_text("def noop(**kwargs):\n    pass\n")  # found, not run
    plan = load_plan(write(tmp_path, PINNED))
    assert {t.id: t.spec_hash for t in [*plan.tasks, *plan.guards]} == {
        "fetch": "a1ddaf209ccc9dc0",
        "serve": "69a440987141c5c0",
        "t1": "c28c587ac95938cc",
        "undo": "c2eeb5455e69dd8e",
        "tidy": "6bf082a86be60205",
    }
    assert plan.by_id["serve"].spec_json == (
        '{"kind": "python", "params": {"args": {"at": "2024-01-02", "flag": true, "n": 31, '
        '"none": null, "port": "${vars.port}", "ratio": "${vars.ratio}"}, "function": '
        '"bench_noop:noop"}, "preconditions": [{"command": "true", "kind": "command", '
        '"wait": "5s"}], "vars": {"port": 8000, "ratio": 0.5}, "when": '
        '"${tasks.fetch.findings.ok} == true"}'
    )


def test_user_kind_params_are_validated_by_its_model(tmp_path: Path) -> None:
    """A `module:Class` kind loads, and its own pydantic model checks the params' types."""
    ok = load_plan(one_task(tmp_path, "kind: helpers_tasks:Greet\nparams: {name: x, times: 2}"))
    assert ok.tasks[0].cls.__name__ == "Greet"
    path = one_task(
        tmp_path,
        """
        kind: helpers_tasks:Greet
        params:
          name: x
          times: many  # <-E
    """,
    )
    only(path, "# <-E", "task 'a'", "param 'times'", "valid integer")


# --- each kind of error, alone, with its line ---------------------------------------------------


def test_unknown_kind(tmp_path: Path) -> None:
    """An unknown task kind is named, with a suggestion, on the `kind:` line."""
    path = one_task(tmp_path, "kind: shel  # <-E\nparams: {command: 'true'}")
    only(path, "# <-E", "task 'a'", "unknown task kind 'shel'", "did you mean 'shell'?")


def test_unimportable_module_class_kind(tmp_path: Path) -> None:
    """A `module:Class` kind that cannot be imported is a plan error on the `kind:` line."""
    path = one_task(tmp_path, "kind: no_such_module_x:Thing  # <-E")
    only(path, "# <-E", "cannot import task kind 'no_such_module_x:Thing'")


def test_unknown_param(tmp_path: Path) -> None:
    """A param the kind's model does not take is named, with a suggestion and the valid ones."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params:
          command: 'true'
          comand: 'true'  # <-E
    """,
    )
    only(
        path,
        "# <-E",
        "unknown param 'comand'",
        "did you mean 'command'?",
        "ShellTask takes: command, env, cwd",
    )


def test_ill_typed_param(tmp_path: Path) -> None:
    """A param of the wrong type is reported on its own line by the kind's model."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params:
          command: 'true'
          grace: lots  # <-E
    """,
    )
    only(path, "# <-E", "task 'a'", "param 'grace'", "valid number")


@pytest.mark.parametrize("value", ["true", "5", "{a: 1}"])
def test_a_command_of_the_wrong_shape_is_one_clear_error(tmp_path: Path, value: str) -> None:
    """`command: true` (YAML's boolean): one error saying what a command is, not one per member
    of the str | list union with pydantic's internal names."""
    path = one_task(
        tmp_path,
        f"""
        kind: shell
        params:
          command: {value}  # <-E
    """,
    )
    only(path, "# <-E", "param 'command': a command is a string (run by bash) or an argv list")


def test_missing_param_points_at_params(tmp_path: Path) -> None:
    """A missing required param is reported on the `params:` line."""
    path = one_task(
        tmp_path,
        """
        kind: python
        params:  # <-E
          args: {}
    """,
    )
    only(path, "# <-E", "missing param 'function'")


def test_unknown_dependency(tmp_path: Path) -> None:
    """A need naming no task is reported on that item's line, with a suggestion."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: build, kind: shell, params: {command: 'true'}}
          - id: test
            kind: shell
            params: {command: 'true'}
            needs:
              - build
              - buidl  # <-E
    """,
    )
    only(path, "# <-E", "task 'test' needs unknown task 'buidl'", "did you mean 'build'?")


def test_duplicate_id(tmp_path: Path) -> None:
    """A second task with an id already used is reported, naming the first one's line."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - id: a  # <-first
            kind: shell
            params: {command: 'true'}
          - id: a  # <-E
            kind: shell
            params: {command: 'true'}
    """,
    )
    only(path, "# <-E", "duplicate task id 'a'", f"first at line {line_of(path, '# <-first')}")


def _cycle_of(issue: PlanIssue) -> list[str]:
    prefix = "dependency cycle: "
    assert issue.message.startswith(prefix), issue
    return issue.message[len(prefix) :].split(" -> ")


def test_dependency_cycle_is_named(tmp_path: Path) -> None:
    """A cycle is named as `x -> y -> z -> x` (arrows are needs), on the first task's needs."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - id: a
            kind: shell
            params: {command: 'true'}
            needs: [c]  # <-needs-a
          - id: b
            kind: shell
            params: {command: 'true'}
            needs: [a]  # <-needs-b
          - id: c
            kind: shell
            params: {command: 'true'}
            needs: [b]  # <-needs-c
          - id: d
            kind: shell
            params: {command: 'true'}
            needs: [a]
    """,
    )
    issues = errors(path)
    assert len(issues) == 1, issues
    cycle = _cycle_of(issues[0])
    needs = {"a": "c", "b": "a", "c": "b"}
    assert len(cycle) == 4 and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert all(needs[x] == y for x, y in zip(cycle, cycle[1:], strict=False))
    assert issues[0].line == line_of(path, f"# <-needs-{cycle[0]}")


def test_two_task_cycle_reads_a_b_a(tmp_path: Path) -> None:
    """The issue's own example: `a -> b -> a` (or its rotation), on the `needs:` line."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - id: a
            kind: shell
            params: {command: 'true'}
            needs:  # <-needs-a
              - b
          - id: b
            kind: shell
            params: {command: 'true'}
            needs: a  # <-needs-b
    """,
    )
    issues = errors(path)
    assert len(issues) == 1, issues
    assert issues[0].message in ("dependency cycle: a -> b -> a", "dependency cycle: b -> a -> b")
    assert issues[0].line == line_of(path, f"# <-needs-{_cycle_of(issues[0])[0]}")


def test_self_dependency_is_a_cycle(tmp_path: Path) -> None:
    """A task that needs itself is the cycle `a -> a`."""
    path = one_task(tmp_path, "kind: shell\nparams: {command: 'true'}\nneeds: [a]  # <-E")
    only(path, "# <-E", "dependency cycle: a -> a")


def test_every_disjoint_cycle_is_named(tmp_path: Path) -> None:
    """Two separate cycles are both reported, not only the first one found."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: 'true'}, needs: [b]}  # <-a
          - {id: b, kind: shell, params: {command: 'true'}, needs: [a]}  # <-b
          - {id: x, kind: shell, params: {command: 'true'}, needs: [y]}  # <-x
          - {id: y, kind: shell, params: {command: 'true'}, needs: [x]}  # <-y
    """,
    )
    issues = errors(path)
    assert sorted(frozenset(_cycle_of(i)) for i in issues) == [{"a", "b"}, {"x", "y"}]
    for issue in issues:
        assert issue.line == line_of(path, f"# <-{_cycle_of(issue)[0]}")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("timeout", "5 parsecs", ["timeout", "'5 parsecs' is not a duration", "1h30m"]),
        ("timeout", "-5", ["timeout", "-5 is negative"]),
        ("timeout", ".nan", ["timeout", "is not a duration"]),
        ("retries", "{attempts: 2, delay: soon}", ["retries.delay", "'soon' is not a duration"]),
    ],
)
def test_bad_duration(tmp_path: Path, field: str, value: str, words: list[str]) -> None:
    """A duration that is not one names its field and value, on that field's line."""
    path = one_task(tmp_path, f"kind: shell\nparams: {{command: 'true'}}\n{field}: {value}  # <-E")
    only(path, "# <-E", "task 'a'", *words)


def test_bad_precondition_wait_duration(tmp_path: Path) -> None:
    """A precondition's `wait` is a duration too, checked with its line."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params: {command: 'true'}
        preconditions:
          - kind: command
            command: 'true'
            wait: a while  # <-E
    """,
    )
    only(path, "# <-E", "task 'a' precondition", "wait", "'a while' is not a duration")


def test_yaml_syntax_error(tmp_path: Path) -> None:
    """Broken YAML is one error on the offending line, not a traceback."""
    path = one_task(tmp_path, "kind: shell\ntitle: a: b  # <-E\nparams: {command: 'true'}")
    only(path, "# <-E", "YAML syntax error", "mapping values are not allowed")


def test_yaml_unclosed_flow_mapping(tmp_path: Path) -> None:
    """An unclosed `{` is a YAML syntax error that names a line of the file."""
    path = one_task(tmp_path, "kind: shell\nparams: {command: 'true'\nneeds: []")
    issues = errors(path)
    assert len(issues) == 1 and "YAML syntax error" in issues[0].message
    assert issues[0].line is not None and 5 <= issues[0].line <= 7


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    """A key written twice in one mapping is an error on the second one's line."""
    path = one_task(tmp_path, "kind: shell\nparams: {command: 'true'}\nkind: python  # <-E")
    only(path, "# <-E", "duplicate key 'kind'")


def test_unknown_task_field(tmp_path: Path) -> None:
    """A misspelt task field is named on its line, not ignored."""
    path = one_task(tmp_path, "kind: shell\nparams: {command: 'true'}\nneed: [b]  # <-E")
    only(path, "# <-E", "task 'a'", "unknown field 'need'", "(did you mean 'needs'?)")


def test_unknown_nested_field_suggests_from_its_own_model(tmp_path: Path) -> None:
    """`retries.attemps` is compared with Retries' fields, not the task's."""
    path = one_task(
        tmp_path, "kind: shell\nparams: {command: 'true'}\nretries: {attemps: 2}  # <-E"
    )
    only(path, "# <-E", "unknown field 'retries.attemps'", "(did you mean 'attempts'?)")


def test_an_empty_task_list_says_so_plainly(tmp_path: Path) -> None:
    path = write(tmp_path, "name: t\ntasks: []  # <-E\n")
    only(path, "# <-E", "tasks: the list is empty; a plan needs at least one task")


def test_bad_task_id(tmp_path: Path) -> None:
    """A task id with spaces is rejected on the `id:` line."""
    path = write(
        tmp_path,
        "name: t\ntasks:\n  - id: a b  # <-E\n    kind: shell\n    params: {command: 'true'}\n",
    )
    only(
        path,
        "# <-E",
        "task 'a b': id: an id is letters, digits, `_` and `-`, not starting with `-` (got 'a b')",
    )


# --- references and `when` -----------------------------------------------------------------------


def test_unknown_var_reference(tmp_path: Path) -> None:
    """`${vars.x}` naming no var is one error on the param's line, with a suggestion."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params:
          env: {A: b}
          command: serve --port ${vars.prot}  # <-E
    """,
        head="vars: {port: 8000}\n",
    )
    only(path, "# <-E", "task 'a'", "${vars.prot}: no var 'prot'", "did you mean 'port'?")


def test_whole_param_unknown_var_is_reported_once(tmp_path: Path) -> None:
    """A param that is only an unknown var gives that one error, not also a type error."""
    path = one_task(tmp_path, "kind: shell\nparams: {command: '${vars.nope}'}  # <-E")
    only(path, "# <-E", "no var 'nope'")


def test_malformed_reference_is_a_plan_error(tmp_path: Path) -> None:
    """`${foo}` is neither a var nor a finding: a plan error with its line, not a crash."""
    path = one_task(tmp_path, "kind: shell\nparams:\n  command: echo ${foo}  # <-E")
    only(path, "# <-E", "'${foo}' is not a reference", "${vars.NAME}")


def test_unknown_task_in_finding_reference(tmp_path: Path) -> None:
    """`${tasks.x.findings.k}` naming no task is an error on the param's line."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params:
          command: "true"
          env: {R: "${tasks.prob.findings.rate}"}  # <-E
    """,
    )
    only(path, "# <-E", "${tasks.prob.findings.rate}: no task 'prob'")


def test_finding_of_a_task_not_upstream(tmp_path: Path) -> None:
    """A finding of a task that is not among the needs (transitively) is an error."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: probe, kind: shell, params: {command: 'true'}}
          - {id: other, kind: shell, params: {command: 'true'}}
          - id: use
            kind: shell
            needs: [other]
            params:
              command: "true"
              env: {R: "${tasks.probe.findings.rate}"}  # <-E
    """,
    )
    only(path, "# <-E", "'probe' is not among the needs of 'use'", "add it to `needs`")


def test_finding_of_a_transitive_need_is_fine(tmp_path: Path) -> None:
    """A finding of a need's need may be used: upstream is transitive."""
    plan = load_plan(
        write(
            tmp_path,
            """
        name: t
        tasks:
          - {id: probe, kind: shell, params: {command: 'true'}}
          - {id: mid, kind: shell, params: {command: 'true'}, needs: probe}
          - id: use
            kind: shell
            needs: [mid]
            when: "${tasks.probe.findings.rate} > 0.3"
            params: {command: 'echo "$R"', env: {R: "${tasks.probe.findings.rate}"}}
    """,
        )
    )
    assert [t.id for t in plan.tasks] == ["probe", "mid", "use"]


def test_plan_upstream_is_every_need_transitively_sorted(tmp_path: Path) -> None:
    """Plan.upstream: a diamond's shared need once, sorted; nothing for a root or a guard (a
    guard needs nothing); an unknown id is a KeyError."""
    plan = load_plan(
        write(
            tmp_path,
            """
        name: t
        tasks:
          - {id: z_root, kind: shell, params: {command: 'true'}}
          - {id: left, kind: shell, needs: z_root, params: {command: 'true'}}
          - {id: right, kind: shell, needs: z_root, params: {command: 'true'}}
          - id: join
            kind: shell
            needs: [right, left]
            params: {command: 'true'}
            on_failure: {id: undo, kind: shell, params: {command: 'true'}}
          - {id: apart, kind: shell, params: {command: 'true'}}
        finally:
          - {id: last, kind: shell, params: {command: 'true'}}
    """,
        )
    )
    assert plan.upstream("join") == ["left", "right", "z_root"]
    assert plan.upstream("join") == ["left", "right", "z_root"]  # again: from its cache
    assert plan.upstream("left") == ["z_root"]
    assert plan.upstream("z_root") == [] and plan.upstream("apart") == []
    assert plan.upstream("undo") == [] and plan.upstream("last") == []
    with pytest.raises(KeyError):
        plan.upstream("nosuch")


def test_own_finding_is_not_upstream(tmp_path: Path) -> None:
    """A task cannot use its own finding: it is not upstream of itself."""
    path = one_task(
        tmp_path, "kind: shell\nparams: {command: 'true', env: {K: '${tasks.a.findings.k}'}}  # <-E"
    )
    only(path, "# <-E", "'a' is not among the needs of 'a'")


def test_finding_ref_defers_type_check_to_run_time(tmp_path: Path) -> None:
    """A param made of a finding is not type-checked at load (nor reported missing)."""
    plan = load_plan(
        write(
            tmp_path,
            """
        name: t
        tasks:
          - {id: probe, kind: shell, params: {command: 'true'}}
          - id: use
            kind: shell
            needs: [probe]
            params: {command: "true", grace: "${tasks.probe.findings.g}"}
    """,
        )
    )
    assert plan.by_id["use"].spec.params["grace"] == "${tasks.probe.findings.g}"


def test_var_substituted_before_type_check(tmp_path: Path) -> None:
    """A var is substituted (keeping its type) before the kind's model checks the param."""
    good = one_task(
        tmp_path,
        "kind: shell\nparams: {command: 'true', grace: '${vars.g}'}",
        head="vars: {g: 5}\n",
    )
    assert load_plan(good).tasks[0].spec.params["grace"] == "${vars.g}"
    bad = one_task(
        tmp_path,
        "kind: shell\nparams:\n  command: 'true'\n  grace: ${vars.g}  # <-E",
        head="vars: {g: lots}\n",
    )
    only(bad, "# <-E", "param 'grace'", "valid number")


@pytest.mark.parametrize(
    ("when", "words"),
    [
        ('"${vars.n} >"', ["`when` is not a valid condition"]),
        ("\"open('/etc/passwd')\"", ["`when` may use only literals"]),
        ('"${vars.n}.real > 1"', ["`when` may use only literals"]),
        ('"ready == 1"', ["unknown name 'ready'", "quote strings"]),
        ('"_ref0 == 1"', ["unknown name '_ref0'"]),
        ("\"'${vars.n}' == '1'\"", ["inside quotes", "write it bare"]),
        ('"${vars.m} == 1"', ["${vars.m}: no var 'm'"]),
        ('"${tasks.zz.findings.k}"', ["no task 'zz'"]),
        ('"${x} == 1"', ["'${x}' is not a reference"]),
    ],
)
def test_bad_when(tmp_path: Path, when: str, words: list[str]) -> None:
    """A bad `when` (syntax, code, unknown name or reference) is one error on its line."""
    path = one_task(
        tmp_path,
        f"kind: shell\nparams: {{command: 'true'}}\nwhen: {when}  # <-E",
        head="vars: {n: 1}\n",
    )
    only(path, "# <-E", "task 'a'", *words)


def test_precondition_errors(tmp_path: Path) -> None:
    """Precondition kind, params and references are checked like a task's, each on its line."""
    path = one_task(
        tmp_path,
        """
        kind: shell
        params: {command: 'true'}
        preconditions:
          - kind: comand  # <-E1
          - kind: command
            command: 'true'
            timeout: never  # <-E2
          - kind: command
            command: test -e ${vars.where}  # <-E3
          - kind: command  # <-E4
            wait: 5m
    """,
    )
    issues = errors(path)
    assert len(issues) == 4, issues
    expect(
        issues,
        line_of(path, "# <-E1"),
        "unknown precondition kind 'comand'",
        "did you mean 'command'?",
    )
    expect(issues, line_of(path, "# <-E2"), "precondition 'command'", "param 'timeout'")
    expect(issues, line_of(path, "# <-E3"), "no var 'where'")
    expect(issues, line_of(path, "# <-E4"), "missing param 'command'")


# --- the plan's head -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("- just\n- a list\n", 1, ["a plan is a mapping"]),
        ("", None, ["a plan is a mapping"]),
        ("name: t\n", 1, ["tasks", "needs at least one task"]),
        ("name: t\ntasks: []\n", 2, ["tasks", "needs at least one task"]),
        ("name: t\ntasks: {a: 1}\n", 2, ["`tasks` is a list of tasks"]),
        ("name: t\ntasks: 5\n", 2, ["`tasks` is a list of tasks"]),
        ("name: t\ntasks: x\n", 2, ["`tasks` is a list of tasks"]),
        ("name: t\nvars: [1, 2]\ntasks: [{id: a, kind: shell}]\n", 2, ["`vars` is a mapping"]),
        (
            "name: t\ntask: []\ntasks: [{id: a, kind: shell, params: {command: x}}]\n",
            2,
            ["unknown field 'task'", "(did you mean 'tasks'?)"],
        ),
    ],
)
def test_bad_plan_head(tmp_path: Path, text: str, line: int | None, words: list[str]) -> None:
    """A plan that is not a mapping, or has no task list, or bad vars: one error, located."""
    path = write(tmp_path, text)
    issues = errors(path)
    assert len(issues) == 1, issues
    assert issues[0].line == line
    assert all(w in issues[0].message for w in words), issues[0]


def test_bad_name_does_not_hide_task_errors(tmp_path: Path) -> None:
    """A bad plan name is reported together with the tasks' own errors."""
    path = write(
        tmp_path,
        """
        name: my plan  # <-E1
        tasks:
          - id: a
            kind: nope  # <-E2
    """,
    )
    issues = errors(path)
    assert len(issues) == 2, issues
    expect(
        issues,
        line_of(path, "# <-E1"),
        "name: a name is letters, digits, `_`, `-` and `.`, starting with a letter or digit "
        "(got 'my plan')",
    )
    expect(issues, line_of(path, "# <-E2"), "unknown task kind 'nope'")


def test_unreadable_plan(tmp_path: Path) -> None:
    """A missing file is a plan error naming the file, without a line."""
    issues = errors(tmp_path / "missing.yaml")
    assert len(issues) == 1 and issues[0].line is None
    assert "cannot read the plan" in issues[0].message


# --- a newcomer's mistakes: plain sentences, not pydantic's ---------------------------------------


def test_a_timeout_must_be_positive_other_durations_may_be_zero(tmp_path: Path) -> None:
    """`timeout: 0s` would fail every attempt as it starts, and `every: 0` would poll in a busy
    loop: both refused on their line, as are a negative `grace` and a `command` check's
    `timeout: 0`. `retries.delay: 0` (retry at once) and `wait: 0` (check once) mean something
    and load."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "true"}, timeout: 0s}  # <-E1
          - {id: b, kind: shell, params: {command: "true"}, timeout: 0}  # <-E2
          - {id: c, kind: shell, params: {command: "true"}, timeout: 0ms}  # <-E3
          - id: d
            kind: shell
            params: {command: "true"}
            timeout: 0.1
            retries: {attempts: 2, delay: 0}
            preconditions:
              - {kind: command, command: "true", wait: 0, every: 0}  # <-E4
              - {kind: command, command: "true", wait: 0, every: 0.5}
          - id: e
            kind: shell
            params: {command: "true", grace: -1}  # <-E5
            preconditions: [{kind: command, command: "true", timeout: 0}]  # <-E6
    """,
    )
    issues = errors(path)
    assert len(issues) == 6, issues
    for marker in ("E1", "E2", "E3"):
        expect(issues, line_of(path, f"# <-{marker}"), "timeout: 0s would end every attempt")
    expect(issues, line_of(path, "# <-E4"), "every: polling every 0s would run the check back")
    expect(issues, line_of(path, "# <-E5"), "param 'grace'", "greater than or equal to 0")
    expect(issues, line_of(path, "# <-E6"), "param 'timeout'", "greater than 0")
    path.write_text(path.read_text().replace("every: 0}", "every: 1}").replace("grace: -1", ""))
    path.write_text(path.read_text().replace("timeout: 0}", "timeout: 1}"))
    path.write_text(re.sub(r"timeout: 0\w*}", "timeout: 1}", path.read_text()))
    plan = load_plan(path)
    assert plan.by_id["d"].spec.timeout == 0.1 and plan.by_id["d"].spec.retries.delay == 0


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.1, "100ms"), (0.0004, "0ms"), (0.9996, "1s"), (1.5, "1.5s"), (3.0, "3s"), (90, "90s")],
)
def test_a_timeout_under_a_second_is_said_in_milliseconds(seconds: float, said: str) -> None:
    """A python task's timeout message names the time it had: `timed out after 100ms` for a
    0.1s timeout, not `0s` (a shell task's: test_run.py)."""
    # The alarm is not waited for: its handler is called at once.
    with pytest.raises(TaskTimeout) as info, _alarm(seconds):
        signal.raise_signal(signal.SIGALRM)
    assert str(info.value) == f"timed out after {said}"


@pytest.mark.parametrize(
    ("task", "words"),
    [
        ('"fetch"', "a task is a mapping with at least `id` and `kind`"),
        ("[a, shell]", "a task is a mapping with at least `id` and `kind`"),
        (
            '{id: "x y", kind: shell}',
            "id: an id is letters, digits, `_` and `-`, not starting with `-` (got 'x y')",
        ),
        ("{id: -a, kind: shell}", "(got '-a')"),
        (
            "{id: a, kind: shell, priority: med}",
            "priority: 'med' is not one of high, medium or low (did you mean 'medium'?)",
        ),
        (
            "{id: a, kind: shell, on_stall: wiat, stall_after: 5s}",
            "on_stall: 'wiat' is not one of wait, fail or restart (did you mean 'wait'?)",
        ),
        ("{id: a, kind: shell, preconditions: [x]}", "a precondition is a mapping with at least"),
        ("{id: a, kind: shell, retries: often}", "`retries` is a number of tries, or a mapping"),
        ("{id: a, kind: shell, on_failure: undo}", "`on_failure` is a task (a mapping with"),
        (
            '{id: a, kind: shell, resources: {"disk heavy": 1}}',
            "resources: a name is letters, digits, `_` and `-`, not starting with `-` "
            "(got 'disk heavy')",
        ),
    ],
)
def test_shape_mistakes_are_told_in_plain_words(tmp_path: Path, task: str, words: str) -> None:
    """A task that is not a mapping, a bad id, `priority: med` (the board's abbreviation):
    one sentence in the plan's words, on the task's line, and no pydantic wording."""
    task = task.replace("kind: shell", 'kind: shell, params: {command: "true"}')
    path = write(tmp_path, f"name: t\ntasks:\n  - {task}  # <-E\n")
    issues = errors(path)
    assert len(issues) == 1, issues
    expect(issues, line_of(path, "# <-E"), words)
    assert not any("Input should" in i.message or "should match" in i.message for i in issues)


def test_a_python_task_s_module_must_be_findable(tmp_path: Path) -> None:
    """`function: nosuchmod:fn` is refused at validation, not at run time; `module:function`
    is its shape."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: a, kind: python, params: {function: "nosuchmod:fn"}}  # <-E1
          - {id: b, kind: python, params: {function: "nosuchpkg.sub:fn"}}  # <-E2
          - {id: c, kind: python, params: {function: "json"}}  # <-E3
          - {id: d, kind: python, params: {function: "json:loads"}}
    """,
    )
    issues = errors(path)
    assert len(issues) == 3, issues
    expect(
        issues,
        line_of(path, "# <-E1"),
        "task 'a': param 'function': module 'nosuchmod' not found "
        "(searched from plan.yaml's folder and sys.path)",
    )
    expect(issues, line_of(path, "# <-E2"), "module 'nosuchpkg' not found")
    expect(issues, line_of(path, "# <-E3"), "'json' is not module:function")


def test_a_python_task_s_module_is_found_from_the_plan_s_folder_and_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module is looked for as the run imports it (the plan's folder first, wherever orch
    was started) and is not imported: validating runs none of the user's code. A dotted module:
    only its top-level package is looked for (finding `pkg.sub` would run pkg/__init__.py)."""
    plans = tmp_path / "plans"
    (plans / "pkg").mkdir(parents=True)
    ran = tmp_path / "ran"
    side_effect = f"open({str(ran)!r}, 'a').write(__name__)\n"
    (plans / "validmod_c71e.py").write_text(side_effect + "def fn(): pass\n")
    (plans / "pkg" / "__init__.py").write_text(side_effect)
    path = write(
        plans,
        """
        name: t
        tasks:
          - {id: a, kind: python, params: {function: "validmod_c71e:fn"}}
          - {id: b, kind: python, params: {function: "pkg.nosuchsub:fn"}}
    """,
    )
    monkeypatch.chdir(tmp_path)
    assert load_plan(path).by_id["a"].spec.params["function"] == "validmod_c71e:fn"
    assert not ran.exists(), ran.read_text()
    assert "validmod_c71e" not in sys.modules and "pkg" not in sys.modules
    (plans / "validmod_c71e.py").unlink()
    with pytest.raises(PlanError, match="module 'validmod_c71e' not found"):
        load_plan(path)


def _doc_plans() -> list[str]:
    """The fenced YAML blocks of docs/plan-format.md that are whole plans (a `tasks:` key)."""
    doc = (Path(__file__).parent.parent / "docs" / "plan-format.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", doc, re.DOTALL | re.MULTILINE)
    return [b for b in blocks if re.search(r"^tasks:", b, re.MULTILINE)]


def test_the_doc_has_whole_plans() -> None:
    """The extraction below finds the doc's top example (else the next test checks nothing)."""
    assert any("name: sglang-migration" in b for b in _doc_plans())


@pytest.mark.parametrize("text", _doc_plans())
def test_every_whole_plan_in_the_plan_format_doc_validates(tmp_path: Path, text: str) -> None:
    """What the doc shows a newcomer loads as written: the docs cannot drift from the loader.
    Every task the block writes is in the loaded plan, with the kind it names."""
    plan = load_plan(write(tmp_path, text))
    written = {t["id"]: t["kind"] for t in yaml.safe_load(text)["tasks"]}
    assert written and {i: plan.by_id[i].spec.kind for i in written} == written


# --- all at once ---------------------------------------------------------------------------------


MANY = """
    name: many
    vars: {port: 8000}
    tasks:
      - id: fetch
        kind: shel  # <-kind
        params: {command: 'true'}
      - id: build
        kind: shell
        params:
          command: make -j ${vars.jobs}  # <-var
          comand: typo  # <-param
        needs: [fetch, tset]  # <-dep
        timeout: soon  # <-duration
      - id: fetch  # <-dup
        kind: shell
        params: {command: 'true'}
      - id: report
        kind: shell
        needs: [build]
        params:
          command: "true"
          paths: {P: "${tasks.probe.findings.x}"}  # <-task
          env: {A: "${tasks.other.findings.y}"}  # <-upstream
        when: "${vars.port} >"  # <-when
      - {id: other, kind: shell, params: {command: 'true'}, priority: urgent}  # <-priority
"""


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    """Ten different problems in one plan are all reported, each on its own line, in order."""
    path = write(tmp_path, MANY)
    issues = errors(path)
    expected = {
        "kind": ["task 'fetch'", "unknown task kind 'shel'"],
        "var": ["task 'build'", "no var 'jobs'"],
        "param": ["task 'build'", "unknown param 'comand'"],
        "dep": ["task 'build' needs unknown task 'tset'"],
        "duration": ["task 'build'", "timeout", "'soon' is not a duration"],
        "dup": ["duplicate task id 'fetch'", "first at line 4"],
        "task": ["task 'report'", "no task 'probe'"],
        "upstream": ["'other' is not among the needs of 'report'"],
        "when": ["task 'report'", "`when` is not a valid condition"],
        "priority": ["task 'other'", "priority", "'urgent' is not one of high, medium or low"],
    }
    for marker, words in expected.items():
        expect(issues, line_of(path, f"# <-{marker}"), *words)
    assert len(issues) == len(expected), issues
    assert [i.line for i in issues] == sorted(i.line or 0 for i in issues)


def test_a_bad_field_does_not_hide_the_task_s_other_errors(tmp_path: Path) -> None:
    """A task with a bad timeout still has its params, refs and needs checked."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - id: a
            kind: shell
            timeout: soon  # <-E1
            params:
              command: echo ${vars.x}  # <-E2
              bogus: 1  # <-E3
            needs: [ghost]  # <-E4
    """,
    )
    issues = errors(path)
    assert len(issues) == 4, issues
    expect(issues, line_of(path, "# <-E1"), "'soon' is not a duration")
    expect(issues, line_of(path, "# <-E2"), "no var 'x'")
    expect(issues, line_of(path, "# <-E3"), "unknown param 'bogus'")
    expect(issues, line_of(path, "# <-E4"), "needs unknown task 'ghost'")


def test_broken_needs_do_not_fake_upstream_errors(tmp_path: Path) -> None:
    """When a task's needs cannot be read, its dependents' finding refs are not judged by it."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: probe, kind: shell, params: {command: 'true'}}
          - {id: mid, kind: shell, params: {command: 'true'}, needs: {probe: 1}}  # <-E
          - id: use
            kind: shell
            needs: [mid]
            params: {command: "true", env: {K: "${tasks.probe.findings.k}"}}
    """,
    )
    only(path, "# <-E", "task 'mid'", "`needs` is a task id or a list of them")


# --- --var overrides -----------------------------------------------------------------------------


def test_var_override_replaces_the_value(tmp_path: Path) -> None:
    """--var replaces a plan var's value (typed as YAML by parse_var)."""
    path = write(tmp_path, GOOD)
    plan = load_plan(path, dict([parse_var("port=9000")]))
    assert plan.vars["port"] == 9000 and plan.vars["model"] == "/models/m"


def test_var_override_of_unknown_var(tmp_path: Path) -> None:
    """--var for a var the plan lacks is a plan error on the `vars:` line, with a suggestion."""
    path = write(tmp_path, GOOD)
    issues = errors(path, {"prot": 1})
    assert len(issues) == 1, issues
    expect(
        issues,
        line_of(path, "# <-vars"),
        "--var prot",
        "the plan has no var 'prot'",
        "did you mean 'port'?",
    )


def test_var_override_is_type_checked_where_used(tmp_path: Path) -> None:
    """An override of another type than the var's plan value is refused on the var's line;
    one of the right type that a param still refuses fails that param, on its line."""
    path = one_task(
        tmp_path,
        "kind: shell\nparams:\n  command: 'true'\n  grace: ${vars.g}  # <-E",
        head="vars: {g: 5}  # <-V\n",
    )
    only(path, "# <-V", "--var g=lots: this var is a whole number", overrides={"g": "lots"})
    only(path, "# <-E", "param 'grace'", "greater than or equal to 0", overrides={"g": -1})


def test_var_override_unknown_and_other_errors_together(tmp_path: Path) -> None:
    """An unknown --var does not stop the rest of the plan from being checked."""
    path = one_task(tmp_path, "kind: shel  # <-E", head="vars: {x: 1}  # <-V\n")
    issues = errors(path, {"y": 2})
    assert len(issues) == 2, issues
    expect(issues, line_of(path, "# <-V"), "no var 'y'")
    expect(issues, line_of(path, "# <-E"), "unknown task kind 'shel'")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tp=8", ("tp", 8)),
        ("ratio=0.5", ("ratio", 0.5)),
        ("on=true", ("on", True)),
        ("path=/models/k2", ("path", "/models/k2")),
        ("cmd=a=b", ("cmd", "a=b")),
        ("empty=", ("empty", "")),
        ("list=[1, 2]", ("list", [1, 2])),
        ('quoted="a: b"', ("quoted", "a: b")),
    ],
)
def test_parse_var(text: str, expected: tuple[str, Any]) -> None:
    """`--var KEY=VALUE` reads the value as YAML."""
    assert parse_var(text) == expected


@pytest.mark.parametrize("text", ["broken=[1, 2", "x=[1,", "m={a: [b}", "q='open", "n=!urgent"])
def test_parse_var_refuses_bad_yaml(text: str) -> None:
    """Bad YAML is a usage error naming the var, not silently a string (a typo'd list would
    otherwise reach a task as text)."""
    with pytest.raises(ValueError, match=rf"--var {text.split('=')[0]}=.* is not valid YAML"):
        parse_var(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("m={a: 1, a: 2}", "--var m: duplicate key 'a'"),
        ("t=!!python/object:os.system x", "could not determine a constructor"),
        ("deep=" + "[" * 40 + "]" * 40, "nested"),
        ("bomb=[&a [x, x, x, x, x, x, x, x, x], " + ", ".join(["*a"] * 20) + "]", ""),
    ],
)
def test_parse_var_reads_as_a_plan_does(text: str, problem: str) -> None:
    """A --var value has the plan's rules: a duplicate key, an unknown tag or too deep a
    nesting is refused as it would be in the plan file (not the last key silently winning)."""
    if not problem:  # within the bounds: read, aliases and all
        assert parse_var(text)[1][1] == ["x"] * 9
        return
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_var(text)


def test_cli_bad_var_yaml_exits_2(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: t
        vars: {x: 1}
        tasks:
          - {id: a, kind: shell, params: {command: 'true'}}
    """,
    )
    done = run_orch("plan", path, "--var", "x=[1,", cwd=tmp_path)
    assert done.returncode == 2 and "is not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("text", ["novalue", "=5", ""])
def test_parse_var_rejects_malformed(text: str) -> None:
    """`--var` without KEY=VALUE is a usage error with a plain sentence."""
    with pytest.raises(ValueError, match="write KEY=VALUE"):
        parse_var(text)


# --- templating ----------------------------------------------------------------------------------


VALUES: dict[str, Any] = {
    "port": 8000,
    "on": True,
    "tags": ["a", "b"],
    "name": "k2",
    "cfg": {"tp": 8},
}


def lookup(ref: Ref) -> Any:
    return VALUES[ref.name] if ref.task is None else f"<{ref.task}.{ref.name}>"


@pytest.mark.parametrize(("name", "value"), list(VALUES.items()))
def test_whole_string_ref_keeps_its_type(name: str, value: Any) -> None:
    """A string that is exactly one reference becomes the value itself, of its own type."""
    assert resolve(f"${{vars.{name}}}", lookup) == value
    assert type(resolve(f"${{vars.{name}}}", lookup)) is type(value)


def test_spliced_refs_are_formatted_as_text() -> None:
    """Inside a longer string, values are formatted: bools as true/false, ints as digits."""
    assert resolve("--port=${vars.port} --on=${vars.on}", lookup) == "--port=8000 --on=true"
    assert resolve(" ${vars.port}", lookup) == " 8000"


def test_resolve_walks_nested_values_and_keeps_other_types() -> None:
    """Refs inside dicts and lists are resolved; non-strings pass through unchanged."""
    value = {"a": ["${vars.port}", "x${vars.name}"], "b": {"c": "${tasks.p.findings.k}"}, "n": 3}
    assert resolve(value, lookup) == {"a": [8000, "xk2"], "b": {"c": "<p.k>"}, "n": 3}


def test_double_dollar_is_a_literal() -> None:
    """`$${...}` writes a literal `${...}` and is not a reference."""
    assert resolve("echo $${HOME} ${vars.name}", lookup) == "echo ${HOME} k2"
    assert resolve("$${vars.port}", lookup) == "${vars.port}"
    assert list(iter_refs("$${vars.x} ${vars.y}")) == [Ref("y")]


def test_parse_ref() -> None:
    """Vars and findings parse; a finding key may hold dots; anything else is a ValueError."""
    assert parse_ref(" vars.port ") == Ref("port")
    assert parse_ref("tasks.probe-1.findings.rate") == Ref("rate", "probe-1")
    assert parse_ref("tasks.p.findings.gpu.0.mem") == Ref("gpu.0.mem", "p")
    for bad in ["port", "vars.", "vars.1x", "tasks.p.rate", "env.HOME"]:
        with pytest.raises(ValueError, match="is not a reference"):
            parse_ref(bad)


def test_iter_refs_finds_nested_and_rejects_malformed() -> None:
    """Every reference in a nested value is found; a malformed one raises ValueError."""
    refs = list(iter_refs({"a": ["${vars.x}", {"b": "${tasks.t.findings.k} ${vars.y}"}], "c": 1}))
    assert refs == [Ref("x"), Ref("k", "t"), Ref("y")]
    with pytest.raises(ValueError, match=r"'\$\{nope\}' is not a reference"):
        list(iter_refs(["ok", "${nope}"]))


HOSTILE = [
    "$(echo INJECTED; rm -rf /)",
    "`echo INJECTED`",
    "a; echo INJECTED",
    'it\'s "quoted" $HOME',
    "two words\nand a newline",
    "",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_values_bash_would_read_as_more_than_a_word_are_refused(value: str) -> None:
    """In shell text a var is an inert word or a TemplateError naming the way out (env)."""
    with pytest.raises(TemplateError, match=r"\$\{vars.v\}.*pass it in the environment"):
        resolve("printf '[%s]' ${vars.v}", lambda ref: value, inert_word)


def test_shell_text_takes_inert_words_as_they_are() -> None:
    """A whole-string ref stays text in shell mode; inert words and numbers are spliced as is."""
    assert resolve("${vars.v}", lambda ref: "/models/k2.5", inert_word) == "/models/k2.5"
    assert resolve("${vars.port}", lookup, inert_word) == "8000"
    assert resolve("echo $${HOME}", lookup, inert_word) == "echo ${HOME}"
    assert resolve("x=${vars.on}", lambda ref: True, inert_word) == "x=true"


# --- `when` --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("${vars.port} == 8000", True),
        ("${vars.port} != 8000", False),
        ("${vars.port} > 9000", False),
        ("1 < ${vars.port} <= 8000", True),
        ("1 < ${vars.port} < 10", False),
        ("${vars.name} == 'k2'", True),
        ("'a' in ${vars.tags}", True),
        ("'z' not in ${vars.tags}", True),
        ("${vars.name} in ['k1', 'k3']", False),
        ("${vars.on}", True),
        ("not ${vars.on}", False),
        ("${vars.on} and ${vars.port} > 1", True),
        ("${vars.on} and ${vars.port} > 9000", False),
        ("${vars.port} > 9000 or false", False),
        ("${vars.port} < 1 or ${vars.name} == 'k2'", True),
        ("not (false or ${vars.port} == 8000)", False),
        ("true and not false and null == None", True),
        ("-1 < 0", True),
        ("${tasks.probe.findings.k} == '<probe.k>'", True),
    ],
)
def test_evaluate_when(expr: str, expected: bool) -> None:
    """Comparisons (chained too), `in`, and/or/not and literals evaluate as written."""
    assert evaluate_when(expr, lookup) is expected


@pytest.mark.parametrize(("when", "expected"), [(None, True), (True, True), (False, False)])
def test_evaluate_when_constants(when: bool | None, expected: bool) -> None:
    """No `when` runs the task; a boolean `when` is itself."""
    assert evaluate_when(when, lookup) is expected


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('touch {flag}')",
        "open('{flag}', 'w')",
        "${vars.name}.upper() == 'K2'",
        "${vars.tags}[0] == 'a'",
        "(lambda: 1)()",
        "[x for x in ${vars.tags}]",
        "${vars.port} + 1 > 2",
        "_ref0 == 1",
        "name == 'k2'",
        "'${vars.name}' == '_ref0'",
    ],
)
def test_when_rejects_code(tmp_path: Path, expr: str) -> None:
    """Calls, attributes, subscripts, arithmetic, unknown names, quoted refs: refused, not run."""
    flag = tmp_path / "flag"
    expr = expr.replace("{flag}", str(flag))
    with pytest.raises(ValueError, match="`when`"):
        compile_when(expr)
    with pytest.raises(ValueError, match="`when`"):
        evaluate_when(expr, lookup)
    assert not flag.exists()


def test_when_type_error_is_a_template_error() -> None:
    """Comparing values that cannot be compared fails the task's `when` with a sentence."""
    with pytest.raises(TemplateError, match="cannot be evaluated"):
        evaluate_when("${vars.name} > 3", lookup)


# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("10s", 10.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
        ("1m30s", 90.0),
        (" 1h 30m ", 5400.0),
        (10, 10.0),
        (2.5, 2.5),
        (0, 0.0),
        ("10", 10.0),
        ("0.25", 0.25),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    """Units ms/s/m/h/d, combined, and plain numbers (of seconds) parse to seconds."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "is not a duration"),
        ("soon", "is not a duration"),
        ("5 parsecs", "is not a duration"),
        ("1h30", "is not a duration"),
        ("m", "is not a duration"),
        ("-5s", "is not a duration"),
        ("1.5.5s", "is not a duration"),
        ("5sec", "is not a duration"),
        (True, "is not a duration"),
        (None, "is not a duration"),
        ([5], "is not a duration"),
        (float("nan"), "is not a duration"),
        (float("inf"), "is not a duration"),
        (10**400, "is not a duration"),
        (-5, "is negative"),
    ],
)
def test_parse_duration_rejects(value: object, words: str) -> None:
    """Anything else is a ValueError with a plain sentence naming the value."""
    with pytest.raises(ValueError, match=words):
        parse_duration(value)


# --- what_changed --------------------------------------------------------------------------------


def test_what_changed_same_is_empty() -> None:
    """Equal fingerprints differ in nothing."""
    fp = {"kind": "shell", "params": {"command": "x"}, "vars": {}}
    assert what_changed(fp, json.loads(json.dumps(fp))) == []


def test_what_changed_names_nested_paths() -> None:
    """Nested dicts are walked; each changed leaf is named by its dotted path, sorted."""
    old = {"kind": "shell", "params": {"command": "make", "grace": 10}, "when": None}
    new = {
        "kind": "python",
        "params": {"command": "make", "grace": 20, "cwd": "/x"},
        "when": "true",
    }
    assert what_changed(old, new) == [
        "kind: 'shell' -> 'python'",
        "params.cwd: (none) -> '/x'",
        "params.grace: 10 -> 20",
        "when: (none) -> 'true'",
    ]


def test_what_changed_cuts_long_strings_to_the_change() -> None:
    """A long command is cut around where it changed, so the change is visible."""
    a = "x" * 50 + "--tp 8" + "y" * 50
    b = "x" * 50 + "--tp 16" + "y" * 50
    (line,) = what_changed({"params": {"command": a}}, {"params": {"command": b}})
    assert line == (
        "params.command: …'xxxxxxx--tp 8yyyyyyyyyyyy'… -> …'xxxxxxx--tp 16yyyyyyyyyyyy'…"
    )


def test_what_changed_shortens_long_values() -> None:
    """Long non-string values are shortened to 60 characters."""
    (line,) = what_changed({"preconditions": []}, {"preconditions": [{"k": "v" * 100}]})
    assert line.startswith("preconditions: [] -> [{'k': 'vvv") and line.endswith("...")
    assert len(line.split(" -> ")[1]) == 60


# --- the command line ----------------------------------------------------------------------------


def test_cli_validate_json_lists_every_error(tmp_path: Path) -> None:
    """`orch validate --json` of a bad plan exits 2 listing each error's file, line, message."""
    path = write(tmp_path, MANY)
    result = CliRunner().invoke(cli, ["validate", "--json", str(path)])
    assert result.exit_code == 2, result.output
    out = json.loads(result.output)
    assert out["ok"] is False and len(out["problems"]) == 10
    assert {e["file"] for e in out["problems"]} == {str(path)}
    by_line = {e["line"]: e["message"] for e in out["problems"]}
    assert "unknown task kind 'shel'" in by_line[line_of(path, "# <-kind")]
    assert "Traceback" not in result.output


def test_cli_validate_bad_plan_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    """`orch validate` of a bad plan exits 2 and prints `file:line: message`, no traceback."""
    path = one_task(tmp_path, "kind: shel  # <-E")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 2
    assert f"{path}:{line_of(path, '# <-E')}: task 'a': unknown task kind" in result.output
    assert "Traceback" not in result.output


def test_cli_validate_good_plan(tmp_path: Path) -> None:
    """`orch validate` of a good plan exits 0 and summarises it."""
    path = write(tmp_path, GOOD)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "ok, plan 'demo' with 3 tasks (python, shell)" in result.output


requires_script = pytest.mark.skipif(not ORCH.exists(), reason=f"no console script at {ORCH}")


@requires_script
def test_orch_validate_process_reports_all_errors(tmp_path: Path) -> None:
    """The real `orch validate` exits 2, prints each `file:line:` and a count, no traceback."""
    path = write(tmp_path, MANY)
    done = run_orch("validate", path)
    assert done.returncode == 2, done.stderr
    for marker in ["kind", "dup", "when", "priority"]:
        assert f"{path}:{line_of(path, f'# <-{marker}')}: " in done.stderr
    assert "orch: 10 problems in the plan; nothing was run" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@requires_script
def test_orch_validate_tells_a_newcomer_s_mistakes_plainly(tmp_path: Path) -> None:
    """A zero timeout, a task written as a string, a bad id, `priority: med` and a python
    module that does not exist: exit 2, one `file:line: sentence` each, no traceback."""
    path = write(
        tmp_path,
        """
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "true"}, timeout: 0s}  # <-timeout
          - fetch  # <-string
          - {id: "b c", kind: shell, params: {command: "true"}}  # <-id
          - {id: d, kind: shell, params: {command: "true"}, priority: med}  # <-priority
          - {id: e, kind: python, params: {function: "nosuchmod:fn"}}  # <-module
    """,
    )
    done = run_orch("validate", path, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    for marker, words in {
        "timeout": "task 'a': timeout: 0s would end every attempt as it starts",
        "string": "a task is a mapping with at least `id` and `kind`",
        "id": "task 'b c': id: an id is letters, digits, `_` and `-`",
        "priority": "task 'd': priority: 'med' is not one of high, medium or low (did you mean",
        "module": "task 'e': param 'function': module 'nosuchmod' not found (searched from",
    }.items():
        assert f"{path}:{line_of(path, f'# <-{marker}')}: {words}" in done.stderr, done.stderr
    assert "orch: 5 problems in the plan; nothing was run" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_a_python_module_not_found_is_looked_for_again_at_the_next_load(tmp_path: Path) -> None:
    """Modules are looked for once a load (a search of sys.path per task would cost ~10 us),
    afresh at each load: one written after a failed load is found by the next load in the same
    process (the MCP server validates plans for as long as it lives)."""
    name = f"written_later_{os.getpid()}"
    path = write(
        tmp_path,
        f"""
        name: t
        tasks:
          - {{id: a, kind: python, params: {{function: "{name}:fn"}}}}
          - {{id: b, kind: python, params: {{function: "{name}:fn"}}}}
    """,
    )
    with pytest.raises(PlanError, match=f"module '{name}' not found"):
        load_plan(path)
    (tmp_path / f"{name}.py").write_text("def fn():\n    return None\n")
    assert [t.id for t in load_plan(path).tasks] == ["a", "b"]


@requires_script
def test_orch_run_of_bad_plan_runs_nothing(tmp_path: Path) -> None:
    """`orch run` of a plan with one bad task runs none of the good ones and makes no store."""
    flag = tmp_path / "ran"
    path = write(
        tmp_path,
        f"""
        name: t
        tasks:
          - {{id: good, kind: shell, params: {{command: "touch {flag}"}}}}
          - {{id: bad, kind: shell, params: {{command: "echo ${{foo}}"}}}}  # <-E
    """,
    )
    done = run_orch("run", path, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        f"{path}:{line_of(path, '# <-E')}: task 'bad': '${{foo}}' is not a reference" in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not flag.exists() and not (tmp_path / ".orch").exists()


@requires_script
def test_orch_plan_unknown_var_override(tmp_path: Path) -> None:
    """`orch plan --var nope=1` exits 2 naming the unknown var, no traceback."""
    path = write(tmp_path, GOOD)
    done = run_orch("plan", path, "--var", "nope=1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        f"{path}:{line_of(path, '# <-vars')}: --var nope: the plan has no var 'nope'" in done.stderr
    )
    assert "Traceback" not in done.stderr


@requires_script
def test_orch_validate_yaml_syntax_error(tmp_path: Path) -> None:
    """Broken YAML through the real CLI: exit 2, `file:line: YAML syntax error`."""
    path = one_task(tmp_path, "kind: shell\ntitle: a: b  # <-E")
    done = run_orch("validate", path)
    assert done.returncode == 2
    assert f"{path}:{line_of(path, '# <-E')}: YAML syntax error" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "command",
    ['echo "${vars.x}"', "echo '${vars.x}'", "(( ${vars.x} ))", "cat <<1EOF\n${vars.x}\n1EOF"],
)
def test_var_bash_would_read_as_code_is_a_plan_error(tmp_path: Path, command: str) -> None:
    """A var that is no inert word, in any shell context, is refused on its line at load."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        "name: t\nvars: {x: 'a[$(id)]'}\ntasks:\n  - id: a\n    kind: shell\n"
        f"    params:\n      command: {json.dumps(command)}\n"
    )
    with pytest.raises(PlanError) as info:
        load_plan(path)
    (issue,) = info.value.issues
    assert issue.line == 7
    assert "${vars.x} = 'a[$(id)]' cannot be spliced into shell text" in issue.message
    assert "pass it in the environment" in issue.message


def test_references_in_quotes_heredocs_and_env_are_fine_when_inert(tmp_path: Path) -> None:
    """Inert values need no context rules: quotes, heredocs, `#` and `$${...}` all load."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        "name: t\nvars: {x: k2.5}\ntasks:\n  - id: a\n    kind: shell\n"
        '    params: {command: \'echo "#${vars.x}" "$${HOME}"; cat <<E\n'
        "${vars.x}\nE', env: {V: '${vars.x}'}}\n"
    )
    assert load_plan(path).tasks[0].id == "a"


@pytest.mark.parametrize(
    "text",
    [
        "? [a, b]\n: 1\n",
        "name: t\ntasks: [{id: a, kind: shell, params: {command: !foo 'true'}}]\n",
        "name: t\nvars: {n: !!int abc}\ntasks: [{id: a, kind: shell}]\n",
        "name: t\nvars: &v {self: *v}\ntasks: [{id: a, kind: shell}]\n",
        "name: t\ntasks: [{id: a, kind: ':'}]\n",
    ],
)
def test_strange_yaml_is_a_plan_error_not_a_traceback(tmp_path: Path, text: str) -> None:
    """Odd YAML (complex keys, unknown tags, bad casts, recursive aliases, `:` kinds): exit 2."""
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert all(i.file == str(path) for i in info.value.issues)


def test_durations_beyond_a_year_are_refused() -> None:
    """A duration so long that time arithmetic would overflow is a plan error."""
    for value in (1.0e300, "400d"):
        with pytest.raises(ValueError, match="longer than 365 days"):
            parse_duration(value)


def test_merge_keys_take_an_anchor_and_override_it(tmp_path: Path) -> None:
    """`<<: *anchor` merges shallowly; the mapping's own keys win, and only a key written twice
    in the mapping itself is a duplicate."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        textwrap.dedent("""
        name: t
        tasks:
          - id: a
            kind: shell
            params: &p {command: "echo a", grace: 3}
          - id: b
            kind: shell
            params: {<<: *p, command: "echo b"}
    """)
    )
    loaded = load_plan(plan)
    assert loaded.by_id["b"].spec.params == {"command": "echo b", "grace": 3}
    plan.write_text(plan.read_text().replace('command: "echo b"}', 'command: "b", command: "c"}'))
    with pytest.raises(PlanError) as err:
        load_plan(plan)
    assert "plan.yaml:9: duplicate key 'command'" in str(err.value)
