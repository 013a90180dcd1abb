"""Bounded input: hostile plan text and finding lines give a plan error or a rejected finding,
never a stall, a traceback or unbounded memory."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import cli
from orchestrator.core.errors import PlanError
from orchestrator.core.findings import (
    MAX_FINDING_LINE,
    REJECTED_KEY,
    Finding,
    parse_finding_line,
    split_words,
)
from orchestrator.plan.model import MAX_WHEN_DEPTH, load_plan
from orchestrator.plan.yamlsource import MAX_DEPTH, MAX_PLAN_BYTES, MAX_SCALAR_CHARS

from conftest import ORCH

ROOT = Path(__file__).resolve().parent.parent
TASK = 'tasks: [{id: a, kind: shell, params: {command: "true"}}]\n'


def validate(path: Path) -> tuple[int, str]:
    """`orch validate PATH` through the real CLI group: exit code and all it printed."""
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def refused(path: Path, pattern: str) -> str:
    code, out = validate(path)
    assert code == 2, out
    assert "Traceback" not in out
    assert re.search(pattern, out), out
    return out


def alias_bomb(levels: int) -> str:
    """Billion laughs: each level is nine aliases of the one before, ~600 bytes in all."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "name: t\nvars:\n" + "".join(f"  {line}\n" for line in lines) + TASK


