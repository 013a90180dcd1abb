"""Engine benchmark: executor overhead per task, re-run cost, and `orch status` start-up,
against doit and DBOS measured in the same run.

    python bench/bench_engine.py [--quick] [--no-doit] [--against REV] [--json PATH]

Every figure is measured in this run, next to `python -c pass` on the same machine, so ratios
transfer across machines. Plans of no-op `python` tasks (bench_noop:noop) are written to a temp
dir. The engine commits every status change before the side effect that follows it (a run
alone: a task's start together with the previous task's completion), measured below.

doit (the fastest durable-ish runner we know; it writes its state once, at the end) is
installed into the benchmark's own environment, bench/.doit-venv (pip, once), never into
orch's: the same 1000-task chain of no-op Python actions as a dodo.py, run, re-run when every
task is up to date, and listed with `doit list --all --status`, each with two up-to-date checks
(`run_once`, the cheapest, and `config_changed`). orch's ratios are to the faster of the two
for each figure, the row naming it (issue 12's targets: at most 1.5, 0.5 and 1.0).

--against REV adds orch at commit REV (a git worktree of it in the temp dir with its own venv,
`pip install -e .` as this tree's; removed after) to those figures, run interleaved with this
tree's: `ratio orch/orch@REV` above 1 says this tree is slower. With --no-doit, only the two
orchs are compared there: the quick regression guard.

doit records nothing until the end; the peers for a record committed before each side effect
are durable-execution engines. DBOS Transact (its own environment, bench/.dbos-venv) runs the
same chains as one workflow of no-op steps on SQLite, each step's result checkpointed before
the next step starts, in two settings: as shipped (rollback journal, synchronous=FULL: an fsync
a step) and at orch's durability (WAL, synchronous=NORMAL: durable at checkpoint, a crash of
the process loses nothing, a power cut may lose the last commits). The same workflow id again
is its re-run (the recorded result is returned), `DBOS.list_workflows()` its status. Process
wall time, as for doit and orch; DBOS ends with os._exit once its record is written (its
orderly shutdown joins its queue threads for a second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from orchestrator.plan.model import Plan, load_plan
from orchestrator.run.loop import RunOptions, execute
from orchestrator.store.db import runs_dir

BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable
ORCH = str(Path(PYTHON).with_name("orch"))
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p
    ),
    "NO_COLOR": "1",
}
PER_TASK_REF = "doit 0.09 (state at end) · Luigi 2.75 · Prefect 4.4"
RERUN_REF = "doit 155 · Luigi 238 · Prefect 15000"
STATUS_REF = "doit 88 · luigi 221 · prefect 1700"
Thunk = Callable[[], object]
# What `orch run PLAN` does, timed phase by phase inside a fresh interpreter (the bench's own
# heap would slow load_plan's garbage collections); prints [imports, load_plan, execute] in s.
PHASES = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
import orchestrator.cli
from orchestrator.run.loop import RunOptions, execute
from orchestrator.plan.model import load_plan
t1 = time.perf_counter()
plan = load_plan(Path(sys.argv[1]))
t2 = time.perf_counter()
execute(plan, Path(sys.argv[2]), RunOptions(console_level="warning"))
print(json.dumps([t1 - t0, t2 - t1, time.perf_counter() - t2]))
"""


@dataclass
class Row:
    section: str
    figure: str
    value: float
    unit: str
    ratio: float | None = None  # to `python -c pass`, for whole-process start-up figures
    ratio_bare: float | None = None  # to `python -S -c pass`: no site, no .pth finders
    reference: str = ""
    target: str = ""


