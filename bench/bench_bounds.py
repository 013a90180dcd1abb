"""Hostile input against the limits: how long each takes to be refused, as a ratio against
loading plans/sglang_migration.yaml in the same run. Figures, not asserts.

    .venv/bin/python bench/bench_bounds.py
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.core.errors import PlanError  # noqa: E402
from orchestrator.core.findings import parse_finding_line  # noqa: E402
from orchestrator.plan.model import load_plan  # noqa: E402

TASK = 'tasks: [{id: a, kind: shell, params: {command: "true"}}]\n'


def timed(action: Callable[[], object], repeat: int = 3) -> tuple[float, str]:
    """Best of `repeat` runs, and what the last one said (first line of a plan error)."""
    best, said = float("inf"), ""
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            said = repr(action())[:70]
        except PlanError as exc:
            said = str(exc.issues[0]).rsplit("/", 1)[-1][:70]
        best = min(best, time.perf_counter() - start)
    return best, said


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        bomb = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        bomb += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
        (d / "bomb.yaml").write_text("name: t\nvars:\n" + "".join(f"  {b}\n" for b in bomb) + TASK)
        (d / "deep.yaml").write_text("name: t\nvars: {x: " + "[" * 500 + "]" * 500 + "}\n" + TASK)
        (d / "needs.yaml").write_text(
            "name: t\ntasks:\n"
            + "".join(
                f"  - {{id: t{i}, kind: shell, needs: [t{i}_], params: {{command: 'true'}}}}\n"
                for i in range(5000)
            )
        )
        (d / "when.yaml").write_text(
            "name: t\ntasks:\n  - {id: a, kind: shell, when: '"
            + "not " * 200
            + "true', params: {command: 'true'}}\n"
        )
        finding = "::finding x='" + "9 " * 5_000_000 + "'"
        near_limit = "::finding x=1 note=" + "a\\ b " * 12_000

        base, _ = timed(lambda: load_plan(ROOT / "plans" / "sglang_migration.yaml"), 10)
        print(f"baseline: load plans/sglang_migration.yaml  {base * 1000:8.1f} ms")
        cases: list[tuple[str, Callable[[], object]]] = [
            ("alias bomb, 10 levels (~600 B)", lambda: load_plan(d / "bomb.yaml")),
            ("param nested 500 deep", lambda: load_plan(d / "deep.yaml")),
            ("5,000 unknown needs", lambda: load_plan(d / "needs.yaml")),
            ("`when` of 200 nots", lambda: load_plan(d / "when.yaml")),
            ("10 MB ::finding line", lambda: parse_finding_line(finding)),
            ("60 KB ::finding line, 24k words", lambda: parse_finding_line(near_limit)),
            ("  the same through shlex.split", lambda: shlex.split(near_limit[10:])),
        ]
        for name, action in cases:
            took, said = timed(action)
            print(f"{name:34} {took * 1000:8.1f} ms  x{took / base:7.1f}  {said}")


if __name__ == "__main__":
    main()
