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

`--covered` (the way to measure a big module) first runs the test files once with a line
tracer on the module, in the tests' process and in every Python process they start (a
sitecustomize on PYTHONPATH for that run only), and records which tests run which of its
lines. Each mutant then runs only the tests that run its line, fastest first; a line that only
runs at import (a default value, a class attribute) gets every test; a line that no test runs
is a survivor without a run (`--run-uncovered`: it gets every test). A process killed before
it exits, or started with an environment of its own (no PYTHONPATH to the tracer), leaves no
trace, so a line that only such a process runs counts as not covered: the score can only come
out lower for it.
`--jobs N` mutates N copies of the tree at once (tests that share a fixed resource, a port or
a cgroup, must not: keep 1 for those).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


def mutants(source: str, span: tuple[int, int] | None = None) -> list[Mutant]:
    """Every mutation of `source`, in line order (tokens only: strings and comments are left);
    with `span`, only those on lines FIRST-LAST."""
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
    if span is not None:  # a part of a large module, measured in a run of its own
        found = [m for m in found if span[0] <= m.line <= span[1]]
    for m in sorted(set(found), key=lambda m: (m.line, m.col, m.new)):
        try:
            ast.parse("".join(m.apply(lines)))
        except SyntaxError:
            continue
        ok.append(m)
    return ok


def run_tests(
    root: Path, tests: list[str], timeout: float, extra: dict[str, str] | None = None
) -> tuple[str, str]:
    """('pass' | 'fail' | 'timeout', the output's tail) for the tests (files or node ids), run
    from `root`; `extra`: environment added (the tracer's, for the coverage run)."""
    # ORCH_TEST_SHARED_TMP: a verdict on the mutant, not on /tmp, which other work shares.
    # A TMPDIR of the run's own, removed here: a run killed at its timeout cannot clean up.
    tmp = tempfile.mkdtemp(prefix="mutprobe-run-")
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "ORCH_TEST_SHARED_TMP": "1",
        "TMPDIR": tmp,
        **(extra or {}),
    }
    # Every process of this run carries a marker of its own: what a mutant left running (an
    # escapee its broken cleanup missed, the tests of a timed-out run) is ended after it.
    marker = ("MUTPROBE_RUN", f"{os.getpid()}-{time.monotonic_ns()}-{threading.get_ident()}")
    env[marker[0]] = marker[1]
    plugin = ["-p", PLUGIN] if extra else []
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *plugin, *tests]
    with tempfile.TemporaryFile() as out:
        # A session of its own: a timed-out pytest is ended with everything it started.
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
            verdict = "pass" if code == 0 else "unrunnable" if code in (4, 5) else "fail"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            verdict = "timeout"
        finally:
            _end_marked(marker)
            shutil.rmtree(tmp, ignore_errors=True)
        out.seek(0)
        return verdict, out.read()[-3000:].decode(errors="replace")


def _end_marked(marker: tuple[str, str]) -> None:
    """End every process whose environment carries `marker`, until none is left (orch's own
    scan and ending: orchestrator/proc/procfs.py)."""
    from orchestrator.proc.procfs import marked, terminate_pids

    for _ in range(20):
        if not (found := marked(marker)):
            return
        terminate_pids(found, grace=0.0)


# The tracer of the coverage run: a pytest plugin in the tests' process, and a sitecustomize in
# every Python process they start (both find it through PYTHONPATH). Lines of MUTPROBE_TARGET
# are recorded under the test running then (MUTPROBE_TEST, inherited by its processes), or
# "<import>" outside any test; each process writes its own JSON file into MUTPROBE_OUT at exit.
TRACER = "_mutprobe_tracer"
BASELINE_TIMEOUT = 1800.0  # seconds for the whole test files, unmutated
TRACER_SOURCE = """
import atexit, json, os, sys, threading, time

TARGET = os.environ["MUTPROBE_TARGET"]
hits = {}
current = [os.environ.get("MUTPROBE_TEST", "<import>")]
durations = {}
ours = {}  # code object -> is it the target's (co_filename compared once per code object)


def _line(frame, event, arg):
    if event == "line":
        hits.setdefault(current[0], set()).add(frame.f_lineno)
    return _line


def _call(frame, event, arg):
    code = frame.f_code
    mine = ours.get(code)
    if mine is None:
        mine = ours[code] = os.path.realpath(code.co_filename) == TARGET
    if not mine:
        return None
    hits.setdefault(current[0], set()).add(frame.f_lineno)
    return _line


def _dump():
    sys.settrace(None)
    out = os.path.join(os.environ["MUTPROBE_OUT"], f"{os.getpid()}-{time.time_ns()}.json")
    with open(out, "w") as f:
        json.dump({"hits": {k: sorted(v) for k, v in hits.items()}, "durations": durations}, f)


if not getattr(sys, "_mutprobe_tracing", False):
    sys._mutprobe_tracing = True
    sys.settrace(_call)
    threading.settrace(_call)
    atexit.register(_dump)

"""
# The pytest side, a module of its own: pytest refuses a plugin imported before it starts.
PLUGIN = "_mutprobe_plugin"
PLUGIN_SOURCE = f"""
import os, time
import pytest
from {TRACER} import current, durations


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    current[0] = os.environ["MUTPROBE_TEST"] = item.nodeid
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        durations[item.nodeid] = time.perf_counter() - started
        current[0] = os.environ["MUTPROBE_TEST"] = "<import>"
"""