def write_plan(directory: Path, shape: str, n: int, kind: str = "python") -> Path:
    """n no-op tasks: `chain` (each needs the previous) or `fan` (all need t0); `python`
    (bench_noop:noop, in orch's process) or `shell` (`true`, a process each)."""
    name = f"{shape}{n}" if kind == "python" else f"{shape}{n}-{kind}"
    params = {"python": '{function: "bench_noop:noop"}', "shell": '{command: "true"}'}[kind]
    lines = [f"name: {name}", "tasks:"]
    for i in range(n):
        lines += [f"  - id: t{i}", f"    kind: {kind}", f"    params: {params}"]
        if i:
            lines.append(f"    needs: t{i - 1 if shape == 'chain' else 0}")
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(fn: Thunk) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_s(fn: Thunk, reps: int, setup: Thunk = lambda: None) -> float:
    samples = []
    for _ in range(reps):
        setup()
        samples.append(timed(fn))
    return statistics.median(samples)


def proc(argv: Sequence[str]) -> Thunk:
    def run() -> None:
        r = subprocess.run(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode()}")

    return run


def interleaved(commands: Sequence[Sequence[str]], reps: int) -> list[list[float]]:
    """Seconds of each command, reps times, run in turn so that drift hits all alike."""
    samples: list[list[float]] = [[] for _ in commands]
    for _ in range(reps):
        for i, argv in enumerate(commands):
            samples[i].append(timed(proc(argv)))
    return samples


def round_robin(commands: Sequence[Sequence[str]], reps: int) -> list[float]:
    """Median seconds of each command, run in turn (interleaved)."""
    return [statistics.median(s) for s in interleaved(commands, reps)]


def executes(plan: Plan, store: Path) -> Thunk:
    return lambda: execute(plan, store, RunOptions(console_level="warning"))


def fresh(store: Path) -> Thunk:
    """Remove a store and what lives beside it: WAL, lock, run logs."""

    def clear() -> None:
        for p in store.parent.glob(store.name + "*"):
            p.unlink()
        shutil.rmtree(runs_dir(store), ignore_errors=True)

    return clear


@contextmanager
def without_sync_rule() -> Iterator[None]:
    """orch's store as before issue 41 (tests/crashharness.py's NO_SYNC_RULE), in this process."""
    from orchestrator.store import db

    sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
    from crashharness import NO_SYNC_RULE

    saved = db.Store._tx, db.Store.after_commit
    exec(NO_SYNC_RULE, {})
    try:
        yield
    finally:
        db.Store._tx, db.Store.after_commit = saved  # type: ignore[method-assign]


def sync_rule_rows(path: Path, store: Path, reps: int) -> list[Row]:
    """What the sync rule (an outcome's commit fsynced before orch goes on or says it; a start
    not) costs a step: `execute()` of the chain of 1000 with and without it, interleaved, on
    the file system the bench's folder is on (named: an fsync costs what the disk makes it)."""
    plan, with_rule, without = load_plan(path), [], []
    for _ in range(reps):
        fresh(store)()
        with_rule.append(timed(executes(plan, store)))
        fresh(store)()
        with without_sync_rule():
            without.append(timed(executes(plan, store)))
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(store.parent)], capture_output=True,
                        text=True).stdout.strip() or "?"  # fmt: skip
    a, b = statistics.median(with_rule), statistics.median(without)  # s per 1000: ms a task
    return [
        Row(
            "executor", f"execute(), chain of 1000, the sync rule (issue 41), on {fs}", a, "ms/task"
        ),
        Row("executor", "  the same, every commit synchronous=NORMAL (before)", b, "ms/task"),
        Row("executor", "  the rule's cost per step", a - b, "ms/task"),
    ]


def changes_per_task(store: Path, n: int) -> float:
    """Status changes the last run recorded, per task (a run alone commits a completion with
    the next start: about one commit per task for these two)."""
    with closing(sqlite3.connect(store)) as c:
        return (
            float(
                c.execute(
                    "SELECT count(*) FROM transitions WHERE from_status IS NOT NULL"
                    " AND run_id=(SELECT max(id) FROM runs)"
                ).fetchone()[0]
            )
            / n
        )


