"""The shortcut (orchestrator/shortcut.py) answers `orch status PLAN` and `orch run PLAN` of a
finished plan before click is imported: it must read argv as click does wherever it answers,
print what cli.py prints, and leave everything else to cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.core import ParameterSource
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import cli
from orchestrator.shortcut import Plain, read_plain
from tests.conftest import ORCH

PLAN = """\
name: short
tasks:
  - id: a
    kind: shell
    params: {command: "echo a"}
  - id: b
    kind: shell
    params: {command: "echo b"}
    needs: a
"""
# What the shortcut's options are, with their neighbours: it must decline what it does not know.
WORDS = ["run", "status", "p.yaml", "q.yaml", "-q", "--quiet", "--store", "s.db", "--store=s.db",
         "--store=", "--json", "-w", "--watch", "--", "-", "", "--var", "k=v", "-h", "--rerun",
         "a", "-qq", "--stor", "--store=-x"]  # fmt: skip
ANSWERED = {"plan_file", "store_opt", "quiet"}


def clicks_reading(argv: list[str], environ: dict[str, str]) -> Plain | None:
    """What click makes of argv: a Plain if it parses with every other option at its default."""
    command = cli.commands.get(argv[0]) if argv else None
    if command is None or argv[0] not in ("run", "status"):
        return None
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        ctx = command.make_context(argv[0], argv[1:])
    except click.exceptions.ClickException:
        return None
    finally:
        os.environ.clear()
        os.environ.update(old)
    others = set(ctx.params) - ANSWERED
    if any(ctx.get_parameter_source(name) != ParameterSource.DEFAULT for name in others):
        return None
    if ctx.params["plan_file"] is None:
        return None
    return Plain(argv[0], ctx.params["plan_file"], ctx.params["store_opt"],
                 ctx.params.get("quiet", False))  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(
    argv=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
    orch_store=st.sampled_from([None, "", "env.db"]),
)
def test_where_the_shortcut_reads_argv_click_reads_it_the_same(
    argv: list[str], orch_store: str | None
) -> None:
    environ = {} if orch_store is None else {"ORCH_STORE": orch_store}
    mine = read_plain(argv, environ)
    if mine is not None:
        assert mine == clicks_reading(argv, environ)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["status", "p.yaml"], Plain("status", Path("p.yaml"), None, False)),
        (["status", "--store", "s.db", "p.yaml"], Plain("status", Path("p.yaml"), "s.db", False)),
        (["run", "p.yaml", "-q", "--store=s.db"], Plain("run", Path("p.yaml"), "s.db", True)),
        (["run", "--quiet", "p.yaml"], Plain("run", Path("p.yaml"), None, True)),
        (["status", "p.yaml", "--json"], None),
        (["status", "-q", "p.yaml"], None),
        (["run", "p.yaml", "-q", "-q"], None),
        (["run", "p.yaml", "--store", "a.db", "--store", "b.db"], None),
        (["status"], None),
        (["validate", "p.yaml"], None),
    ],
)
def test_the_shortcut_takes_the_plain_forms_only(argv: list[str], expected: Plain | None) -> None:
    assert read_plain(argv, {}) == expected


def test_orch_store_is_the_store_unless_store_is_given() -> None:
    assert read_plain(["status", "p.yaml"], {"ORCH_STORE": "e.db"}).store_opt == "e.db"  # type: ignore[union-attr]
    assert read_plain(["status", "p.yaml", "--store", "s.db"], {"ORCH_STORE": "e.db"}) == Plain(
        "status", Path("p.yaml"), "s.db", False
    )


# Each entry point run as a process, reporting whether click was imported.
REPORTS_CLICK = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('click' in sys.modules, file=sys.stderr))\n"
    "sys.argv = ['orch', *sys.argv[1:]]\n"
)
SHORTCUT = REPORTS_CLICK + "from orchestrator.shortcut import main\nmain()\n"
FULL = REPORTS_CLICK + "from orchestrator.cli import run_cli\nsys.exit(run_cli())\n"


def orch_as(entry: str, *args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> tuple[int, str, str, bool]:  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", entry, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )
    *err, clicked = done.stderr.splitlines() or ["?"]
    return done.returncode, done.stdout, "\n".join(err), clicked == "True"


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    plan = tmp_path / "short.yaml"
    plan.write_text(PLAN)
    done = subprocess.run(
        [ORCH, "run", str(plan), "-q"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return plan


@pytest.mark.parametrize(
    "args",
    [
        ["status", "short.yaml"],
        ["status", "short.yaml", "--store", ".orch/short.db"],
        ["run", "short.yaml"],
        ["run", "-q", "short.yaml"],
        ["run", "short.yaml", "--store=.orch/short.db", "--quiet"],
    ],
)
def test_a_finished_plan_is_answered_without_click_as_click_answers_it(
    finished: Path, args: list[str]
) -> None:
    short = orch_as(SHORTCUT, *args, cwd=finished.parent)
    full = orch_as(FULL, *args, cwd=finished.parent)
    assert short[:3] == full[:3]
    assert short[0] == 0 and "b " in short[1]
    assert (short[3], full[3]) == (False, True)


def test_orch_store_from_the_environment_is_honoured(finished: Path) -> None:
    moved = finished.parent / "elsewhere.db"
    (finished.parent / ".orch" / "short.db").rename(moved)
    env = {"ORCH_STORE": str(moved)}
    short = orch_as(SHORTCUT, "status", "short.yaml", cwd=finished.parent, env=env)
    assert short[0] == 0 and not short[3]
    assert short[:3] == orch_as(FULL, "status", "short.yaml", cwd=finished.parent, env=env)[:3]


@pytest.mark.parametrize(
    "change, args",
    [
        ("edit", ["status", "short.yaml"]),  # stale: the plan must be loaded
        ("edit", ["run", "short.yaml", "-q"]),  # runs what changed (so no second to compare)
        ("none", ["status", "short.yaml", "--json"]),  # an option the shortcut leaves to click
        ("none", ["status", "missing.yaml"]),  # an error, said by cli.py
        ("lock", ["run", "short.yaml"]),  # a store in use
    ],
)
def test_what_the_shortcut_does_not_answer_goes_to_click_untouched(
    finished: Path, change: str, args: list[str]
) -> None:
    if change == "edit":
        finished.write_text(PLAN.replace('"echo b"', '"echo B"'))
    holder = None
    if change == "lock":  # a live run holds the store's lock
        from orchestrator.store.lock import RunLock

        holder = RunLock(finished.parent / ".orch" / "short.db")
        holder.acquire({"pid": os.getpid(), "host": "here"})
    try:
        short = orch_as(SHORTCUT, *args, cwd=finished.parent)
        full = orch_as(FULL, *args, cwd=finished.parent)
    finally:
        if holder is not None:
            holder.release()
    assert short[3], "click was not imported: the shortcut answered"
    if change == "edit" and args[0] == "run":
        assert short[0] == 0 and "run #2" in short[1]
        return
    assert short[:3] == full[:3]
