"""orch's entry point, and the answers that need no command-line parser.

A finished plan is asked about most (a cron job's `orch run PLAN`, a glance with `orch status
PLAN`), and answered from the store in a hash and one query; click and the command line built
on it (cli.py) would be ~30 ms of the ~50 ms such an answer takes. So `orch status PLAN` and
`orch run PLAN [-q]`, with at most `--store PATH`, are read here first and, when the Runbook's
fast path answers, printed here through the same views as cli.py's. Anything else (another
option, a plan not finished, a store that must be opened the long way, an error) goes to
cli.py, which parses and runs it afresh: the shortcut prints nothing before it knows it
answers. tests/test_shortcut.py holds its reading of argv to click's.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

from orchestrator.core.errors import EXIT_INTERRUPTED, EXIT_OK, OrchError


class Plain(NamedTuple):
    """`orch COMMAND PLAN`, as click would read it, with nothing but these."""

    command: str  # "run" or "status"
    plan_file: Path
    store_opt: str | None
    quiet: bool


_FLAGS = {"run": {"-q", "--quiet"}, "status": set()}


def read_plain(argv: Sequence[str], environ: dict[str, str] | os._Environ[str]) -> Plain | None:
    """`argv` (without the program) as a Plain, or None where click's reading is needed.
    Strict: one positional, `--store VALUE` or `--store=VALUE` once, run's quiet flag; a value
    or a plan that starts with `-`, `--`, a repeated option: all left to click."""
    if not argv or argv[0] not in _FLAGS:
        return None
    command, rest = argv[0], list(argv[1:])
    plan: str | None = None
    store: str | None = None
    quiet = False
    while rest:
        word = rest.pop(0)
        if word == "--store" or word.startswith("--store="):
            value = word[len("--store=") :] if "=" in word else (rest.pop(0) if rest else "")
            if store is not None or not value or value.startswith("-"):
                return None
            store = value
        elif word in _FLAGS[command] and not quiet:
            quiet = True
        elif word.startswith("-") or not word or plan is not None:
            return None
        else:
            plan = word
    if plan is None:
        return None
    # click reads an empty ORCH_STORE as unset
    return Plain(command, Path(plan), store or environ.get("ORCH_STORE") or None, quiet)


def answer(plain: Plain) -> int | None:
    """The exit code, once the answer is printed; None, with nothing printed, where the
    finished plan's fast path does not answer."""
    from orchestrator.api import Runbook
    from orchestrator.views.out import NOTHING_TO_DO, show, warn

    runbook = Runbook(plain.plan_file, plain.store_opt, ())
    said: list[str] = []  # the warnings, in order, printed only with the answer
    try:
        if plain.command == "status":
            if (snap := runbook.cached_status(said.append)) is None:
                return None
        else:
            if not runbook.finished():
                return None
            from orchestrator.views.snapshot import take

            if not plain.quiet:
                said.append(NOTHING_TO_DO)
            snap = take(runbook.store_path, None, None, said.append)
    except OrchError:
        return None  # cli.py meets it again, and says it as it says every error
    for text in said:
        warn(text)
    show(snap, as_json=False)
    return EXIT_OK


def main() -> NoReturn:
    """Console entry point."""
    from orchestrator.core.umask import private_files

    private_files()  # the store, lock and logs are the user's alone (tasks keep their umask)
    # Started with `&` from a script, a process inherits SIGINT ignored (POSIX) and Python
    # installs no handler: `kill -INT` (or Ctrl-C at a prompt) would do nothing. Every
    # command stays interruptible.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        plain = read_plain(sys.argv[1:], os.environ)
        code = answer(plain) if plain else None
        if code is None:
            from orchestrator.cli import run_cli

            code = run_cli()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # `orch status | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    finally:
        # All that is alive now lives until exit: spare the interpreter's final collection of
        # it (~100 ms after a 1000-task run, bench/bench_engine.py). Also on sys.exit().
        import gc

        gc.freeze()
    sys.exit(code)
