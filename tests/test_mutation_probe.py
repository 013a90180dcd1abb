"""bench/mutation_probe.py, the project's mutation tool: which mutants it makes, and which tests
it runs against one (a mutant given too few tests is a survivor the suite does not deserve)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from mutation_probe import Coverage, line_span, mutants  # noqa: E402

SOURCE = textwrap.dedent(
    """\
    def choose(a, b, c):
        if (
            a
            and b
            and c
        ):
            return 1
        total = (a +
                 b)
        return 0
    """
)


def test_mutants_flip_operators_constants_and_drop_statements() -> None:
    found = {(m.line, m.describe()) for m in mutants(SOURCE)}
    assert (4, "'and' -> 'or'") in found
    assert (7, "'1' -> '2'") in found and (7, "'1' -> '0'") in found
    assert (7, "statement replaced by pass") in found
    assert (8, "statement replaced by pass") not in found  # two lines: not one to replace


def test_a_mutant_on_a_line_that_never_ran_gets_the_tests_of_its_expression() -> None:
    """`a and b` over two lines with `a` false: line 4 never runs unmutated, and runs once
    `and` is `or`. The test that ran the `if` (line 3 only) is the one that can tell."""
    ran = {"test_a_false": {1, 2, 3, 10}, "test_elsewhere": {1, 8, 9}}
    coverage = Coverage(ran, set(), {"test_a_false": 0.1, "test_elsewhere": 0.1})
    coverage = coverage.of_source(SOURCE)
    assert coverage.tests_for(4) == ["test_a_false"]
    assert coverage.tests_for(5) == ["test_a_false"]
    assert coverage.tests_for(9) == ["test_elsewhere"]  # `total = (a +` / `b)`: one statement
    assert coverage.tests_for(7) == []  # a body's line is not its header's


def test_line_span_reads_first_and_last() -> None:
    assert line_span("456-1280") == (456, 1280)
    for bad in ("456", "9-3", "a-b", "-5"):
        try:
            line_span(bad)
        except Exception as exc:  # argparse.ArgumentTypeError: argparse prints it
            assert "FIRST-LAST" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was taken")
