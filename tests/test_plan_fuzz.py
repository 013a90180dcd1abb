"""Fuzzing plan text: whatever the file holds, validate says ok or gives plan errors naming the
file (exit 2), never a traceback and never exit 1."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import PlanError
from orchestrator.plan.model import load_plan

from conftest import ORCH

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [p.read_text() for p in sorted((ROOT / "plans").glob("*.yaml"))]
YAMLISH = "abc:-[]{}&*!|>'\"#,?<=$ \n\t\\.0123"


@st.composite
def plan_texts(draw: st.DrawFn) -> str:
    """A repo plan mutated (lines deleted, duplicated, replaced, bytes spliced in, deep
    nesting, anchors and aliases), or YAML-ish noise."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(alphabet=YAMLISH, max_size=300))
    lines = draw(st.sampled_from(SEEDS)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "replace", "splice", "nest", "alias"]))
        if op == "delete":
            del lines[at]
        elif op == "duplicate":
            lines.insert(at, lines[at])
        elif op == "replace":
            lines[at] = draw(st.text(alphabet=YAMLISH, max_size=60))
        elif op == "splice":
            cut = draw(st.integers(0, len(lines[at])))
            lines[at] = lines[at][:cut] + draw(st.text(max_size=8)) + lines[at][cut:]
        elif op == "nest":
            depth = draw(st.integers(1, 200))
            lines.insert(at, f"x{at}: {'[' * depth}{']' * depth}")
        else:
            lines[at] = lines[at] + draw(st.sampled_from([" &z", " *z", " *server", " <<: *z"]))
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


def check(path: Path) -> None:
    """What the CLI does with a plan: PlanError is a clean exit 2; anything else is a bug."""
    try:
        load_plan(path)
    except PlanError as exc:
        assert exc.issues and all(i.file == str(path) for i in exc.issues)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(text=plan_texts())
def test_any_plan_text_loads_or_is_a_plan_error(tmp_path: Path, text: str) -> None:
    plan = tmp_path / "fuzz.yaml"
    plan.write_text(text, encoding="utf-8", errors="surrogatepass")
    check(plan)


def test_hostile_files_through_the_real_cli(tmp_path: Path) -> None:
    """A few of the worst through the real executable: exit 0 or 2, the file named."""
    samples = {
        "binary.yaml": b"\x00\xff\xfe name: t\n",
        "latin1.yaml": "name: caf\xe9\n".encode("latin-1"),
        "noise.yaml": b"{[&a *a]: !!python/object:os.system x}\n",
        "tabs.yaml": b"name: t\n\ttasks: []\n",
        "deep.yaml": b"name: t\nv: " + b"{a: " * 2000 + b"1" + b"}" * 2000 + b"\n",
        "cut.yaml": SEEDS[0].encode()[: len(SEEDS[0]) // 2],
    }
    for name, data in samples.items():
        plan = tmp_path / name
        plan.write_bytes(data)
        r = subprocess.run(
            [ORCH, "validate", str(plan)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode in (0, 2), (name, r.stderr)
        assert "Traceback" not in r.stderr
        if r.returncode == 2:
            assert str(plan) in r.stderr