def sqlite_floor_s(path: Path, n: int) -> float:
    """Bare cost of what a run of n tasks commits, with the store's settings: 1 KiB pages,
    WAL, synchronous=NORMAL, and one commit per task holding the task's start and the previous
    task's completion (as a run alone does)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as c:
        c.executescript(
            "PRAGMA page_size=1024; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
            "CREATE TABLE t(id TEXT PRIMARY KEY, status TEXT);"
            "CREATE TABLE log(seq INTEGER PRIMARY KEY, id TEXT, status TEXT);"
            "CREATE INDEX log_id ON log(id, seq);"
        )
        c.executemany("INSERT INTO t VALUES (?, 'pending')", [(f"t{i}",) for i in range(n)])
        t0 = time.perf_counter()
        for i in range(n):
            c.execute("BEGIN IMMEDIATE")
            for task, status in ((f"t{i - 1}", "completed"), (f"t{i}", "in_progress")):
                c.execute("SELECT status FROM t WHERE id=?", (task,))
                c.execute("UPDATE t SET status=? WHERE id=?", (status, task))
                c.execute("INSERT INTO log(id, status) VALUES (?, ?)", (task, status))
            c.execute("COMMIT")
        return time.perf_counter() - t0


# The fixed parts of orch's design alone, for a plan of no-op tasks: the plan read by libyaml
# and each task validated by pydantic; per task one commit (the previous task's completion and
# this one's start, a SELECT, UPDATE and INSERT each, the store's pragmas); two structlog events
# written as JSON lines. No engine: what any engine built of these parts pays per task.
FLOOR = """
import sqlite3, sys, time
import pydantic, structlog, yaml

class Task(pydantic.BaseModel):
    id: str
    kind: str
    params: dict = {}
    needs: str | list[str] = []

def noop():
    return None

with open(sys.argv[1]) as f:
    tasks = [Task.model_validate(t) for t in yaml.load(f, Loader=yaml.CSafeLoader)["tasks"]]
c = sqlite3.connect(sys.argv[2], isolation_level=None)
c.executescript(
    "PRAGMA page_size=1024; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    "CREATE TABLE todos(id TEXT PRIMARY KEY, status TEXT, attempts INT, at REAL);"
    "CREATE TABLE transitions(seq INTEGER PRIMARY KEY, task_id TEXT, to_status TEXT, at REAL);"
    "CREATE INDEX t_id ON transitions(task_id, seq);"
)
c.executemany("INSERT INTO todos VALUES (?, 'pending', 0, 0)", [(t.id,) for t in tasks])
sink = open(sys.argv[2] + ".jsonl", "w")
structlog.configure(
    processors=[structlog.processors.TimeStamper(fmt="iso"), structlog.processors.JSONRenderer()],
    logger_factory=structlog.WriteLoggerFactory(sink),
)
log = structlog.get_logger().bind(run=1)
done = []
for t in tasks:
    c.execute("BEGIN IMMEDIATE")
    for task_id, status in (*done, (t.id, "in_progress")):
        c.execute("SELECT status, attempts FROM todos WHERE id=?", (task_id,)).fetchone()
        c.execute("UPDATE todos SET status=?, at=? WHERE id=?", (status, time.time(), task_id))
        c.execute(
            "INSERT INTO transitions(task_id, to_status, at) VALUES (?, ?, ?)",
            (task_id, status, time.time()),
        )
    c.execute("COMMIT")
    log.info("task.started", task=t.id)
    noop()
    log.info("task.completed", task=t.id)
    done = [(t.id, "completed")]
c.execute("UPDATE todos SET status='completed' WHERE id=?", (done[0][0],))
"""

DOIT_VERSION = "0.37.0"
BIG = 3000  # the long chain of the marginal per-task figure: 2000 tasks more than 1000
DOIT_VENV = BENCH_DIR / ".doit-venv"
# doit's two up-to-date checks that skip a task once it ran: `run_once` (the cheapest: a
# saved flag) and `config_changed` (a saved value compared at each run). orch is held against
# the faster of them.
DOIT_CHECKS = {"run_once": "run_once", "config_changed": 'config_changed("v1")'}
DODO = """
from doit.tools import {check}


def noop():
    return None


