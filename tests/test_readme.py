"""The README's resume exercise, run line by line as written, does what its comments say: from a
folder laid out as the repository (plans/demo.yaml, .venv/bin/orch)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from conftest import ORCH

ROOT = Path(__file__).resolve().parent.parent

# What each line of the exercise must do: its exit status, and words its output must hold.
EXPECTED = [
    ("reset plans/demo.yaml --yes", 0, ["nothing to reset"]),
    ("run plans/demo.yaml --var size_mb=-1", 1, ["write_data failed", "dd: invalid number"]),
    ("status plans/demo.yaml", 0, ["✓ prepare", "✗ write_data"]),
    ("plan plans/demo.yaml", 0, ["skip     prepare", "run      write_data"]),
    ("run plans/demo.yaml", 0, ["5 tasks: 5 completed"]),
    ("run plans/demo.yaml", 0, ["nothing to do"]),
]


def exercise() -> list[str]:
    """The `orch` lines of the README's block under 'Try the resume'."""
    text = (ROOT / "README.md").read_text()
    block = text.split("**Try the resume**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*", "", line) for line in block.splitlines() if line.strip()]


def test_the_readme_resume_exercise_does_what_it_says(tmp_path: Path) -> None:
    lines = exercise()
    assert [line.removeprefix(".venv/bin/orch ") for line in lines] == [c for c, _, _ in EXPECTED]
    (tmp_path / "plans").mkdir()
    shutil.copy(ROOT / "plans" / "demo.yaml", tmp_path / "plans")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "orch").symlink_to(ORCH)
    for line, (_, code, words) in zip(lines, EXPECTED, strict=True):
        r = subprocess.run(
            shlex.split(line),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NO_COLOR": "1"},
        )
        out = r.stdout + r.stderr
        assert r.returncode == code, (line, out)
        for word in words:
            assert word in out, (line, word, out)
    runs = (tmp_path / "plans" / ".orch" / "demo.runs").iterdir()
    assert sorted(p.name for p in runs) == ["1", "2"]  # the last line ran nothing
    log = (tmp_path / "plans" / ".orch" / "demo.runs" / "2" / "events.jsonl").read_text()
    assert '"task": "write_data"' in log
    assert '"task": "prepare"' not in log  # resumed at write_data: prepare was not redone
