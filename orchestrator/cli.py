"""`orch`: run a plan, show its todo board, explain what a run would do.

A command parses its arguments, makes its call on the engine API (api.py: a Runbook) and
renders the answer (views/); `logs`, `report` and `events`, which only read, open the store
that the Runbook finds.
Only click is imported at start-up; each command imports what it needs. The entry point is
shortcut.py: `orch status PLAN` and `orch run PLAN` of a finished plan are answered there,
before click and this module (~30 ms of a ~50 ms start) are imported.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    OrchError,
    PlanError,
    UsageError,
)
from orchestrator.views.out import NOTHING_TO_DO, board_text, say, show, warn

if TYPE_CHECKING:
    from orchestrator.api import Runbook, RunRequest, RunSummary
    from orchestrator.store.db import Store
    from orchestrator.store.rows import TodoRow
    from orchestrator.views.snapshot import Snapshot

STORE_HELP = "SQLite store (default: .orch/<plan name>.db beside the plan; env ORCH_STORE)."
store_option = click.option(
    "--store", "store_opt", envvar="ORCH_STORE", metavar="PATH", help=STORE_HELP
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
# One instance for every path parameter: click.Path() asks gettext for its name, ~70 us of
# locale lookups each, at every start of orch (19 of them were ~1.3 ms of `orch status`).
PATH = click.Path(path_type=Path)
plan_argument = click.argument("plan_file", metavar="PLAN", type=PATH)


def vars_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--var KEY=VALUE (repeatable) and --vars-file FILE (a YAML mapping; a --var wins over
    it): the command receives them merged as `var_args`."""

    @functools.wraps(command)
    def merged(*args: Any, var_args: tuple[str, ...], vars_file: Path | None, **kwargs: Any) -> Any:
        return command(*args, var_args=(*_vars_file_args(vars_file), *var_args), **kwargs)

    merged = click.option(
        "--vars-file",
        type=PATH,
        metavar="FILE",
        help="Vars from a YAML mapping (a --var wins over it).",
    )(merged)
    return click.option(
        "--var",
        "var_args",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a var of the plan (value read as YAML). Repeatable.",
    )(merged)