@dataclass
class Coverage:
    """Which tests run which lines of the module, and how long each test took."""

    lines: dict[str, set[int]]  # node id -> the module's lines it ran
    at_import: set[int]  # lines run outside any test: at import, or by a fixture between
    durations: dict[str, float]
    def_lines: frozenset[int] = frozenset()  # the module's `def` lines (Coverage.of_source)
    spans: dict[int, range] = field(default_factory=dict)  # a line -> its expression's lines

    def of_source(self, source: str) -> Coverage:
        """The same map, knowing which lines of `source` are `def` lines, and which lines
        belong to one statement or one `if`/`while`/`for`/`with` header."""
        tree = ast.parse(source)
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        lines = frozenset(n.lineno for n in ast.walk(tree) if isinstance(n, defs))
        return Coverage(self.lines, self.at_import, self.durations, lines, expression_spans(tree))

    def seconds(self, tests: list[str]) -> float:
        """How long `tests` took in the traced run."""
        return sum(self.durations.get(t, 0.0) for t in tests)

    def tests_for(self, line: int, kills: Counter[str] | None = None) -> list[str]:
        """The tests that run `line`, fastest first. A `def` line runs at import and again at
        each call (its defaults matter there): the tests that call it. Another line run at
        import (a constant, a class attribute): every test, since every test has it imported
        (the tests that ran it are only those whose processes imported the module anew)."""
        # A line of a multi-line expression may never run unmutated (`a and b` over two lines,
        # `a` false: the tracer never sees b's line) and run once mutated (`a or b`): the
        # tests that run any line of its statement or header are the ones that can tell.
        span = self.spans.get(line, range(line, line + 1))
        chosen = [t for t, lines in self.lines.items() if not lines.isdisjoint(span)]
        if line in self.at_import and (line not in self.def_lines or not chosen):
            chosen = list(self.durations)  # a test's process that imports it runs it too
        # The tests that caught most mutants so far first (a mutant's neighbours fall to the
        # same test), then the fastest: a caught mutant costs one failing test, with -x.
        kills = kills or Counter()
        return sorted(chosen, key=lambda t: (-kills[t], self.durations.get(t, 0.0)))


def expression_spans(tree: ast.Module) -> dict[int, range]:
    """Each line of a statement, or of a compound statement's header, that spans several lines
    -> all of those lines (the innermost: a header's span leaves its body's lines out)."""
    spans: dict[int, range] = {}
    for node in ast.walk(tree):  # outer nodes first: an inner span overwrites
        parts: list[ast.expr] | list[ast.stmt]
        if isinstance(node, ast.If | ast.While):
            parts = [node.test]
        elif isinstance(node, ast.For | ast.AsyncFor):
            parts = [node.target, node.iter]
        elif isinstance(node, ast.With | ast.AsyncWith):
            parts = [item.context_expr for item in node.items]
        elif isinstance(node, ast.stmt) and not hasattr(node, "body"):
            parts = [node]  # a simple statement (compound ones have a body)
        else:
            continue
        first = min(p.lineno for p in parts)
        last = max(p.end_lineno or p.lineno for p in parts)
        if last > first:
            for line in range(first, last + 1):
                spans[line] = range(first, last + 1)
    return spans