def task_t():
    for i in range({n}):
        yield {{
            "name": f"t{{i}}",
            "actions": [noop],
            "task_dep": [f"t:t{{i - 1}}"] if i else [],
            # Not done until run once (saved state), then up to date: a re-run skips it.
            # (`uptodate: [True]` alone would skip it from the first run on.)
            "uptodate": [{uptodate}],
            "verbosity": 0,
        }}
"""


DBOS_VERSION = "3.4.0"
DBOS_VENV = BENCH_DIR / ".dbos-venv"
DBOS_APP = """
import os, sys
from dbos import DBOS, SetWorkflowID

db, n, durability, action = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if durability == "orch":  # orch's settings on every connection DBOS opens
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def pragmas(conn, record):
        cur = conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.workflow()
def chain(n: int) -> int:
    for i in range(n):
        noop(i)
    return n


DBOS(config={"name": "chain", "system_database_url": f"sqlite:///{db}", "run_admin_server": False})
DBOS.launch()
if action == "run":
    with SetWorkflowID(f"chain-{n}"):  # the same id again: the recorded result
        assert chain(n) == n
else:
    assert [w.status for w in DBOS.list_workflows()] == ["SUCCESS"]
sys.stdout.flush()
os._exit(0)  # recorded already; DBOS.destroy() would join its queue threads for a second
"""


def venv_python(venv: Path, *install: str) -> Path:
    """The python of `venv`, made on first use with `pip install -q *install`."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *install], check=True)
    return python


def dbos_python() -> str:
    """The benchmark's own DBOS environment, made on first use."""
    return str(venv_python(DBOS_VENV, f"dbos=={DBOS_VERSION}"))


def dbos_rows(
    tmp: Path, reps: int, orch_run: list[str], orch_status: list[str], clear_store: Thunk
) -> list[Row]:
    """DBOS at both durabilities beside orch, interleaved: the marginal cost of a step, the
    re-run of a finished chain of 1000 and the status listing, with the ratios to orch."""
    python, ms = dbos_python(), 1000.0
    app = tmp / "dbos_chain.py"
    app.write_text(DBOS_APP)
    durability = {"shipped": "shipped", "wal": "orch"}  # DBOS as shipped; at orch's settings
    command: dict[tuple[str, int], list[str]] = {}
    clear: dict[tuple[str, int], Thunk] = {}
    for tool, setting in durability.items():
        for n in (1000, BIG):
            db = tmp / f"dbos-{tool}-{n}.sqlite"
            command[tool, n] = [python, str(app), str(db), str(n), setting]
            clear[tool, n] = fresh(db)
    plan_big, store_big = write_plan(tmp, "chain", BIG), tmp / f"chain{BIG}-vs-dbos.db"
    command["orch", 1000], clear["orch", 1000] = orch_run, clear_store
    command["orch", BIG] = [ORCH, "run", str(plan_big), "-q", "--store", str(store_big)]
    clear["orch", BIG] = fresh(store_big)
    tools = (*durability, "orch")
    run_of = {k: v + ["run"] if k[0] != "orch" else v for k, v in command.items()}
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(reps):
        for n in (1000, BIG):
            for tool in tools:
                clear[tool, n]()
                runs.setdefault((tool, n), []).append(timed(proc(run_of[tool, n])))
    med = {k: statistics.median(v) for k, v in runs.items()}
    step = {t: (med[t, BIG] - med[t, 1000]) / (BIG - 1000) for t in tools}
    for tool in tools:  # the chains of 1000 finished: what a re-run and a listing face
        proc(run_of[tool, 1000])()
    rerun = dict(zip(tools, round_robin([run_of[t, 1000] for t in tools], reps), strict=True))
    listed = [[*command[t, 1000], "status"] for t in durability] + [orch_status]
    status = dict(zip(tools, round_robin(listed, reps), strict=True))
    name = {"shipped": f"DBOS {DBOS_VERSION} as shipped", "wal": "DBOS, orch's durability",
            "orch": "orch"}  # fmt: skip
    durable = {
        "shipped": "rollback journal, synchronous=FULL: an fsync a step",
        "wal": "WAL, synchronous=NORMAL (set on each connection)",
        "orch": "WAL, synchronous=NORMAL: a commit a status change",
    }
    rows: list[Row] = []
    for label, figures, unit in (
        ("per step (marginal)", step, "ms/task"),
        ("re-run of 1000", rerun, "ms"),
        ("status of 1000", status, "ms"),
    ):
        rows += [Row("vs DBOS", f"{name[t]}, {label}", figures[t] * ms, unit,
                     reference=durable[t]) for t in tools]  # fmt: skip
        rows += [Row("vs DBOS", f"  ratio orch/{name[t]}", figures["orch"] / figures[t], "x")
                 for t in durability]  # fmt: skip
    return rows