def _vars_file_args(path: Path | None) -> tuple[str, ...]:
    """The vars file as KEY=VALUE words (JSON is YAML), so it goes where --var goes: into the
    plan and into the digest that says whether a finished plan has anything to do."""
    if path is None:
        return ()
    from orchestrator.core.files import not_a_file
    from orchestrator.plan.yamlsource import load_yaml

    if (what := not_a_file(path)) is not None:
        raise UsageError(f"--vars-file {path} is {what}, not a file")
    if not path.is_file():
        raise UsageError(f"--vars-file {path}: no such file")
    try:
        data = load_yaml(path).data
    except PlanError as exc:
        raise UsageError(f"--vars-file {path}: {exc.issues[0].message}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"--vars-file {path}: write a mapping of var names to values")
    return tuple(f"{k}={json.dumps(v)}" for k, v in data.items())


class OrchGroup(click.Group):
    """Turns orch's own errors into one clear message and their exit code, for every caller
    of `cli` (the console script, CliRunner, an embedding program): never a traceback. Every
    error is shown through `clean` here, once: messages quote what came from outside (a
    --var name, a path, a plan's text, a damaged store's), and click's own quote what was
    typed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Whether the command asked for --json: its errors are JSON on stdout then, too.
        options = args[: args.index("--")] if "--" in args else args
        ctx.meta["orch.json"] = "--json" in options
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:  # `orch --bogus`
            raise _cleaned(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PlanError as exc:
            if ctx.meta.get("orch.json"):
                click.echo(json.dumps(exc.as_json(), indent=2))
                ctx.exit(exc.exit_code)
            for issue in exc.issues:
                say(str(issue), err=True)
            n = len(exc.issues)
            click.echo(
                f"orch: {n} problem{'s' if n != 1 else ''} in the plan; nothing was run", err=True
            )
            ctx.exit(exc.exit_code)
        except OrchError as exc:
            if ctx.meta.get("orch.json"):
                error = {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
                click.echo(json.dumps(error, indent=2))
            say(f"orch: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:  # a full disk writing a log, say: the storage's fault, no bug
            from orchestrator.store.db import STORAGE_ERRNOS

            if exc.errno not in STORAGE_ERRNOS:
                raise
            from orchestrator.api import describe_os_error

            say(f"orch: {describe_os_error(exc)}", err=True)
            ctx.exit(EXIT_USAGE)
        except click.ClickException as exc:  # a command's usage error (click shows it)
            raise _cleaned(exc) from None


def _cleaned(exc: click.ClickException) -> click.ClickException:
    """Click's error with its message shown through `clean`: `No such command`, `Got
    unexpected extra argument (...)` and the like quote what was typed, not always escaped."""
    from orchestrator.core.terminal import clean

    # Final in click's stubs, yet only read when shown: rewriting it changes what is shown.
    exc.message = clean(exc.message)  # type: ignore[misc]
    return exc


@click.group(
    cls=OrchGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="orch")
def cli() -> None:
    """Run ML-infrastructure runbooks as resumable plans with a durable todo record.

    A plan is a YAML file of dependency-ordered tasks; every status change and finding goes to
    a SQLite store, so running the plan again resumes where it stopped.

    \b
    Example:
      orch validate plans/demo.yaml
      orch run plans/demo.yaml
      orch status plans/demo.yaml
    """


# --- run -------------------------------------------------------------------------------------


@cli.command()
@plan_argument
@store_option
@click.option(
    "--keep-going",
    "-k",
    is_flag=True,
    help="After a failure, still run what does not depend on it.",
)
@click.option(
    "--rerun",
    multiple=True,
    metavar="ID",
    help="Run ID again, and everything that depends on it. Repeatable.",
)
@click.option(
    "--from",
    "from_task",
    metavar="ID",
    help="Run ID and every task after it in plan order, even if completed.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="ID",
    help="Run only ID (its needs must be completed). Repeatable.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 64),
    metavar="N",
    help="Run up to N ready tasks at once (default: the plan's `jobs`, else 1).",
)
@click.option(
    "--approve",
    multiple=True,
    metavar="ID",
    help="Approve the gate ID when the run reaches it (recorded as yours). Repeatable.",
)
@vars_options
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors while running.")
@json_option
def run(
    plan_file: Path,
    store_opt: str | None,
    keep_going: bool,
    rerun: tuple[str, ...],
    from_task: str | None,
    only: tuple[str, ...],
    jobs: int | None,
    approve: tuple[str, ...],
    var_args: tuple[str, ...],
    quiet: bool,
    as_json: bool,
) -> None:
    """Run PLAN, resuming after what already completed.

    Completed tasks whose spec is unchanged are not run again; failed, blocked and interrupted
    ones are. A completed task whose spec changed is reported as stale and kept: re-run it
    with --rerun. Compensations an earlier run left due (it failed, was stopped or killed)
    run first. Exit status: 0 all done, 1 a task failed or is blocked, 2 bad plan or usage,
    3 the store is in use by another live run, 4 stopped at an approval gate, 130 interrupted.

    \b
    Example:
      orch run plans/demo.yaml
      orch run plans/demo.yaml --rerun checksum --var size_mb=16
    """
    from orchestrator.api import Runbook, RunRequest, stoppable

    stoppable()
    request = RunRequest(rerun, from_task, only, keep_going, jobs, approve)
    _execute(Runbook(plan_file, store_opt, var_args), request, quiet, as_json)


@cli.command()
@plan_argument
@store_option
@vars_options
@click.option(
    "--completed",
    is_flag=True,
    help="Undo a completed plan too: its steps' compensations are armed again and run.",
)
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors while running.")
@json_option
def rollback(
    plan_file: Path,
    store_opt: str | None,
    var_args: tuple[str, ...],
    completed: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Run PLAN's armed compensations now (the latest armed first), then its armed `finally`
    tasks; what they undo is pending again. Nothing else runs. Exit 0 if each completed.
    A plan that completed has nothing armed (it disarmed them): --completed undoes it.

    \b
    Example:
      orch rollback plans/sglang_migration.yaml
      orch rollback plans/sglang_migration.yaml --completed
    """
    from orchestrator.api import Runbook, stoppable

    stoppable()
    _execute(Runbook(plan_file, store_opt, var_args), None, quiet, as_json, completed)


@cli.command()
@plan_argument
@click.argument("task_id", metavar="ID")
@store_option
@vars_options
@click.option("--note", "-m", help="Why, or on what condition: kept with the approval.")
@json_option
def approve(
    plan_file: Path,
    task_id: str,
    store_opt: str | None,
    var_args: tuple[str, ...],
    note: str | None,
    as_json: bool,
) -> None:
    """Approve the gate ID of PLAN: the next `orch run` passes it. Recorded with who, when,
    the plan's hash and the findings upstream of the gate; a changed plan or changed findings
    void it (the gate asks again).

    \b
    Example:
      orch approve plans/sglang_migration.yaml confirm_stop -m "maintenance window"
    """
    from orchestrator.api import Runbook

    done = Runbook(plan_file, store_opt, var_args).approve(task_id, note)
    if as_json:
        click.echo(json.dumps({**done, "next": f"orch run {plan_file}"}))
        return
    say(
        f"{task_id} approved by {done['by']} (plan {done['plan_hash']}, findings "
        f"{done['findings_hash']}): `orch run {plan_file}` goes on from there"
    )


def _execute(
    runbook: Runbook,
    request: RunRequest | None,
    quiet: bool,
    as_json: bool,
    completed: bool = False,
) -> NoReturn:
    """Run (or, with no request, roll back) through the engine API, with the live board on a
    terminal; print the board; exit with the run's code."""
    from orchestrator.core.status import RunOutcome
    from orchestrator.views.liveboard import LiveBoard, wanted

    # On a terminal the board is redrawn in place and the log lines go to events.jsonl only.
    shown = not (quiet or as_json) and wanted(sys.stderr)
    live = LiveBoard(lambda: runbook.store_path.absolute()) if shown else None
    console = "critical" if live else "warning" if quiet or as_json else "info"
    on_event = live.event if live is not None else None
    try:
        if request is None:
            summary = runbook.rollback(console=console, on_event=on_event, completed=completed)
        else:
            summary = runbook.run(request, console=console, on_event=on_event)
    finally:
        if live is not None:
            live.close()
    if summary.nothing_to_do and not (quiet or as_json):
        warn(NOTHING_TO_DO)
    if summary.outcome == RunOutcome.INTERRUPTED:  # the board to stderr (stdout may be piped)
        show(runbook.status(warn), as_json, stream=None if as_json else sys.stderr)
    else:
        show(_snapshot(runbook, summary), as_json)
    sys.exit(summary.exit_code)


def _snapshot(runbook: Runbook, summary: RunSummary) -> Snapshot:
    """The board right after a run, with what the run found stale (nothing to do: as the
    store has it, no plan loaded: the fast path stays a hash and one query)."""
    from orchestrator.views.snapshot import take

    return take(runbook.store_path, None, None if summary.nothing_to_do else summary.stale, warn)


# --- status ----------------------------------------------------------------------------------


@cli.command()
@click.argument("plan_file", metavar="[PLAN]", required=False, type=PATH)
@store_option
@json_option
@click.option("--watch", "-w", is_flag=True, help="Follow a run: redraw the board as it changes.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["board", "todowrite"]),
    default="board",
    show_default=True,
    help="todowrite: the agent todo-list schema.",
)
@vars_options
def status(
    plan_file: Path | None,
    store_opt: str | None,
    as_json: bool,
    fmt: str,
    watch: bool,
    var_args: tuple[str, ...],
) -> None:
    """Show the todo board: one line per task with its findings.

    With PLAN, done tasks whose spec has changed since they ran (with these --var values), or
    that are behind a task they need, are marked stale (a PLAN that does not load: the store's
    board all the same, with a warning naming the problem).
    Without it, the store comes from --store, ORCH_STORE, or the one .orch/*.db found here.
    A run whose orchestrator died is closed and its task marked interrupted. --watch follows
    a run from another terminal: the board is redrawn as it changes until no run is going.

    \b
    Example:
      orch status plans/demo.yaml
      orch status plans/demo.yaml --format todowrite
    """
    from orchestrator.api import Runbook

    runbook = Runbook(plan_file, store_opt, var_args)
    if watch:
        _watch(runbook, as_json, todowrite=fmt == "todowrite")
    else:
        show(runbook.status(warn), as_json, todowrite=fmt == "todowrite")


def _watch(runbook: Runbook, as_json: bool, todowrite: bool) -> None:
    """Redraw the board whenever it changes (in place on a terminal, one after another in a
    pipe) until no run is going; Ctrl-C stops watching (exit 0)."""
    import time

    from orchestrator.core.terminal import use_color

    tty, shown = sys.stdout.isatty(), None
    try:
        while not runbook.store_path.exists():  # started before the run made the store
            if shown is None:
                say(f"waiting for a run to create {runbook.store_path} ...", err=True)
                shown = ""
            time.sleep(0.5)
        while True:
            snap = runbook.status(warn)
            text = board_text(snap, as_json, todowrite, use_color(sys.stdout))
            if text != shown:
                click.echo(("\x1b[H\x1b[2J" if tty else "") + text, nl=True)
                shown = text
            if not snap.going:
                return
            time.sleep(1.0)
    except KeyboardInterrupt:
        return


# --- validate / plan -------------------------------------------------------------------------


@cli.command()
@plan_argument
@vars_options
@json_option
def validate(plan_file: Path, var_args: tuple[str, ...], as_json: bool) -> None:
    """Check PLAN completely without touching the host; list every problem with its line.

    \b
    Example:
      orch validate plans/sglang_migration.yaml
      orch validate plans/demo.yaml --var size_mb=64
    """
    from orchestrator.api import Runbook

    # A bad plan: OrchGroup prints it (as JSON with --json).
    plan = Runbook(plan_file, None, var_args).load()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": True,
                    "problems": [],
                    "plan": plan.name,
                    "tasks": [
                        {"id": t.id, "kind": t.spec.kind, "needs": t.spec.needs} for t in plan.tasks
                    ],
                    "guards": [
                        {"id": g.id, "kind": g.spec.kind, "role": g.role, "protects": g.protects}
                        for g in plan.guards
                    ],
                },
                indent=2,
            )
        )
    else:
        kinds = sorted({t.spec.kind for t in [*plan.tasks, *plan.guards]})
        from orchestrator.core.terminal import plural

        guards = f" (+ {len(plan.guards)} on_failure/finally)" if plan.guards else ""
        say(
            f"{plan_file}: ok, plan {plan.name!r} with {plural(len(plan.tasks), 'task')}{guards} "
            f"({', '.join(kinds)})"
        )


@cli.command("plan")
@plan_argument
@store_option
@click.option("--rerun", multiple=True, metavar="ID", help="As for `orch run`.")
@click.option("--from", "from_task", metavar="ID", help="As for `orch run`.")
@click.option("--only", multiple=True, metavar="ID", help="As for `orch run`.")
@vars_options
@json_option
def plan_cmd(
    plan_file: Path,
    store_opt: str | None,
    rerun: tuple[str, ...],
    from_task: str | None,
    only: tuple[str, ...],
    var_args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Dry run: what `orch run` would run, skip, or find stale, and why. Changes nothing.

    \b
    Example:
      orch plan plans/demo.yaml --rerun write_data
    """
    from orchestrator.api import Runbook, RunRequest

    runbook = Runbook(plan_file, store_opt, var_args)
    steps = runbook.dry_run(RunRequest(rerun, from_task, only))
    if as_json:
        doc = {"plan": runbook.load().name, "store": str(runbook.store_path), "steps": steps}
        click.echo(json.dumps(doc, indent=2))
        return
    # Reasons quote findings and what a check saw: _say escapes them.
    id_w = max(len(s["id"]) for s in steps)
    for s in steps:
        added = f"(added by {s['origin']}) " if s["origin"] != "plan" else ""
        line = f"  {s['action']:<8} {s['id']:<{id_w}}  {added}{s['reason']}"
        say(line, one_line=True)
        for change in s["changed"]:
            say(f"  {'':<8} {'':<{id_w}}    changed: {change}", one_line=True)


# --- logs / history --------------------------------------------------------------------------


@cli.command()
@click.argument("words", metavar="[PLAN] ID", nargs=-1, required=True)
@click.option("--plan", "plan_opt", type=PATH, hidden=True)  # before 0.3
@store_option
@click.option("--run", "run_id", type=int, help="The log of that run (default: the latest).")
@click.option("--lines", "-n", type=int, help="Only the last N lines.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing while the task runs.")
@click.option("--path", "path_only", is_flag=True, help="Print the log file's path only.")
@click.option(
    "--raw",
    is_flag=True,
    help="The log's bytes as written (control and format characters not escaped); with "
    "--path, the path exactly.",
)
def logs(
    words: tuple[str, ...],
    plan_opt: Path | None,
    store_opt: str | None,
    run_id: int | None,
    lines: int | None,
    follow: bool,
    path_only: bool,
    raw: bool,
) -> None:
    """Print the output a task's processes wrote (its latest attempt, or of --run N).

    PLAN (to find its store) as for `orch status`.

    \b
    Example:
      orch logs plans/demo.yaml measure
      orch logs plans/demo.yaml checksum -n 5
    """
    if len(words) > 2:
        raise UsageError(f"orch logs takes [PLAN] ID, not {' '.join(words)!r}")
    if len(words) == 1 and plan_opt is None and _plan_not_id(words[0]):
        raise UsageError(_id_missing(Path(words[0]), store_opt))
    plan_file = Path(words[0]) if len(words) == 2 else plan_opt
    task_id = words[-1]
    import time

    from orchestrator.core.status import Status
    from orchestrator.core.terminal import clean
    from orchestrator.proc.procfs import tail
    from orchestrator.store.db import runs_dir

    path = _store_path(store_opt, plan_file)
    store = _open_store(path)
    try:
        row = _task_row(store, path, task_id)
        if run_id and not any(r["id"] == run_id for r in store.runs(limit=1_000_000)):
            raise UsageError(f"{path} has no run #{run_id}")
        log = (
            (runs_dir(path) / str(run_id) / f"{task_id}.log")
            if run_id
            else (Path(row["log_path"]) if row["log_path"] else None)
        )
        if log is None or not log.exists():
            say(
                f"no output recorded for {task_id}" + (f" in run {run_id}" if run_id else ""),
                err=True,
            )
            sys.exit(1)
        if path_only:  # escaped like any text shown; --raw for a program that opens it
            if raw:
                click.echo(str(log))
            else:
                say(str(log))
            return
        # A process's control and format characters shown escaped, on a terminal and in a
        # pipe (a pipe often ends on one, through `less -R` or a paste); --raw for the bytes.
        import codecs

        text = codecs.getincrementaldecoder("utf-8")("replace")  # a character cut by a read

        def emit(chunk: bytes) -> None:
            if raw:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            else:
                click.echo(clean(text.decode(chunk)), nl=False)

        with log.open("rb") as f:
            if lines:  # only the end of the file is read: logs of a long load can be large
                emit(("\n".join(tail(log, lines)) + "\n").encode())
                f.seek(0, os.SEEK_END)
            while chunk := f.read(1 << 16):
                emit(chunk)
            while follow:
                if chunk := f.read(1 << 16):
                    emit(chunk)
                    continue
                now = store.todo(task_id)
                if (
                    now is None
                    or now["status"] != Status.IN_PROGRESS
                    or now["log_path"] != str(log)
                ):
                    break
                time.sleep(0.25)
    finally:
        store.close()


def _plan_not_id(word: str) -> bool:
    """An existing file whose name no task ID can have (IDs have no `.` or `/`)."""
    return ("." in word or "/" in word) and Path(word).is_file()


def _id_missing(plan_file: Path, store_opt: str | None) -> str:
    """`orch logs PLAN` alone: the ID is missing, with an example (a task of its store)."""
    example = "ID"
    try:
        store = _open_store(_store_path(store_opt, plan_file))
        try:
            example = next((r["id"] for r in store.todos()), example)
        finally:
            store.close()
    except OrchError:
        pass
    return (
        f"orch logs takes [PLAN] ID: the task ID is missing after the plan {plan_file} "
        f"(e.g. `orch logs {plan_file} {example}`)"
    )


@cli.command()
@click.argument("plan_file", metavar="[PLAN]", required=False, type=PATH)
@click.option("--plan", "plan_opt", type=PATH, hidden=True)  # before 0.3
@store_option
@click.option("--task", "task_id", metavar="ID", help="The status transitions of one task.")
@click.option("--transitions", is_flag=True, help="Every status transition, oldest first.")
@click.option("--limit", default=20, show_default=True, help="How many rows.")
@json_option
def history(
    plan_file: Path | None,
    plan_opt: Path | None,
    store_opt: str | None,
    task_id: str | None,
    transitions: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List past runs, or the status transitions of the plan or of one task.

    PLAN (to find its store) as for `orch status`.

    \b
    Example:
      orch history plans/demo.yaml
      orch history plans/demo.yaml --task checksum
    """
    plan_file = plan_file or plan_opt
    from orchestrator.views.board import iso

    path = _store_path(store_opt, plan_file)
    store = _open_store(path)
    try:
        if task_id or transitions:
            if task_id:  # a removed task's row stays, hidden: its history shows
                _task_row(store, path, task_id)
            rows: list[dict[str, Any]] = [dict(r) for r in store.transitions(task_id, limit)]
            for r in rows:
                r["at"] = iso(r["at"])
            if as_json:
                click.echo(json.dumps({"transitions": rows}, indent=2))
            for r in [] if as_json else rows:  # a store's text, whatever wrote it
                say(
                    f"{r['at']}  run #{r['run_id'] or '-':<3} {r['task_id']:<20} "
                    f"{r['from_status'] or '-':>11} -> {r['to_status']:<11} {r['reason'] or ''}",
                    one_line=True,
                )
            return
        runs: list[dict[str, Any]] = [dict(r) for r in store.runs(limit)]
    finally:
        store.close()
    for r in runs:
        r["started_at"], r["ended_at"] = iso(r["started_at"]), iso(r["ended_at"])
    if as_json:
        click.echo(json.dumps({"runs": runs}, indent=2))
        return
    for r in runs:
        say(
            f"#{r['id']:<4} {r['started_at']}  {r['outcome'] or 'running':<11} "
            f"pid {r['pid']}@{r['host']}  {r['argv']}",
            one_line=True,
        )


# --- forget / reset --------------------------------------------------------------------------


@cli.command()
@plan_argument
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True)
@store_option
def forget(plan_file: Path, task_ids: tuple[str, ...], store_opt: str | None) -> None:
    """Forget what the store knows of tasks: they are pending again and the next run runs
    them (their past attempts stay in `orch history`). Refused while a run holds the store.

    \b
    Example:
      orch forget plans/demo.yaml checksum
    """
    from orchestrator.api import Runbook

    runbook = Runbook(plan_file, store_opt)
    _forgotten(runbook, runbook.forget(task_ids, "forgotten by orch forget"))


@cli.command()
@plan_argument
@store_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def reset(plan_file: Path, store_opt: str | None, yes: bool) -> None:
    """Forget every task of PLAN: the next run starts over. Asks first (unless --yes).

    \b
    Example:
      orch reset plans/demo.yaml --yes
    """
    from orchestrator.api import Runbook

    runbook = Runbook(plan_file, store_opt)
    path = runbook.store_path
    if not path.exists() and not path.is_symlink():  # a fresh clone: already a fresh start
        say(f"no store at {path} yet: nothing to reset")
        return
    ask = (lambda q: _confirm(q, "--yes", "to reset without asking")) if not yes else None
    _forgotten(runbook, runbook.reset(ask) if ask else runbook.reset())


def _forgotten(runbook: Runbook, done: list[str]) -> None:
    from orchestrator.core.terminal import plural

    where = runbook.store_path
    say(f"{plural(len(done), 'task')} forgotten in {where}: {', '.join(done) or '-'}")


def _confirm(question: str, flag: str, what: str) -> bool:
    """Ask `question [y/N]`. A question that cannot be asked (stdin at its end: </dev/null, a
    script) is a usage error that names `flag`; Ctrl-C at the prompt stays an interrupt."""
    from orchestrator.core.terminal import clean  # the question names a path

    while True:
        click.echo(clean(f"{question} [y/N]: "), nl=False)
        line = _answer_line()
        if line is None:
            click.echo(err=False)  # end the prompt's line
            raise UsageError(
                f"no answer to {question!r} (stdin is not a terminal, or at its end): "
                f"pass {flag} {what}; nothing was changed"
            )
        answer = line.strip().lower()
        if answer in ("y", "yes", "n", "no", ""):
            return answer in ("y", "yes")
        click.echo("Error: invalid input", err=True)


def _answer_line() -> str | None:
    """A line from stdin (None at its end), read a byte at a time past Python's buffer (the
    next prompt's answer stays in the pipe). Waits in select() with a timeout rather than in a
    blocking read: a SIGINT that lands between Python's signal check and read(2) would
    otherwise wait for the next input before Ctrl-C took effect."""
    import select

    fd, got = sys.stdin.fileno(), bytearray()
    while True:
        while not select.select([fd], [], [], 0.2)[0]:
            pass  # back in Python each time: a pending Ctrl-C is raised here
        byte = os.read(fd, 1)
        if not byte:
            return got.decode(errors="replace") or None
        if byte == b"\n":
            return got.decode(errors="replace")
        got += byte


# --- report ----------------------------------------------------------------------------------


@cli.command()
@click.argument("plan_file", metavar="[PLAN]", required=False, type=PATH)
@store_option
@click.option(
    "--run",
    "run_id",
    type=int,
    help="That run: its timeline, and each task as it left it (default: the latest).",
)
@click.option(
    "--output",
    "-o",
    "out_dir",
    type=PATH,
    help="Folder for report.html and its PNGs (default: <store>.report/ beside it).",
)
@click.option(
    "--fleet",
    "fleet_view",
    is_flag=True,
    help="The fleet view of PLAN's latest roll: a host-by-step timeline and the findings "
    "compared across hosts, with the outliers (into <plan>.fleet.report/; --run N: roll N).",
)
@json_option
def report(
    plan_file: Path | None,
    store_opt: str | None,
    run_id: int | None,
    out_dir: Path | None,
    fleet_view: bool,
    as_json: bool,
) -> None:
    """Write an HTML report: the run's timeline, the board, and each kind's figures.

    One self-contained page (opens offline; figures inlined) and every figure as a PNG beside
    it: for benchmarks, throughput and per-request speed against achieved concurrency with
    their intervals, TTFT/TPOT percentiles and acceptance; for analyze.compare, baseline and
    candidates on the same charts and the analysis.

    \b
    Example:
      orch report plans/demo.yaml
      orch report plans/demo.yaml -o demo-report --json
    """
    from orchestrator.views.report import kind_sections, write_report
    from orchestrator.views.sectionfaults import SectionFailure

    path = _store_path(store_opt, plan_file)
    failed: list[SectionFailure] = []
    if fleet_view:
        if plan_file is None:
            raise UsageError("--fleet needs the PLAN whose roll to show")
        from orchestrator.fleet.record import record_path
        from orchestrator.fleet.report import write_fleet_report

        folder = out_dir or record_path(path).with_suffix(".report")
        doc = _fleet_doc(plan_file, run_id)
        page, figures = _writing(folder, lambda: write_fleet_report(doc, folder), out_dir is None)
    else:
        from orchestrator.api import Runbook

        # A kind's report runs the plugin's code: an error it raises may quote a secret.
        Runbook(plan_file, store_opt).mask_secrets()
        store = _open_store(path)
        folder = out_dir or path.with_suffix(".report")
        try:
            page, figures = _writing(
                folder,
                lambda: write_report(store, folder, kind_sections, run_id, failed.append),
                out_dir is None,
            )
        finally:
            store.close()
    if as_json:
        doc = {"report": str(page), "figures": [str(f) for f in figures]}
        if failed:
            doc["failed"] = [{"task": f.task_id, "kind": f.kind, "error": f.error} for f in failed]
        click.echo(json.dumps(doc))
    else:
        from orchestrator.core.terminal import plural

        say(f"{page} ({plural(len(figures), 'figure')} beside it)")
    if failed:  # the page is written; its failed sections say why, as stderr does
        from orchestrator.core.errors import EXIT_FAILED
        from orchestrator.core.terminal import clean

        for failure in failed:
            click.echo(f"orch: {clean(str(failure), multiline=False)}", err=True)
        sys.exit(EXIT_FAILED)


# --- todo / events / mcp --------------------------------------------------------------------


@cli.group()
def todo() -> None:
    """Tasks added to a plan's store, beside the plan file's own.

    An added task with a kind runs like a declared one (validated the same way, at the next
    `orch run`); one with no kind is a todo that nothing runs: set its status by hand. Both
    show on the board marked `+` and survive re-runs and plan edits until removed.

    \b
    Example:
      orch todo add plans/demo.yaml check_disk --kind shell --param command='df -h .'
      orch todo add plans/demo.yaml ask_vendor --title "Ask the vendor about ECC errors"
      orch todo set plans/demo.yaml ask_vendor completed --note "replaced DIMM 3"
    """


@todo.command("add")
@plan_argument
@click.argument("task_id", metavar="ID")
@store_option
@click.option("--title", help="What the board shows (default: the id).")
@click.option("--kind", help="The task kind (see docs/kinds.md); none: a todo kept by hand.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A param (YAML).")
@click.option("--needs", multiple=True, metavar="ID", help="A task it needs. Repeatable.")
@click.option("--priority", type=click.Choice(["high", "medium", "low"]), default="medium")
@click.option(
    "--yaml", "extra", metavar="MAPPING", help="Other fields as YAML: '{timeout: 10m, when: ...}'."
)
@vars_options
def todo_add(
    plan_file: Path,
    task_id: str,
    store_opt: str | None,
    title: str | None,
    kind: str | None,
    params: tuple[str, ...],
    needs: tuple[str, ...],
    priority: str,
    extra: str | None,
    var_args: tuple[str, ...],
) -> None:
    """Add task ID to PLAN's store."""
    from orchestrator.api import Runbook
    from orchestrator.plan.model import parse_var

    definition: dict[str, Any] = {"id": task_id, "priority": priority}
    if extra:
        import yaml

        more = yaml.safe_load(extra)
        if not isinstance(more, dict):
            raise UsageError("--yaml: write a mapping of task fields")
        definition.update(more)
    if title:
        definition["title"] = title
    if kind:
        definition["kind"] = kind
    if needs:
        definition["needs"] = list(needs)
    if params:
        try:
            definition["params"] = dict(parse_var(p) for p in params)
        except ValueError as exc:
            raise UsageError(f"--param: {exc}") from None
    Runbook(plan_file, store_opt, var_args).add_task(definition, "person")
    what = (
        f"a {definition['kind']} task: `orch run` runs it"
        if "kind" in definition  # --kind sets it; --yaml may
        else "a todo: set its status with `orch todo set`"
    )
    say(f"added {task_id} ({what})")


@todo.command("set")
@plan_argument
@click.argument("task_id", metavar="ID")
@click.argument("status_word", metavar="STATUS")
@store_option
@click.option("--note", help="Why (shown as the reason).")
def todo_set(
    plan_file: Path, task_id: str, status_word: str, store_opt: str | None, note: str | None
) -> None:
    """Set the status of todo ID (one with no kind) to any status of the board: pending,
    in_progress, completed, skipped (or cancelled), failed, blocked, interrupted, waiting."""
    from orchestrator.api import Runbook
    from orchestrator.run.todos import status_of

    Runbook(plan_file, store_opt).set_todo(task_id, status_of(status_word), note, "person")
    say(f"{task_id}: {status_word}")


@todo.command("rm")
@plan_argument
@click.argument("task_id", metavar="ID")
@store_option
def todo_rm(plan_file: Path, task_id: str, store_opt: str | None) -> None:
    """Remove added task ID from the board (its history stays in the store)."""
    from orchestrator.api import Runbook

    Runbook(plan_file, store_opt).remove_task(task_id, "person")
    say(f"removed {task_id}")


@todo.command("note")
@plan_argument
@click.argument("task_id", metavar="ID")
@click.argument("text", required=False)
@store_option
@click.option("--finding", metavar="KEY=VALUE", help="Record a finding (value read as YAML).")
@click.option("--unit", help="The finding's unit.")
def todo_note(
    plan_file: Path,
    task_id: str,
    text: str | None,
    store_opt: str | None,
    finding: str | None,
    unit: str | None,
) -> None:
    """Record a note (TEXT) or a finding on any task, as a person.

    \b
    Example:
      orch todo note plans/demo.yaml checksum "the disk was nearly full"
      orch todo note plans/demo.yaml checksum --finding disk_free=3.2 --unit GiB
    """
    from orchestrator.api import Runbook
    from orchestrator.plan.model import parse_var

    key = value = None
    if finding is not None:
        try:
            key, value = parse_var(finding)
        except ValueError as exc:
            raise UsageError(f"--finding: {exc}") from None
    Runbook(plan_file, store_opt).record(task_id, "person", text, key, value, unit)
    say(f"noted on {task_id}")


@cli.command()
@click.argument("plan_file", metavar="[PLAN]", required=False, type=PATH)
@store_option
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they happen.")
@click.option(
    "--lines", "-n", type=int, default=None, help="Only the last N events so far (default: all)."
)
@json_option
def events(
    plan_file: Path | None, store_opt: str | None, follow: bool, lines: int | None, as_json: bool
) -> None:
    """Every status transition, finding and run of the store, oldest first; with --follow,
    each new one as it happens, from whichever process records it (Ctrl-C stops). With
    `--follow --json -n 0`: the feed of what happens from now on, one JSON object a line.

    \b
    Example:
      orch events plans/demo.yaml -n 20
      orch events plans/demo.yaml --json -n 3
    """
    from orchestrator.views.events import follow as feed
    from orchestrator.views.events import format_event

    path = _store_path(store_opt, plan_file)
    try:
        for e in feed(path, lines, follow):
            if as_json:
                click.echo(json.dumps(e))
            else:
                say(format_event(e), one_line=True)
    except KeyboardInterrupt:
        return


@cli.command()
@click.argument("plan_file", metavar="[PLAN]", required=False, type=PATH)
@store_option
@vars_options
def mcp(plan_file: Path | None, store_opt: str | None, var_args: tuple[str, ...]) -> None:
    """Serve PLAN's store to an agent: a Model Context Protocol server on stdin/stdout.

    Tools: the board, one task, run, todowrite, add/set/remove a task, record a finding or
    note, validate a plan text; resources: the board, each task's log and report. See
    docs/agent.md for the tools and a session.

    \b
    Example: an MCP host's configuration starts it
      {"command": "orch", "args": ["mcp", "plans/demo.yaml"]}
    """
    from orchestrator.agent.server import serve
    from orchestrator.api import Runbook

    runbook = Runbook(plan_file, store_opt, var_args)
    if plan_file is not None:
        runbook.load()  # a bad plan is the command's error, before the protocol starts
    serve(runbook)


# --- fleet -----------------------------------------------------------------------------------


@cli.group()
def fleet() -> None:
    """One plan rolled over an Ansible inventory's hosts, with one board.

    Each host runs the plan with its own orch and its own store there, reached through Ansible
    over SSH; the controller records which host is at which step of which roll
    (.orch/<plan>.fleet.db beside the plan). docs/fleet.md.

    \b
    Example:
      orch fleet run plans/sglang_migration.yaml -i hosts.yml --serial 25%
      orch fleet approve plans/sglang_migration.yaml
      orch fleet status plans/sglang_migration.yaml
    """


inventory_option = click.option(
    "--inventory",
    "-i",
    required=True,
    type=PATH,
    help="An Ansible inventory (YAML, INI, a folder or a script); host vars named like the "
    "plan's vars become its vars on that host.",
)


def batch_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options a roll's batches take, forward (`fleet run`) or back (`fleet rollback`):
    the command receives them as one mapping, `batches` (RollOptions' fields of those names)."""
    names = ("serial", "canary", "max_fail", "limit", "unreachable")

    @functools.wraps(command)
    def merged(*args: Any, **kwargs: Any) -> Any:
        batches = {name: kwargs.pop(name) for name in names}
        return command(*args, batches=batches, **kwargs)

    wrapped = merged
    for option in reversed(
        [
            click.option(
                "--serial",
                metavar="N|N%",
                help="Hosts a batch after the canary: a number or a share of the hosts "
                "[default: 1; a resumed roll keeps its own].",
            ),
            click.option(
                "--canary",
                type=click.IntRange(min=0),
                help="Hosts in the first batch; the roll then waits for `orch fleet approve` "
                "(0: neither) [default: 1; a resumed roll keeps its own].",
            ),
            click.option(
                "--max-fail",
                metavar="N|N%",
                help="Failed hosts a batch may have and the roll go on, as Ansible's "
                "max_fail_percentage counts (over it: the roll stops after the batch) "
                "[default: 0; a resumed roll keeps its own].",
            ),
            click.option(
                "--limit", "-l", metavar="PATTERN", help="Only these hosts (Ansible's --limit)."
            ),
            click.option(
                "--unreachable",
                type=click.Choice(["stop", "skip"]),
                default="stop",
                show_default=True,
                help="A host Ansible cannot reach stops the roll, or is skipped (tried again "
                "next run).",
            ),
        ]
    ):
        wrapped = option(wrapped)
    return wrapped


@fleet.command("run")
@plan_argument
@inventory_option
@batch_options
@click.option(
    "--approve", multiple=True, metavar="ID", help="Pass the plan's own gate ID on every host."
)
@click.option(
    "--install",
    is_flag=True,
    help="Put this orch on a host that has none or another build (its venv `orch_venv`, "
    "from wheels built here and copied), then run there; without it such a host is refused.",
)
@click.option("--new-roll", is_flag=True, help="Abandon the open roll and begin a new one.")
@vars_options
@json_option
def fleet_run(
    plan_file: Path,
    inventory: Path,
    batches: dict[str, Any],
    approve: tuple[str, ...],
    install: bool,
    new_roll: bool,
    var_args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Roll PLAN over the inventory's hosts: a canary, an approval, then batches.

    A host that fails (its compensations run there), refuses (its orch is not this build) or
    cannot be reached (unless --unreachable skip) stops the roll after its batch, unless
    --max-fail lets that batch lose it. Running
    again resumes the open roll: completed hosts are left alone, the others resume from their
    own stores. Exit status: 0 every host completed, 1 a host failed or was not reached,
    2 bad plan, inventory or usage, 3 another fleet run holds the record, 4 waiting for
    `orch fleet approve` (or a plan's gate on a host), 130 interrupted.

    The plan's folder goes with it (its `files:`, or the folder but .orch), each file once:
    a host that holds it is sent its digest. `orch fleet rollback` puts a roll's hosts back.

    \b
    Example:
      orch fleet run plans/sglang_migration.yaml -i hosts.yml --serial 25% --max-fail 10%
      orch fleet approve plans/sglang_migration.yaml
      orch fleet rollback plans/sglang_migration.yaml -i hosts.yml
    """
    from orchestrator.fleet.roll import RollOptions

    options = RollOptions(inventory, **batches, approve=approve, new_roll=new_roll, install=install)
    _roll(plan_file, var_args, options, as_json)


@fleet.command("rollback")
@plan_argument
@inventory_option
@batch_options
@click.option("--new-roll", is_flag=True, help="Abandon the open rollback and begin it again.")
@vars_options
@json_option
def fleet_rollback(
    plan_file: Path,
    inventory: Path,
    batches: dict[str, Any],
    new_roll: bool,
    var_args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Put back the hosts of the open roll (or the latest): each runs its armed compensations.

    The hosts that ran the plan (completed, failed, waiting, or running when the controller
    died) go in reverse batch order, the last batch first, as a roll goes: a canary, an
    approval (`orch fleet approve`), then batches, --max-fail per batch; the rollback is a
    roll of its own in the record (the roll it undoes is closed), shown by `orch fleet
    status`, resumed by running this again. --serial, --canary and --max-fail default to
    those of the roll it undoes. Exit status as `orch fleet run`.

    \b
    Example:
      orch fleet rollback plans/sglang_migration.yaml -i hosts.yml --canary 1 --serial 25%
    """
    from orchestrator.fleet.roll import RollOptions

    options = RollOptions(inventory, **batches, new_roll=new_roll, rollback=True)
    _roll(plan_file, var_args, options, as_json)


def _roll(plan_file: Path, var_args: tuple[str, ...], options: Any, as_json: bool) -> NoReturn:
    from orchestrator.fleet.roll import Roller

    tell = functools.partial(say, err=as_json)  # hosts' names and answers: shown cleaned
    summary = Roller(plan_file, var_args, options, tell).run()
    if as_json:
        click.echo(json.dumps({**_fleet_doc(plan_file), "exit_code": summary.exit_code}, indent=2))
    else:
        tell(summary.message)
    sys.exit(summary.exit_code)


@fleet.command("approve")
@plan_argument
@click.option("--note", "-m", help="Why, or on what condition: kept with the approval.")
@json_option
def fleet_approve(plan_file: Path, note: str | None, as_json: bool) -> None:
    """Let the roll waiting after its canary go on; recorded with who, when and the note.

    \b
    Example:
      orch fleet approve plans/sglang_migration.yaml -m "canary tok/s as expected"
    """
    from orchestrator.fleet.roll import approve_roll

    roll = approve_roll(_store_path(None, plan_file), note)
    if as_json:
        click.echo(json.dumps({"roll": roll.id, "approved_by": roll.approved_by, "note": note}))
    else:
        say(f"roll #{roll.id} approved by {roll.approved_by}: run `{roll.command}` again")


@fleet.command("status")
@plan_argument
@click.option("--roll", "roll_id", type=int, help="That roll (default: the latest).")
@json_option
def fleet_status(plan_file: Path, roll_id: int | None, as_json: bool) -> None:
    """The fleet board: each host's state in the roll, its tasks, and why it stopped or what
    it found (from the controller's record: no host is contacted). While a batch runs, each
    running host's progress as its store said at the last poll (every 10 s): "1/3 done, at
    bench". A rollback is headed "rollback #2 of roll #1".

    \b
    Example:
      orch fleet status plans/sglang_migration.yaml
      orch fleet status plans/sglang_migration.yaml --roll 1 --json
    """
    doc = _fleet_doc(plan_file, roll_id)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    from orchestrator.core.terminal import use_color
    from orchestrator.fleet.board import render_fleet

    click.echo(render_fleet(doc, color=use_color(sys.stdout)))


def _fleet_doc(plan_file: Path, roll_id: int | None = None) -> dict[str, Any]:
    from orchestrator.fleet.board import fleet_status
    from orchestrator.fleet.record import FleetRecord, record_path

    path = record_path(_store_path(None, plan_file))
    record = FleetRecord.open(path)
    try:
        rolls = record.rolls()
        if not rolls:
            raise UsageError(f"{path} has no roll yet: run `orch fleet run` first")
        roll = rolls[0] if roll_id is None else record.roll(roll_id)
        return fleet_status(record, roll)
    finally:
        record.close()


# --- shared ----------------------------------------------------------------------------------


def _writing(
    folder: Path, write: Callable[[], tuple[Path, list[Path]]], own: bool
) -> tuple[Path, list[Path]]:
    """`own`: orch's <store>.report, checked as its other folders (core/safeopen.py); a folder
    the user named with -o is the user's: only the files orch writes in it are."""
    from orchestrator.core.safeopen import ensure_private_dir

    try:
        if own:
            ensure_private_dir(folder)
        return write()
    except OSError as exc:  # under /proc, on a file, read-only: the folder's fault, said so
        why = exc.strerror or str(exc)
        raise UsageError(f"cannot write the report into {folder}: {why}; give -o DIR") from None


def _store_path(store_opt: str | None, plan_file: Path | None) -> Path:
    """Where PLAN's store is (the plan file read for its name only: no kinds imported)."""
    from orchestrator.api import Runbook

    return Runbook(plan_file, store_opt).store_path


def _task_row(store: Store, path: Path, task_id: str) -> TodoRow:
    """The store's row of `task_id`; a usage error with a did-you-mean if it has none."""
    row = store.todo(task_id)
    if row is None:
        from orchestrator.core.errors import did_you_mean

        known = [r["id"] for r in store.todos()]
        raise UsageError(f"no task {task_id!r} in {path}{did_you_mean(task_id, known)}")
    return row


def _open_store(path: Path) -> Store:
    from orchestrator.store.db import Store

    return Store.open(path, create=False)


def run_cli() -> int:
    """The full command line (click); the shortcut (shortcut.py) comes first. The code to
    exit with."""
    try:
        # Without standalone mode click returns the code of ctx.exit() instead of exiting.
        code = cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = EXIT_USAGE
    except click.exceptions.Abort:
        code = EXIT_INTERRUPTED
    return code if isinstance(code, int) else EXIT_OK
