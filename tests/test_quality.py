"""The code's own bar: ruff clean and formatted, mypy --strict clean (the `test` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    """No lint findings in the engine, the task library, the tests or the benchmarks."""
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied() -> None:
    """Every Python file is as `ruff format` writes it (run `ruff format .` to fix)."""
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_is_clean() -> None:
    """orchestrator/, probes/ and tasks/ type-check under mypy --strict."""
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_kinds_reference_is_generated_from_the_code() -> None:
    """docs/kinds.md is what scripts/kinds_doc.py makes of each kind's pydantic model now."""
    r = subprocess.run(
        [sys.executable, "scripts/kinds_doc.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