def _unlink_all(folder: Path, pattern: str) -> None:
    for p in folder.glob(pattern):
        p.unlink()


def doit_command() -> list[str]:
    """`python -m doit` of the benchmark's own environment, made on first use."""
    return [str(venv_python(DOIT_VENV, f"doit=={DOIT_VERSION}")), "-m", "doit"]


@contextmanager
def orch_of(rev: str, tmp: Path) -> Iterator[tuple[str, str]]:
    """(label, path of its `orch`) for commit `rev` of this repository: a git worktree in
    `tmp` with its own venv, built as this tree's (`pip install -e .`, bytecode written);
    the worktree is removed after."""
    root = BENCH_DIR.parent
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    tree = tmp / f"orch-{sha}"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "-q", "--detach", str(tree), sha],
                   check=True)  # fmt: skip
    try:
        python = venv_python(tree / ".venv", "-e", str(tree))
        compile_sources(tree)
        yield f"orch@{sha}", str(python.with_name("orch"))
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                       check=True)  # fmt: skip


def doit_rows(tmp: Path, reps: int, orchs: dict[str, str], with_doit: bool = True) -> list[Row]:
    """orch (each of `orchs`: label -> its `orch`, this tree's first) beside doit, run both
    ways (DOIT_CHECKS), every figure's commands interleaved (drift hits all alike).

    Per task, two figures: the whole run of the 1000-task chain less `python -c pass` (what
    start-up costs, imports and all, spread over the tasks), and the marginal cost of a task:
    (run of 3000 - run of 1000) / 2000, start-up cancelled out. The issue's figures (orch 0.284,
    doit 0.109 ms) are the marginal kind. Then the re-run of the finished chain of 1000 and its
    listing. orch's ratios are to the faster doit of each figure (the row names it), the
    target (1.5x) of the per-task one judged on the marginal figure; another orch's to this
    tree's (this tree / it: above 1, this tree is slower)."""
    ms, folder = 1000.0, tmp / "peers"
    folder.mkdir()
    doit = doit_command() if with_doit else []
    doits = [f"doit {check}" for check in DOIT_CHECKS] if with_doit else []
    here, *others = orchs
    run_of: dict[tuple[str, int], list[str]] = {}
    listing: dict[tuple[str, int], list[str]] = {}
    clear: dict[tuple[str, int], Thunk] = {}
    for n in (1000, BIG):
        plan = write_plan(folder, "chain", n)
        for tool, check in zip(doits, DOIT_CHECKS, strict=False):
            dodo = folder / f"{check}{n}" / "dodo.py"
            dodo.parent.mkdir()
            dodo.write_text(DODO.format(n=n, check=check, uptodate=DOIT_CHECKS[check]))
            at = ["-f", str(dodo), "--dir", str(dodo.parent)]
            run_of[tool, n], listing[tool, n] = (
                [*doit, "run", *at],
                [*doit, "list", "--all", "--status", *at],
            )
            clear[tool, n] = partial(_unlink_all, dodo.parent, ".doit.db*")
        for i, (tool, orch) in enumerate(orchs.items()):
            store = folder / f"orch{i}-{n}.db"
            run_of[tool, n] = [orch, "run", str(plan), "-q", "--store", str(store)]
            listing[tool, n] = [orch, "status", str(plan), "--store", str(store)]
            clear[tool, n] = fresh(store)
        if with_doit:  # the design's fixed parts alone (FLOOR)
            floor = folder / f"floor{n}.db"
            run_of["fixed parts", n] = [PYTHON, "-c", FLOOR, str(plan), str(floor)]
            clear["fixed parts", n] = fresh(floor)
    tools = list(dict.fromkeys(tool for tool, _ in run_of))
    passes: list[float] = []
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(reps):
        passes.append(timed(proc([PYTHON, "-c", "pass"])))
        for key, argv in run_of.items():
            clear[key]()
            runs.setdefault(key, []).append(timed(proc(argv)))
    pass_s = statistics.median(passes)
    med = {k: statistics.median(v) for k, v in runs.items()}
    whole = {tool: (med[tool, 1000] - pass_s) / 1000 for tool in tools}
    marginal = {tool: (med[tool, BIG] - med[tool, 1000]) / (BIG - 1000) for tool in tools}
    finished = [t for t in tools if t != "fixed parts"]
    for tool in finished:  # the chains of 1000 finished: what a re-run and a listing face
        proc(run_of[tool, 1000])()
    rerun = dict(zip(finished, interleaved([run_of[t, 1000] for t in finished], reps), strict=True))
    status = dict(
        zip(finished, interleaved([listing[t, 1000] for t in finished], reps), strict=True)
    )

    section = "vs doit" if with_doit else f"vs {', '.join(others)}"
    rows: list[Row] = []
    for label, samples, figures, unit, target in (
        (f"per task, marginal: ({BIG} - 1000 chain) / {BIG - 1000}", {}, marginal, "ms/task",
         "≤1.5"),
        ("per task, whole run of 1000 less python -c pass", {}, whole, "ms/task", ""),
        ("re-run of the finished chain of 1000", rerun, None, "ms", "≤0.5"),
        ("status of it (doit: list --all --status)", status, None, "ms", "≤0.5"),
    ):  # fmt: skip
        figures = figures or {t: statistics.median(s) for t, s in samples.items()}
        rows += [Row(section, f"{t}, {label}", figures[t] * ms, unit,
                     reference=f"min {min(samples[t]) * ms:.1f}" if samples else "")
                 for t in figures]  # fmt: skip
        if doits:
            fast = min(doits, key=figures.__getitem__)
            rows.append(Row(section, f"  ratio {here}/{fast}", figures[here] / figures[fast], "x",
                            target=target))  # fmt: skip
            if figures is marginal:
                rows.append(Row(section, f"  ratio fixed parts/{fast}",
                                figures["fixed parts"] / figures[fast], "x"))  # fmt: skip
        rows += [Row(section, f"  ratio {here}/{other}", figures[here] / figures[other], "x",
                     reference="above 1: this tree is slower") for other in others]  # fmt: skip
    return rows


