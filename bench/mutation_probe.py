"""A small mutation runner: would the tests notice if this line were wrong?

    python bench/mutation_probe.py orchestrator/store/lock.py tests/test_resume.py tests/test_x.py

One mutation at a time is written into the module in place (restored in a `finally`), then the
given test files run (`pytest -x -q -p no:cacheprovider`, a per-mutant timeout). A mutant the
tests fail on is caught; one they pass is a survivor, printed as file:line and what changed.
Mutations: ==/!=, </<=, >/>=, is/is not, in/not in (both ways), and/or, True/False, an int
constant +1 and -1, and a simple statement replaced by `pass` (docstrings and imports are left
alone). Equivalent mutants (e.g. a final `return None` replaced by `pass`) count as survivors.

It edits the file IN PLACE: run it on a scratch copy of the tree (`--copy` makes one under /tmp,
with the package imported from there through PYTHONPATH, and removes it afterwards), never on a
tree others are editing. `--copy --git HEAD --with tests/new_test.py` copies the committed tree
instead (so others' half-done edits cannot break the baseline) with the named files laid over.
Test files that set PYTHONPATH for `orch` themselves (instead of adding to it) make it import
the original tree, not the copy: their results do not count for the mutant.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

SWAPS = {
    "==": "!=",
    "!=": "==",
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "and": "or",
    "or": "and",
    "True": "False",
    "False": "True",
}
COPY_IGNORE = shutil.ignore_patterns(
    ".venv",
    ".servers",
    ".git",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
)


@dataclass(frozen=True)
class Mutant:
    line: int  # 1-based
    col: int
    old: str
    new: str

    def apply(self, lines: list[str]) -> list[str]:
        out = list(lines)
        text = out[self.line - 1]
        if self.old == "<statement>":
            indent = text[: len(text) - len(text.lstrip())]
            out[self.line - 1] = f"{indent}pass\n"
        else:
            out[self.line - 1] = text[: self.col] + self.new + text[self.col + len(self.old) :]
        return out

    def describe(self) -> str:
        if self.old == "<statement>":
            return "statement replaced by pass"
        return f"{self.old!r} -> {self.new!r}"


def mutants(source: str) -> list[Mutant]:
    """Every mutation of `source`, in line order (tokens only: strings and comments are left)."""
    found: list[Mutant] = []
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(toks):
        (row, col), text = tok.start, tok.string
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if tok.type in (tokenize.OP, tokenize.NAME) and text in SWAPS:
            found.append(Mutant(row, col, text, SWAPS[text]))
        elif tok.type == tokenize.NAME and text == "is":
            found.append(
                Mutant(row, col, "is not", "is")
                if nxt == "not"
                else Mutant(row, col, "is", "is not")
            )
        elif tok.type == tokenize.NAME and text == "in" and toks[i - 1].string != "not":
            found.append(Mutant(row, col, "in", "not in"))
        elif tok.type == tokenize.NAME and text == "not" and nxt == "in":
            found.append(Mutant(row, col, "not in", "in"))
        elif tok.type == tokenize.NUMBER and text.isdigit():
            found += [Mutant(row, col, text, str(int(text) + 1))]
            if int(text) > 0:
                found.append(Mutant(row, col, text, str(int(text) - 1)))
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt) or node.lineno != node.end_lineno:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.col_offset == 0:
            continue  # a module constant: its removal is only a NameError
        found.append(Mutant(node.lineno, node.col_offset, "<statement>", "pass"))
    # "in" inside "for x in" is not a comparison: keep only mutants that still parse.
    lines = source.splitlines(keepends=True)
    ok = []
    for m in sorted(set(found), key=lambda m: (m.line, m.col, m.new)):
        try:
            ast.parse("".join(m.apply(lines)))
        except SyntaxError:
            continue
        ok.append(m)
    return ok


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[str, str]:
    """('pass' | 'fail' | 'timeout', the output's tail) for the test files, run from `root`."""
    # ORCH_TEST_SHARED_TMP: a verdict on the mutant, not on /tmp, which other work shares.
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "ORCH_TEST_SHARED_TMP": "1",
    }
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    with tempfile.TemporaryFile() as out:
        # A session of its own: a timed-out pytest is ended with everything it started.
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            verdict = "pass" if proc.wait(timeout=timeout) == 0 else "fail"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            verdict = "timeout"
        out.seek(0)
        return verdict, out.read()[-3000:].decode(errors="replace")


def probe(root: Path, module: str, tests: list[str], timeout: float, limit: int | None) -> int:
    path = root / module
    original = path.read_text()
    lines = original.splitlines(keepends=True)
    todo = mutants(original)[:limit]
    pyc = path.parent / "__pycache__"
    verdict, output = run_tests(root, tests, timeout)
    if verdict != "pass":
        print(
            f"{output}\nthe tests {verdict} on the unmutated code: nothing to measure",
            file=sys.stderr,
        )
        return 2
    caught, survivors, started = 0, [], time.monotonic()
    for n, m in enumerate(todo, 1):
        try:
            path.write_text("".join(m.apply(lines)))
            shutil.rmtree(pyc, ignore_errors=True)  # a same-size edit in the same second
            verdict, _ = run_tests(root, tests, timeout)
        finally:
            path.write_text(original)
        if verdict == "pass":
            survivors.append(m)
            where = f"{module}:{m.line}:{m.col + 1}"
            print(f"  survived {where}: {m.describe()}  | {lines[m.line - 1].strip()}")
        else:
            caught += 1
        print(f"[{n}/{len(todo)}] {verdict}", file=sys.stderr, flush=True)
    shutil.rmtree(pyc, ignore_errors=True)
    total = len(todo)
    pct = 100.0 * caught / total if total else 100.0
    print(
        f"{module}: {caught}/{total} caught ({pct:.0f}%), {len(survivors)} survived, "
        f"{time.monotonic() - started:.0f}s"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", help="path of the module, relative to the tree's root")
    ap.add_argument("tests", nargs="+", help="the covering test files")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the tree (default: cwd)")
    ap.add_argument(
        "--copy",
        action="store_true",
        help="mutate a scratch copy of --root under /tmp (removed afterwards)",
    )
    ap.add_argument(
        "--git",
        metavar="REV",
        help="with --copy: copy the tree as committed at REV (git archive), not the "
        "working tree, so others' half-done edits do not break the baseline",
    )
    ap.add_argument(
        "--with",
        dest="overlay",
        nargs="*",
        default=[],
        metavar="FILE",
        help="with --git: working-tree files laid over that copy (e.g. new tests)",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant's tests")
    ap.add_argument("--limit", type=int, default=None, help="only the first N mutants")
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    a = ap.parse_args()
    if not (a.root / a.module).is_file():
        ap.error(f"no module {a.module} under {a.root}")
    if a.list:
        lines = (a.root / a.module).read_text().splitlines()
        for m in mutants((a.root / a.module).read_text()):
            print(f"{a.module}:{m.line}: {m.describe()}  | {lines[m.line - 1].strip()}")
        return 0
    if not a.copy:
        return probe(a.root, a.module, a.tests, a.timeout, a.limit)
    scratch = Path(tempfile.mkdtemp(prefix="mutprobe-"))
    try:
        tree = scratch / "tree"
        if a.git:
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(a.root), "archive", a.git], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            for f in a.overlay:
                (tree / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(a.root / f, tree / f)
        else:
            shutil.copytree(a.root, tree, ignore=COPY_IGNORE)
        return probe(tree, a.module, a.tests, a.timeout, a.limit)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