def test_alias_bomb_is_a_plan_error_with_bounded_memory(tmp_path: Path) -> None:
    """The 9-level bomb (2.4 GB before) and one level more (MemoryError before): exit 2 with
    the line, and the real CLI's peak memory stays near its baseline."""
    for levels in (9, 10):
        plan = tmp_path / f"bomb{levels}.yaml"
        plan.write_text(alias_bomb(levels))
        r = subprocess.run(
            [sys.executable, "-c", PEAK, ORCH, "validate", str(plan)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, peak_kib = map(int, r.stdout.split())
        assert code == 2, r.stderr
        assert f"bomb{levels}.yaml:" in r.stderr and "alias bomb" in r.stderr
        assert "Traceback" not in r.stderr
        assert peak_kib < 300 * 1024  # ~35 MB is the CLI's own baseline


# Runs argv and prints its exit code and peak memory (KiB): only that child is counted.
PEAK = """import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"""


def test_plans_with_merge_aliases_still_load() -> None:
    """The repo's plans use `<<: *server` merges; the limits are far above them, and a merge
    gives the task the anchor's keys under its own (overridden where it says)."""
    plans = {p.stem: load_plan(p) for p in sorted((ROOT / "plans").glob("*.yaml"))}
    assert {"rehearsal", "rehearsal_sglang", "sglang_migration", "demo"} <= set(plans)
    tasks = plans["rehearsal"].by_id
    anchor, merged = tasks["launch_base"].spec.params, tasks["launch_noisy"].spec.params
    assert merged["model"] == anchor["model"] and merged["port"] == anchor["port"]
    assert "speculative" in merged and "speculative" not in anchor
    bench = tasks["bench_noisy"].spec.params
    assert bench["server"] == "launch_noisy" != tasks["bench_base"].spec.params["server"]
    assert bench["input_tokens"] == tasks["bench_base"].spec.params["input_tokens"]


def nested(levels: int) -> str:
    """A plan whose deepest value sits `levels` collections down (the top mapping included)."""
    inner = levels - 4  # plan mapping, tasks list, task mapping, params mapping
    return (
        "name: t\ntasks: [{id: a, kind: shell, params: {command: 'true', "
        f"x: {'[' * inner}{']' * inner}}}}}]\n"
    )


def test_nesting_depth_is_bounded_at_the_limit(tmp_path: Path) -> None:
    """Exactly MAX_DEPTH loads; one more, or 500 (RecursionError before), is exit 2."""
    ok = tmp_path / "ok.yaml"
    ok.write_text(nested(MAX_DEPTH))
    code, out = validate(ok)
    assert code == 2 and "nested" not in out  # refused only for the unknown param `x`
    for levels in (MAX_DEPTH + 1, 500):
        plan = tmp_path / f"deep{levels}.yaml"
        plan.write_text(nested(levels))
        refused(plan, rf"deep{levels}\.yaml:2: nested more than {MAX_DEPTH} levels deep\n")
    plan.write_text(nested(100_000))  # libyaml's scanner, reading ahead, has its own limit
    refused(plan, r"deep500\.yaml:2: (nested more than|YAML syntax error: exceeded) ")


def test_depth_counts_what_aliases_expand_to(tmp_path: Path) -> None:
    """Each anchor is shallow, but used inside the other it is too deep; a self-reference is
    named rather than recursed into."""
    half = "[" * 20 + "]" * 20
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: t\nvars:\n  a: &a {half}\n  b: [[[[[[[[[[[[[[*a]]]]]]]]]]]]]]\n" + TASK)
    refused(plan, r"p\.yaml:4: nested more than 32 levels deep \(aliases expanded\)")
    # An alias inside an anchor brings its depth along when that anchor is used in turn.
    plan.write_text(
        f"name: t\nvars:\n  a: &a {half}\n  b: &b [*a]\n  c: {'[' * 12}*b{']' * 12}\n" + TASK
    )
    refused(plan, r"p\.yaml:5: nested more than 32 levels deep \(aliases expanded\)")
    plan.write_text("name: t\nvars:\n  a: &a [1, *a]\n" + TASK)
    refused(plan, r"p\.yaml:3: alias \*a refers to a value that contains it")


def test_long_values_names_and_files_are_refused(tmp_path: Path) -> None:
    """A megabyte scalar, a long plan name or task id, and an oversized file: exit 2."""
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: t\ndescription: {'a' * (MAX_SCALAR_CHARS + 1)}\n" + TASK)
    refused(plan, r"p\.yaml:2: a value of 65,537 characters; the limit is 65,536")
    plan.write_text(f"name: t\ndescription: {'a' * MAX_SCALAR_CHARS}\n" + TASK)
    assert validate(plan)[0] == 0
    plan.write_text(f"name: {'n' * 200}\n" + TASK)
    refused(plan, r"p\.yaml:1: name: String should have at most 128 characters")
    plan.write_text(f"name: t\ntasks: [{{id: {'i' * 129}, kind: shell}}]\n")
    refused(plan, r"p\.yaml:2: .*id: String should have at most 128 characters")
    plan.write_text("name: t\n" + TASK + "#" * MAX_PLAN_BYTES + "\n")
    out = refused(plan, r"p\.yaml: the plan is larger than 1 MiB")
    assert "p.yaml:1" not in out  # no line: it is the file's size


def test_when_depth_and_length_are_refused_at_load(tmp_path: Path) -> None:
    """1,000 `not`s crashed the run that reached it; now the plan does not load."""

    def plan_with(when: str) -> Path:
        plan = tmp_path / "p.yaml"
        plan.write_text(
            f'name: t\ntasks:\n  - {{id: a, kind: shell, when: "{when}", '
            "params: {command: 'true'}}\n"
        )
        return plan

    assert validate(plan_with("not " * 10 + "true"))[0] == 0
    refused(
        plan_with("not " * 1000 + "true"),
        r"p\.yaml:3: task 'a': `when` is 4,004 characters; the limit is 1,000",
    )
    refused(
        plan_with("not " * 200 + "true"),
        r"p\.yaml:3: task 'a': `when` is nested too deeply \(more than 32 levels\)",
    )
    refused(plan_with("not " * MAX_WHEN_DEPTH + "true"), r"`when` is nested too deeply")
    refused(plan_with("(" * 300 + "true" + ")" * 300), r"p\.yaml:3: task 'a': `when` ")


def test_did_you_mean_has_a_budget_over_many_unknown_needs(tmp_path: Path) -> None:
    """1,000 unknown needs are all reported, but only the first few get a suggestion: each
    suggestion scans every id, so all of them would be quadratic (5,000 took minutes)."""
    tasks = "".join(
        f"  - {{id: t{i}, kind: shell, needs: [t{i}_], params: {{command: 'true'}}}}\n"
        for i in range(1000)
    )
    plan = tmp_path / "p.yaml"
    plan.write_text("name: t\ntasks:\n" + tasks)
    with pytest.raises(PlanError) as caught:
        load_plan(plan)
    issues = caught.value.issues
    assert len(issues) == 1000 and all("needs unknown task" in i.message for i in issues)
    assert sum("did you mean" in i.message for i in issues) == 20  # budget 20,000 / 1,000 ids
    assert "(did you mean 't0'?)" in issues[0].message


FINDINGS = st.text(alphabet=" \t\r\n\x0b\"'\\ab=\xa0é#$", max_size=40)


@settings(max_examples=300, deadline=None)
@given(FINDINGS)
def test_split_words_is_shlex_split(text: str) -> None:
    """The linear splitter gives exactly shlex.split's words, and fails where it raises."""
    try:
        expected: list[str] | None = shlex.split(text)
    except ValueError:
        expected = None
    assert split_words(text) == expected


def test_long_finding_lines_are_rejected_not_parsed() -> None:
    """A line at the limit parses as before; one past it (10 MB stalled a run for 25 minutes
    before) is a rejected finding naming the key it meant and why."""
    at_limit = "::finding x=1 note=" + "a" * (MAX_FINDING_LINE - 19)
    assert len(at_limit) == MAX_FINDING_LINE
    assert parse_finding_line(at_limit) == Finding("x", 1, None, "a" * (MAX_FINDING_LINE - 19))
    over = parse_finding_line(at_limit + "a")
    assert over is not None and (over.key, over.value) == (REJECTED_KEY, "x")
    found = parse_finding_line("::finding speed='" + "9 " * 5_000_000 + "'")
    assert found is not None
    assert (found.key, found.value) == (REJECTED_KEY, "speed")
    assert found.note and "10,000,018 characters, over the limit of 65,536" in found.note
    quoted = '::finding n=2 note="' + 'a\\" ' * 16_000 + '" unit=s'
    assert parse_finding_line(quoted) == Finding("n", 2, "s", 'a" ' * 16_000)


def test_var_values_have_the_same_limits(tmp_path: Path) -> None:
    """`--var x=<alias bomb>` is a usage error, not gigabytes; a plain value still works."""
    plan = tmp_path / "p.yaml"
    plan.write_text("name: t\nvars: {x: [1]}\n" + TASK)
    bomb = alias_bomb(10).split("vars:\n", 1)[1].split("tasks:")[0]
    flow = "{" + ", ".join(line.strip() for line in bomb.splitlines()) + "}"
    result = CliRunner().invoke(cli, ["plan", str(plan), "--var", f"x={flow}"])
    assert result.exit_code == 2, result.output
    assert "--var x: the plan has more than 100,000 values" in result.output
    result = CliRunner().invoke(cli, ["plan", str(plan), "--var", "x=[1, 2]"])
    assert "--var" not in result.output and "Traceback" not in result.output