def compile_sources(root: Path = BENCH_DIR.parent) -> None:
    """Write orch's bytecode, as pip does for an installed package (doit's in its venv): an
    editable install run under PYTHONDONTWRITEBYTECODE=1 would compile every module at every
    start, which no installed tool pays."""
    import compileall

    for package in ("orchestrator", "tasks", "probes", "bench"):
        compileall.compile_dir(str(root / package), quiet=1)


def bench(tmp: Path, quick: bool, with_doit: bool = True, against: str | None = None) -> list[Row]:
    compile_sources()
    reps_exec, reps_proc, reps_rerun, reps_cli = (1, 2, 3, 5) if quick else (3, 5, 7, 15)
    sys.path.insert(0, str(BENCH_DIR))
    rows: list[Row] = []
    ms = 1000.0
    pass_s = median_s(proc([PYTHON, "-c", "pass"]), reps_cli)
    warm = write_plan(tmp, "chain", 2)  # pays the one-time imports (sqlite_utils, builtins)
    executes(load_plan(warm), tmp / "warm.db")()

    # 1. Overhead per no-op task, in-process and as a whole `orch run`.
    plans, took = {}, {}
    for n in (100, 1000):
        for shape in ("chain", "fan"):
            path = plans[shape, n] = write_plan(tmp, shape, n)
            plan, store = load_plan(path), tmp / f"{shape}{n}.db"
            s = took[shape, n] = median_s(executes(plan, store), reps_exec, fresh(store))
            rows.append(
                Row(
                    "executor",
                    f"execute(), {shape} of {n}",
                    s * ms / n,
                    "ms/task",
                    reference=PER_TASK_REF,
                    target="≤0.2",
                )
            )
            s = median_s(
                proc([ORCH, "run", str(path), "-q", "--store", str(store)]), reps_proc, fresh(store)
            )
            rows.append(
                Row(
                    "executor",
                    f"orch run - python -c pass, {shape} of {n}",
                    (s - pass_s) * ms / n,
                    "ms/task",
                )
            )
    for shape in ("chain", "fan"):  # without what a run pays once (schema, open, sync)
        rows.append(
            Row(
                "executor",
                f"execute(), marginal per task, {shape} 100→1000",
                (took[shape, 1000] - took[shape, 100]) * ms / 900,
                "ms/task",
            )
        )
    rows.append(
        Row(
            "executor",
            "status changes per task (counted)",
            changes_per_task(tmp / "chain1000.db", 1000),
            "changes",
        )
    )
    rows += sync_rule_rows(plans["chain", 1000], tmp / "chain1000.db", reps_exec)
    floor = statistics.median(sqlite_floor_s(tmp / f"floor{i}.db", 1000) for i in range(3))
    rows.append(
        Row("executor", "  bare SQLite floor for their commits", floor * ms / 1000, "ms/task")
    )

    # 2. Re-running the finished 1000-task chain (its store is complete from the loop above).
    # Unchanged plan file: the store answers (orchestrator/store/finished.py). Edited file (a
    # comment appended): the full path loads and validates the plan, then finds every task done.
    path, store = plans["chain", 1000], tmp / "chain1000.db"
    rerun = [ORCH, "run", str(path), "-q", "--store", str(store)]
    passes, fasts, wholes, phases = [], [], [], []
    for i in range(reps_rerun):  # interleaved, so that drift hits the parts and the whole alike
        passes.append(timed(proc([PYTHON, "-c", "pass"])))
        with path.open("a") as f:
            f.write(f"# edit {i}\n")
        wholes.append(timed(proc(rerun)))
        phases.append(
            json.loads(
                subprocess.run(
                    [PYTHON, "-c", PHASES, str(path), str(store)],
                    env=ENV,
                    check=True,
                    capture_output=True,
                ).stdout
            )
        )
        proc(rerun)()  # PHASES's execute() recorded no digest: record it, untimed
        fasts.append(timed(proc(rerun)))
    pass_s, whole = statistics.median(passes), statistics.median(wholes)
    imports, load, run = (statistics.median(p) for p in zip(*phases, strict=True))
    rest = whole - pass_s - imports - load - run
    fast = statistics.median(fasts)
    rows += [
        Row(
            "rerun 1000",
            "orch run, plan unchanged (whole process)",
            fast * ms,
            "ms",
            fast / pass_s,
            reference=RERUN_REF,
            target="≤80",
        ),
        Row(
            "rerun 1000",
            "orch run, plan edited: full load (whole)",
            whole * ms,
            "ms",
            whole / pass_s,
            reference=RERUN_REF,
            target="≤80",
        ),
        Row("rerun 1000", "  python -c pass", pass_s * ms, "ms"),
        Row("rerun 1000", "  + imports (orchestrator.cli, .run.loop)", imports * ms, "ms"),
        Row("rerun 1000", "  + load_plan (timed in-process)", load * ms, "ms"),
        Row("rerun 1000", "  + execute (timed in-process)", run * ms, "ms"),
        Row("rerun 1000", "  + rest: board print, exit (remainder)", rest * ms, "ms"),
    ]

    # 3. Cold start of `orch status` against references, all as whole processes.
    small = write_plan(tmp, "chain", 6)
    proc([ORCH, "run", str(small), "-q", "--store", str(tmp / "chain6.db")])()
    cli = [
        ("python -c pass", [PYTHON, "-c", "pass"], "9 (reference machine)", ""),
        ("python -S -c pass (no site, no .pth)", [PYTHON, "-S", "-c", "pass"], "", ""),
        ("python -c 'import click'", [PYTHON, "-c", "import click"], "", ""),
        (
            "python -c 'import pydantic, click, ...'",
            [PYTHON, "-c", "import pydantic, click, structlog, sqlite_utils, psutil"],
            "",
            "",
        ),
        (
            "orch status, 6-task store",
            [ORCH, "status", "--store", str(tmp / "chain6.db")],
            STATUS_REF,
            "≤60 (6.7×)",
        ),
        (
            "orch status, 1000-task store",
            [ORCH, "status", "--store", str(store)],
            STATUS_REF,
            "≤60 (6.7×)",
        ),
    ]
    times = round_robin([c[1] for c in cli], reps_cli)
    for (label, _, reference, target), s in zip(cli, times, strict=True):
        rows.append(
            Row("cli start", label, s * ms, "ms", s / times[0], s / times[1], reference, target)
        )

    # 4. DBOS beside orch; 5. doit, and with --against REV that tree, last: their ratios
    # close the output.
    if with_doit:
        status = [ORCH, "status", str(path), "--store", str(store)]
        rows += dbos_rows(tmp, reps_proc, rerun, status, fresh(store))
    with ExitStack() as stack:
        orchs = {"orch": ORCH}
        if against:
            label, other = stack.enter_context(orch_of(against, tmp))
            orchs[label] = other
        if with_doit or against:
            rows += doit_rows(tmp, reps_proc, orchs, with_doit)
    return rows