def cached_coverage(
    root: Path, module: str, tests: list[str], timeout: float, cache: Path | None
) -> Coverage:
    """measure_coverage, or its answer kept in `cache` for the same module and test files
    (their text's digest): a second run against the same tree skips the traced run."""
    import hashlib

    digest = hashlib.sha256()
    for name in (module, *sorted(tests)):
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    key = digest.hexdigest()
    if cache is not None and cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("key") == key:
            lines = {t: set(v) for t, v in kept["lines"].items()}
            return Coverage(lines, set(kept["at_import"]), kept["durations"])
    coverage = measure_coverage(root, module, tests, timeout)
    if cache is not None:
        cache.write_text(
            json.dumps(
                {
                    "key": key,
                    "lines": {t: sorted(v) for t, v in coverage.lines.items()},
                    "at_import": sorted(coverage.at_import),
                    "durations": coverage.durations,
                }
            )
        )
    return coverage


def measure_coverage(root: Path, module: str, tests: list[str], timeout: float) -> Coverage:
    """Run the tests once, traced (see TRACER_SOURCE), and gather what every process saw."""
    with tempfile.TemporaryDirectory(prefix="mutprobe-cov-") as folder:
        home, out = Path(folder, "path"), Path(folder, "out")
        home.mkdir()
        out.mkdir()
        (home / f"{TRACER}.py").write_text(TRACER_SOURCE)
        (home / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        (home / "sitecustomize.py").write_text(f"import {TRACER}\n")
        extra = {
            "PYTHONPATH": f"{home}{os.pathsep}{root}",
            "MUTPROBE_TARGET": os.path.realpath(root / module),
            "MUTPROBE_OUT": str(out),
        }
        verdict, output = run_tests(root, tests, BASELINE_TIMEOUT * 3, extra)
        if verdict != "pass":  # a timing test may fail traced: the map still stands
            print(f"note: the traced run did not pass ({verdict}):\n{output[-800:]}")
        lines: dict[str, set[int]] = {}
        durations: dict[str, float] = {}
        for dump in out.glob("*.json"):
            try:
                data = json.loads(dump.read_text())
            except ValueError:
                continue  # a process ended while writing it
            for test, hit in data["hits"].items():
                lines.setdefault(test, set()).update(hit)
            durations.update(data["durations"])
    at_import = lines.pop("<import>", set())
    return Coverage({t: v for t, v in lines.items() if t in durations}, at_import, durations)


def probe(
    root: Path,
    module: str,
    tests: list[str],
    timeout: float,
    limit: int | None,
    covered: bool = False,
    jobs: int = 1,
    run_uncovered: bool = False,
    again: set[tuple[str, int, str]] | None = None,
    cache: Path | None = None,
    span: tuple[int, int] | None = None,
) -> int:
    path = root / module
    original = path.read_text()
    lines = original.splitlines(keepends=True)
    todo = mutants(original, span)[:limit]
    if again is not None:  # the survivors of an earlier run only (the tests have grown since)
        todo = [m for m in todo if (lines[m.line - 1].strip(), m.col, m.describe()) in again]
    # The whole files once, unmutated: they must pass (a mutant's tests are fewer, with -x).
    verdict, output = run_tests(root, tests, BASELINE_TIMEOUT)
    if verdict != "pass":
        print(
            f"{output}\nthe tests {verdict} on the unmutated code: nothing to measure",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    coverage = cached_coverage(root, module, tests, timeout, cache) if covered else None
    coverage = coverage.of_source(original) if coverage is not None else None
    if coverage is not None:
        print(
            f"coverage: {len(coverage.durations)} tests, {len(coverage.at_import)} lines run at "
            f"import, {time.monotonic() - started:.0f}s",
            file=sys.stderr,
        )
    trees = [root] + [_copy_tree(root, root.parent / f"{root.name}.{i}") for i in range(1, jobs)]
    free = list(trees)
    lock = threading.Lock()
    results: list[tuple[Mutant, str]] = []
    kills: Counter[str] = Counter()  # test -> mutants it caught

    def one(m: Mutant) -> None:
        chosen = coverage.tests_for(m.line, kills) if coverage is not None else tests
        if not chosen and run_uncovered:
            chosen = tests
        if not chosen:
            verdict = "uncovered"
        else:
            with lock:
                tree = free.pop()
            target = tree / module
            try:
                target.write_text("".join(m.apply(lines)))
                shutil.rmtree(target.parent / "__pycache__", ignore_errors=True)
                # A hang is caught (the suite would not finish), but only past what these tests
                # take: twice their traced time (tracing slows them) on top of `timeout`.
                limit = timeout + 2.0 * coverage.seconds(chosen) if coverage else timeout
                verdict, output = run_tests(tree, chosen, limit)
                if verdict == "unrunnable":  # node ids pytest cannot take back: the files
                    verdict, output = run_tests(tree, tests, timeout)
            finally:
                target.write_text(original)
                with lock:
                    free.append(tree)
        with lock:
            results.append((m, verdict))
            if verdict == "fail":  # -ra's summary names the test that caught it
                for line in output.splitlines():
                    if line.startswith(("FAILED ", "ERROR ")):
                        kills[line.split()[1]] += 1
            where = f"{module}:{m.line}:{m.col + 1}"
            if verdict in ("pass", "uncovered"):
                note = " (no test runs this line)" if verdict == "uncovered" else ""
                print(f"  survived {where}: {m.describe()}{note}  | {lines[m.line - 1].strip()}")
            print(f"[{len(results)}/{len(todo)}] {verdict}", file=sys.stderr, flush=True)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, todo))
    finally:
        for tree in trees[1:]:
            shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)
    survived = [m for m, v in results if v in ("pass", "uncovered")]
    uncovered = sum(v == "uncovered" for _, v in results)
    caught, total = len(results) - len(survived), len(todo)
    pct = 100.0 * caught / total if total else 100.0
    print(
        f"{module}: {caught}/{total} caught ({pct:.0f}%), {len(survived)} survived "
        f"({uncovered} on lines no test runs), {time.monotonic() - started:.0f}s"
    )
    return 0