def render(rows: list[Row], quick: bool) -> str:
    out = [
        f"orch engine bench{' (--quick)' if quick else ''}: python {sys.version.split()[0]},"
        f" {os.cpu_count()} CPUs, medians. Every task status change is committed before the"
        " side effect that follows it; doit writes its state only at the end."
    ]
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        out.append(
            "note: PYTHONDONTWRITEBYTECODE is set: orch's own bytecode was written first"
            " (as pip writes an installed package's); other modules without it compile at"
            " every start"
        )
    width = max(44, *(len(r.figure) for r in rows))
    head = (
        f"{'figure':<{width}} {'value':>8} {'unit':<7} {'/pass':>5} {'/bare':>5}  {'target':<11}"
        " reference (issue, its machine)"
    )
    section = ""
    for r in rows:
        if r.section != section:
            section = r.section
            out += ["", f"[{section}]", head]
        ratio = f"{r.ratio:.1f}×" if r.ratio is not None else ""
        bare = f"{r.ratio_bare:.1f}×" if r.ratio_bare is not None else ""
        value = (
            f"{r.value:.3f}"
            if r.unit == "ms/task"
            else f"{r.value:.2f}"
            if r.unit == "x"
            else f"{r.value:.1f}"
        )
        out.append(
            f"{r.figure:<{width}} {value:>8} {r.unit:<7} {ratio:>5} {bare:>5}  {r.target:<11}"
            f" {r.reference}".rstrip()
        )
    out.append(
        "\n/pass: ratio to `python -c pass` here (status target 60/9 ≈ 6.7×);"
        " /bare: to `python -S -c pass`"
    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    parser.add_argument("--no-doit", action="store_true", help="skip the doit and DBOS comparisons")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run orch's figures for commit REV (a git worktree and venv made for the run;"
        " interleaved with this tree's): a ratio above 1 says this tree is slower",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        rows = bench(Path(tmp), args.quick, not args.no_doit, args.against)
    print(render(rows, args.quick))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"quick": args.quick, "python": sys.version, "rows": [asdict(r) for r in rows]},
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