SURVIVED = re.compile(
    r"^  survived (?P<module>\S+?):\d+:(?P<col>\d+): (?P<what>.+?)"
    r"(?: \(no test runs this line\))?  \| (?P<text>.*)$"
)


def line_span(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (line numbers, both included) as a pair."""
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit() and int(first) <= int(last)):
        raise argparse.ArgumentTypeError(f"{text!r}: give FIRST-LAST, e.g. 456-1280")
    return int(first), int(last)


def survivors_of(report: Path, module: str) -> set[tuple[str, int, str]]:
    """The survivors an earlier run printed for `module`, as (line text, column, mutation):
    found again by their text, so that edits elsewhere in the module do not lose them."""
    found = set()
    for line in report.read_text().splitlines():
        if (m := SURVIVED.match(line)) and m["module"] == module:
            found.add((m["text"].strip(), int(m["col"]) - 1, m["what"]))
    return found


def _copy_tree(source: Path, to: Path) -> Path:
    shutil.copytree(source, to, ignore=COPY_IGNORE)
    return to


def main() -> int:
    # Started in the background (`&`), this process inherits SIGINT ignored, and so would the
    # tests: a test that interrupts itself would wait instead. A handler is reset on exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
    ap.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds per mutant's tests (with --covered: on top of twice their traced time)",
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N mutants")
    ap.add_argument(
        "--lines",
        type=line_span,
        metavar="FIRST-LAST",
        help="only the mutants on these lines of the module (both included)",
    )
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument(
        "--covered",
        action="store_true",
        help="trace the tests once; run each mutant against the tests that run its line",
    )
    ap.add_argument("--jobs", type=int, default=1, help="mutants tested at once (tree copies)")
    ap.add_argument(
        "--coverage-cache",
        type=Path,
        metavar="FILE",
        help="with --covered: keep the traced run's map here, and reuse it while the module "
        "and the test files are unchanged",
    )
    ap.add_argument(
        "--survivors-of",
        type=Path,
        metavar="REPORT",
        help="only the mutants that an earlier run's printed report says survived",
    )
    ap.add_argument(
        "--run-uncovered",
        action="store_true",
        help="with --covered: a mutant on a line no traced process ran gets every test (its "
        "tests may run it in a process the tracer cannot reach: one started with a clean "
        "environment), instead of counting as a survivor unrun",
    )
    a = ap.parse_args()
    if a.jobs > 1 and not a.copy:
        ap.error("--jobs N mutates copies of the tree: give --copy too")
    if not (a.root / a.module).is_file():
        ap.error(f"no module {a.module} under {a.root}")
    if a.list:
        lines = (a.root / a.module).read_text().splitlines()
        for m in mutants((a.root / a.module).read_text(), a.lines):
            print(f"{a.module}:{m.line}: {m.describe()}  | {lines[m.line - 1].strip()}")
        return 0
    again = survivors_of(a.survivors_of, a.module) if a.survivors_of else None
    cache = a.coverage_cache.resolve() if a.coverage_cache else None
    options = (a.timeout, a.limit, a.covered, a.jobs, a.run_uncovered, again, cache, a.lines)
    if not a.copy:
        return probe(a.root, a.module, a.tests, *options)
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
        return probe(tree, a.module, a.tests, *options)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
