"""The CLI's promises: fast start, help everywhere, plugins by entry point, one-way imports."""

from __future__ import annotations

import ast
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli

from conftest import ORCH, PlanDir, run_orch, start_orch, wait_for

ROOT = Path(__file__).resolve().parent.parent
# And two a start-up does not need: OpenSSL (_hashlib) and shutil (bz2, lzma), ~2 ms each.
HEAVY = (
    *("pydantic", "sqlite_utils", "structlog", "yaml", "psutil", "rich", "pynvml"),
    *("_hashlib", "shutil"),
)


def test_engine_never_imports_the_task_library() -> None:
    """orchestrator/ must not import tasks/: knowledge flows one way."""
    offenders = []
    for path in (ROOT / "orchestrator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tasks"]
    assert offenders == []


def test_status_imports_nothing_heavy(pdir: PlanDir) -> None:
    """`orch status` on an existing store loads none of pydantic, sqlite_utils, structlog..."""
    plan = pdir.write("name: t\ntasks: [{id: a, kind: shell, params: {command: 'true'}}]\n")
    assert run_orch("run", plan).returncode == 0
    code = textwrap.dedent(f"""
        import sys
        from orchestrator.cli import cli
        try:
            cli.main(["status", "--store", {str(pdir.store_path())!r}], standalone_mode=False)
        finally:
            print("LOADED", sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"NO_COLOR": "1", "PATH": ""},
        check=True,
    ).stdout
    assert "1 task: 1 completed" in out
    assert "LOADED []" in out


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_has_help_with_an_example_and_is_in_the_readme(command: str) -> None:
    """Each command explains itself with an example, and the README documents it."""
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert f"orch {command}" in (ROOT / "README.md").read_text()


def test_unknown_command_is_usage_error() -> None:
    """A typo in the command is exit 2 with click's suggestion, no traceback."""
    r = run_orch("stauts")
    assert r.returncode == 2
    assert "No such command" in r.stderr and "Traceback" not in r.stderr


def test_entry_point_task_kind_is_found(tmp_path: Path, pdir: PlanDir) -> None:
    """A kind registered by another distribution (group orch.tasks) validates and runs."""
    site = tmp_path / "site"
    (site / "orch_hello-1.0.dist-info").mkdir(parents=True)
    (site / "orch_hello-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: orch-hello\nVersion: 1.0\n"
    )
    (site / "orch_hello-1.0.dist-info" / "entry_points.txt").write_text(
        "[orch.tasks]\nhello = orch_hello:Hello\n"
    )
    (site / "orch_hello.py").write_text(
        textwrap.dedent("""
        from orchestrator import Context, Task
        class Hello(Task):
            def run(self, ctx: Context) -> None:
                ctx.finding("said", "hello")
    """)
    )
    plan = pdir.write("name: t\ntasks: [{id: a, kind: hello}]\n")
    env = {"PYTHONPATH": str(site)}
    assert run_orch("validate", plan, env=env).returncode == 0
    r = run_orch("run", plan, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"][0]["findings"][0]["value"] == "hello"
    assert "unknown task kind 'hello'" in run_orch("validate", plan).stderr


def test_no_color_and_plain_pipes_have_no_escape_codes(pdir: PlanDir) -> None:
    """Output to a pipe, or with NO_COLOR, carries no ANSI escapes."""
    plan = pdir.write("name: t\ntasks: [{id: a, kind: shell, params: {command: 'true'}}]\n")
    r = run_orch("run", plan)
    assert "\x1b[" not in r.stdout + r.stderr


def test_rerun_of_finished_plan_imports_nothing_heavy(pdir: PlanDir) -> None:
    """`orch run` of a finished, unchanged plan needs neither pydantic nor yaml nor structlog."""
    plan = pdir.write("name: t\ntasks: [{id: a, kind: shell, params: {command: 'true'}}]\n")
    assert run_orch("run", plan).returncode == 0
    code = textwrap.dedent(f"""
        import sys
        from orchestrator.cli import cli
        try:
            cli.main(["run", {str(plan)!r}], standalone_mode=False)
        except SystemExit:
            pass
        print("LOADED", sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"NO_COLOR": "1", "PATH": ""},
        check=True,
    ).stdout
    assert "1 task: 1 completed" in out
    assert "LOADED []" in out


def test_logs_follow_until_the_task_ends_and_tail(pdir: PlanDir) -> None:
    """`orch logs -f` prints output as it comes and returns when the task ends; -n tails."""
    from conftest import start_orch, wait_for

    plan = pdir.write("""
        name: t
        tasks:
          - id: a
            kind: shell
            params: {command: "for i in 1 2 3; do echo line $i; sleep 0.4; done"}
    """)

    def running() -> bool:
        try:
            return bool(pdir.todo("a")["status"] == "in_progress")
        except (sqlite3.Error, AssertionError):  # the store is still being created
            return False

    proc = start_orch("run", plan)
    try:
        wait_for(running)
        r = run_orch("logs", plan, "a", "-f", timeout=30)
        assert r.stdout.splitlines()[-3:] == ["line 1", "line 2", "line 3"]
    finally:
        proc.communicate(timeout=30)
    assert run_orch("logs", plan, "a", "-n", "1").stdout == "line 3\n"
    assert run_orch("logs", plan, "zz").returncode == 2


def test_logs_and_history_take_the_plan_as_status_does(pdir: PlanDir, tmp_path: Path) -> None:
    """PLAN is the first argument of every command; an unknown task gets a suggestion, a run
    that does not exist is named as such, and the old `--plan` still works."""
    plan = pdir.write("name: t\ntasks: [{id: measure, kind: shell, params: {command: echo hi}}]\n")
    assert run_orch("run", plan).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert run_orch("logs", plan, "measure", cwd=elsewhere).stdout.endswith("hi\n")
    assert run_orch("logs", "measure", "--plan", plan, cwd=elsewhere).stdout.endswith("hi\n")
    assert "#1" in run_orch("history", plan, cwd=elsewhere).stdout
    typo = run_orch("logs", plan, "mesure")
    assert typo.returncode == 2 and "did you mean 'measure'?" in typo.stderr
    missing = run_orch("logs", plan, "measure", "--run", "99")
    assert missing.returncode == 2 and "has no run #99" in missing.stderr
    assert run_orch("logs", plan, "measure", "extra").returncode == 2


def test_vars_file_feeds_run_plan_and_validate_and_a_var_wins(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        vars: {{size: 1, label: x}}
        tasks:
          - id: a
            kind: shell
            params: {{command: "echo ${{vars.size}}-${{vars.label}} > {pdir.root}/out"}}
    """)
    vars_file = pdir.root / "vars.yaml"
    vars_file.write_text("size: 5\nlabel: from-file\n")
    assert run_orch("validate", plan, "--vars-file", vars_file).returncode == 0
    r = run_orch("run", plan, "--vars-file", vars_file, "--var", "label=cli")
    assert r.returncode == 0, r.stderr
    assert (pdir.root / "out").read_text() == "5-cli\n"
    vars_file.write_text("size: 6\nlabel: cli\n")  # the file is part of what `run` compares
    shown = run_orch("plan", plan, "--vars-file", vars_file, "--var", "label=cli").stdout
    assert "vars.size: 5 -> 6" in shown
    for bad, says in (("nope.yaml", "no such file"), ("list.yaml", "write a mapping")):
        if bad == "list.yaml":
            (pdir.root / bad).write_text("- 1\n")
        r = run_orch("run", plan, "--vars-file", pdir.root / bad)
        assert r.returncode == 2 and says in r.stderr, r.stderr


def help_examples() -> list[str]:
    """Every `orch ...` line under `Example:` in the help of every command."""
    found = []
    for args in (["--help"], *([name, "--help"] for name in cli.commands)):
        text = CliRunner().invoke(cli, args).output
        lines = text.split("Example:", 1)[1].splitlines() if "Example:" in text else []
        found += [line.strip() for line in lines if line.strip().startswith("orch ")]
    return found


def test_every_help_example_works_on_the_shipped_plans(tmp_path: Path) -> None:
    """Run from a folder that is not the plans' (a copy of the repository's plans/), in the
    order a newcomer would: check, dry-run, run, then look."""
    import shutil

    shutil.copytree(Path(__file__).resolve().parent.parent / "plans", tmp_path / "plans")
    # `orch fleet` examples need an inventory of reachable hosts: tests/test_fleet.py runs
    # those commands against its namespace hosts.
    examples = [e for e in help_examples() if not e.startswith("orch fleet")]
    assert len(examples) >= 10, examples
    order = (
        "orch validate",
        "orch plan",
        "orch approve",
        "orch run",
        "orch rollback",
        "orch status",
        "orch todo",
        "orch events",
        "orch logs",
        "orch history",
        "orch report",
        "orch forget",
        "orch reset",
    )
    examples.sort(key=lambda e: next(i for i, o in enumerate(order) if e.startswith(o)))
    for example in examples:
        r = run_orch(*shlex.split(example)[1:], cwd=tmp_path, timeout=120)
        assert r.returncode == 0, f"{example}: exit {r.returncode}\n{r.stderr[-2000:]}"


def test_forget_and_reset_make_tasks_run_again_and_are_recorded(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "echo a >> {pdir.root}/ran"}}}}
          - {{id: b, kind: shell, needs: [a], params: {{command: "echo b >> {pdir.root}/ran"}}}}
    """)
    ran = pdir.root / "ran"
    assert run_orch("run", plan).returncode == 0
    r = run_orch("forget", plan, "b")
    assert r.returncode == 0 and "1 task forgotten" in r.stdout, r.stderr
    assert pdir.statuses() == {"a": "completed", "b": "pending"}
    assert "b=" not in run_orch("status", plan).stdout  # a forgotten task shows no findings
    assert run_orch("run", plan).returncode == 0  # the finished-plan shortcut is not taken
    assert ran.read_text().split() == ["a", "b", "b"]
    assert pdir.transitions("b")[-3:] == [
        ("completed", "pending"),
        ("pending", "in_progress"),
        ("in_progress", "completed"),
    ]
    moves = run_orch("history", plan, "--task", "b").stdout
    assert "completed -> pending" in moves and "forgotten by orch forget" in moves
    refused = subprocess.run(
        [ORCH, "reset", str(plan)], input="n\n", capture_output=True, text=True
    )
    assert refused.returncode == 2 and set(pdir.statuses().values()) == {"completed"}
    assert run_orch("reset", plan, "--yes").returncode == 0
    assert set(pdir.statuses().values()) == {"pending"}
    typo = run_orch("forget", plan, "bb")
    assert typo.returncode == 2 and "did you mean 'b'?" in typo.stderr


def test_forget_is_refused_while_a_run_holds_the_store(pdir: PlanDir) -> None:
    plan = pdir.write(f"""
        name: t
        tasks:
          - {{id: a, kind: shell, params: {{command: "touch {pdir.root}/up; sleep 30"}}}}
    """)
    proc = start_orch("run", plan)
    try:
        wait_for((pdir.root / "up").exists, what="the task started")
        r = run_orch("forget", plan, "a")
        assert r.returncode == 3 and "in use by orch run #1" in r.stderr
        assert pdir.statuses() == {"a": "in_progress"}
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_orch_plan_checks_what_it_can_like_a_check_mode(pdir: PlanDir) -> None:
    """`orch plan` evaluates a `when` known now and every read-only precondition: a port held
    now blocks the task and its dependents; a finding still to come and the plan's own
    `command` check are left to the run, and said so. Nothing runs."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        plan = pdir.write(f"""
            name: t
            vars: {{mode: off}}
            tasks:
              - {{id: a, kind: shell, params: {{command: "echo ::finding x=1"}}}}
              - {{id: b, kind: shell, when: "${{vars.mode}} == True", params: {{command: "true"}}}}
              - id: c
                kind: shell
                preconditions: [{{kind: port.free, port: {port}}}]
                params: {{command: "touch {pdir.root}/ran"}}
              - {{id: e, kind: shell, needs: [c], params: {{command: "true"}}}}
              - id: d
                kind: shell
                needs: [a]
                when: "${{tasks.a.findings.x}} > 0"
                preconditions: [{{kind: command, command: "touch {pdir.root}/ran"}}]
                params: {{command: "true"}}
        """)
        r = run_orch("plan", plan, "--json")
    assert r.returncode == 0, r.stderr
    steps = {s["id"]: s for s in json.loads(r.stdout)["steps"]}
    assert steps["a"]["action"] == "run"
    assert steps["b"]["action"] == "skip" and "is false now" in steps["b"]["reason"]
    assert steps["c"]["action"] == "block" and f"port {port}" in steps["c"]["reason"]
    assert steps["e"]["action"] == "block"
    assert steps["d"]["action"] == "run" and "if ${tasks.a.findings.x} > 0" in steps["d"]["reason"]
    assert "checked only by the run: command" in steps["d"]["reason"]
    assert not (pdir.root / "ran").exists() and not pdir.store_path().exists()


def test_status_watch_follows_a_run_until_it_ends(pdir: PlanDir) -> None:
    """From another terminal: each change is printed (a pipe gets them one after another) and
    the watch ends by itself with the run."""
    go = pdir.root / "go"
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: shell
            params: {{command: "touch {pdir.root}/up; until [ -e {go} ]; do sleep 0.05; done"}}
          - {{id: b, kind: shell, needs: [a], params: {{command: "true"}}}}
    """)
    run = start_orch("run", plan)
    watch = None
    try:
        wait_for((pdir.root / "up").exists, what="task a started")
        watch = start_orch("status", plan, "--watch")
        time.sleep(1.5)  # the watch shows a running
        go.touch()
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        assert "▶ a" in out and out.rstrip().endswith("2 tasks: 2 completed")
        assert out.count("run #1") >= 2, out
    finally:
        run.communicate(timeout=30)
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.communicate()


def test_run_on_a_terminal_redraws_the_board_in_place(pdir: PlanDir) -> None:
    """On a terminal (a real pty) the board is drawn and redrawn in place, the log lines go
    to events.jsonl only; in a pipe the log lines are printed as before."""
    import os
    import pty
    import select

    plan = pdir.write("""
        name: t
        tasks:
          - {id: a, kind: shell, params: {command: "sleep 1"}}
          - {id: b, kind: shell, needs: [a], params: {command: "sleep 1"}}
    """)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [ORCH, "run", str(plan)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "NO_COLOR": "1", "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        assert ready, f"no output from orch run on a terminal: {seen!r}"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the pty closed, orch has exited
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=30) == 0
    text = seen.decode()
    assert "\x1b[J" in text and "F\x1b[J" in text  # a drawing was erased and redrawn
    assert "▶ a" in text and "▶ b" in text  # the board while each task ran
    assert "task.started" not in text  # log lines are not on the terminal ...
    events = (pdir.store_path().with_name("t.runs") / "1" / "events.jsonl").read_text()
    assert '"event": "task.started"' in events  # ... they are in the run's events
    assert text.rstrip().endswith("2 tasks: 2 completed")
    piped = run_orch("run", plan, "--rerun", "a")
    assert "task.started" in piped.stderr and "\x1b[" not in piped.stderr


def doc_examples() -> list[tuple[str, list[str]]]:
    """(file, argv) of every `orch ...` command in a code block of README.md and docs/ (fences
    read line by line; a `\\` continuation joined; comments and `.venv/bin/` or `$ ` prefixes
    dropped; YAML blocks skipped)."""

    root = Path(__file__).resolve().parent.parent
    found = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        fence, pending = None, ""
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                fence = None if fence is not None else line[3:].strip()
                continue
            if fence is None or fence not in ("", "sh"):
                continue
            line = pending + line
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            if line.lstrip("$ ").startswith(("orch ", ".venv/bin/orch ")):
                words = shlex.split(line.lstrip("$ "), comments=True)
                found.append((doc.name, words[1:]))
    return found


def test_the_docs_examples_work_from_another_folder(tmp_path: Path) -> None:
    """Each `orch` example of the README and docs/, from a folder that is not the plans':
    those on the demo plan run for real; a `run` of a plan that needs GPUs or servers is
    checked with `orch plan` and the same arguments (its vars exist, its values parse), and
    the rehearsal's own commands run end to end in tests/test_vllm.py."""
    import shutil

    shutil.copytree(Path(__file__).resolve().parent.parent / "plans", tmp_path / "plans")
    examples = doc_examples()
    assert len(examples) >= 6, examples
    for doc, args in sorted(examples, key=lambda e: e[1][0] != "run"):
        demo = any(a.endswith("demo.yaml") for a in args)
        if demo:
            argv = args
        elif args[0] == "run":
            argv = ["plan", *args[1:]]
        else:
            continue  # status/logs/report of the rehearsal: test_vllm's rehearsal test
        r = run_orch(*argv, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, f"{doc}: orch {' '.join(args)}: {r.stderr[-2000:]}"


@pytest.mark.parametrize("columns", [None, "77", "0", "wide"])
def test_terminal_width_is_what_shutil_says_on_a_terminal_and_off_it(columns: str | None) -> None:
    """terminal_width() (written out to spare the import) gives shutil.get_terminal_size's
    columns: $COLUMNS when it is a number, else the terminal's, else 100 (a pipe)."""
    import fcntl
    import pty
    import struct
    import termios

    code = (
        "import shutil; from orchestrator.core.terminal import terminal_width;"
        "print(terminal_width(), shutil.get_terminal_size((100, 24)).columns)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {"COLUMNS": columns} if columns is not None else {}
    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 123, 0, 0))
        for stdout, expected in ((follower, 123), (subprocess.PIPE, 100)):
            r = subprocess.run(
                [sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, env=env
            )
            assert r.returncode == 0, r.stderr
            out = r.stdout if r.stdout is not None else os.read(leader, 100)
            ours, theirs = out.decode().split()
            assert ours == theirs == (columns if columns == "77" else str(expected))
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize(
    "broken, line",
    [
        ("name: t\ntasks:\n  - id: a\n    kind: shell\n    params: {command: 'true'\n", 6),
        ("name: t\ntasks:\n  - id: a\n    kind: shel\n  - {id: b, kind: shell}\n", 4),
    ],
    ids=["yaml", "validation"],
)
def test_status_of_a_broken_plan_still_shows_the_board(
    pdir: PlanDir, tmp_path: Path, broken: str, line: int
) -> None:
    """A plan half edited mid-incident: `orch status PLAN` shows the store's board (found as
    `orch run` finds it, or by --store) and warns of the plan's problem on stderr, exit 0.
    With no store to show, the plan's error stays (exit 2)."""
    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    assert run_orch("run", plan).returncode == 0
    plan.write_text(broken)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in ((plan,), (plan, "--json"), (plan, "--store", pdir.store_path())):
        r = run_orch("status", *args, cwd=elsewhere)
        assert r.returncode == 0, r.stderr
        assert f"plan.yaml:{line}: " in r.stderr and "staleness could not be computed" in r.stderr
        assert str(pdir.store_path().relative_to(tmp_path)) in r.stderr or "--store" in args
        shown = json.loads(r.stdout)["tasks"] if "--json" in args else r.stdout
        assert "1 completed" in shown or [t["status"] for t in shown] == ["completed"], shown
    nowhere = run_orch("status", plan, "--store", tmp_path / "none.db")
    assert nowhere.returncode == 2 and f"plan.yaml:{line}: " in nowhere.stderr
    assert nowhere.stdout == ""
    pdir.store_path().unlink()
    gone = run_orch("status", plan)
    assert gone.returncode == 2 and "problem" in gone.stderr and gone.stdout == ""


def test_reset_that_cannot_ask_says_to_pass_yes_and_ctrl_c_is_an_interrupt(
    pdir: PlanDir,
) -> None:
    """`orch reset` with nothing to read an answer from (</dev/null, a script) is a usage
    error naming --yes, not a silent exit 130; Ctrl-C at the prompt still is 130."""
    import signal

    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    assert run_orch("run", plan).returncode == 0
    r = subprocess.run(
        [ORCH, "reset", str(plan)], stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "pass --yes" in r.stderr and "nothing was changed" in r.stderr, r.stderr
    assert pdir.statuses() == {"a": "completed"}
    proc = subprocess.Popen(
        [ORCH, "reset", str(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        asked = b""
        while b"[y/N]" not in asked:
            chunk = os.read(proc.stdout.fileno(), 256)
            assert chunk, asked
            asked += chunk
        proc.send_signal(signal.SIGINT)
        # stdin stays open until it has ended: closing it now (communicate() would) races
        # the interrupt with an end of input, two different answers to the same prompt.
        proc.wait(timeout=30)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert b"--yes" not in err
    assert pdir.statuses() == {"a": "completed"}


def test_reset_asks_again_after_an_answer_it_does_not_know(pdir: PlanDir) -> None:
    """`maybe` is no answer: asked again, and the next line (`y`, still in the pipe) counts."""
    plan = pdir.write("name: t\ntasks:\n  - {id: a, kind: shell, params: {command: 'true'}}\n")
    assert run_orch("run", plan).returncode == 0
    r = subprocess.run(
        [ORCH, "reset", str(plan)], input="maybe\ny\n", capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and r.stdout.count("[y/N]") == 2, r.stdout + r.stderr
    assert "Error: invalid input" in r.stderr and "1 task forgotten" in r.stdout
    assert pdir.statuses() == {"a": "pending"}


def test_history_of_an_unknown_task_is_a_usage_error_with_a_suggestion(pdir: PlanDir) -> None:
    """`orch history --task ID` for no task of the store says so (exit 2), as `orch logs`
    does; a task removed from the board keeps its history."""
    plan = pdir.write("name: t\ntasks: [{id: measure, kind: shell, params: {command: echo}}]\n")
    assert run_orch("run", plan).returncode == 0
    for extra in ((), ("--json",)):
        typo = run_orch("history", plan, "--task", "mesure", *extra)
        assert typo.returncode == 2, (typo.returncode, typo.stdout, typo.stderr)
        assert "no task 'mesure'" in typo.stderr and "did you mean 'measure'?" in typo.stderr
        # --json: the error as JSON on stdout too, for a program reading it
        assert typo.stdout == "" if not extra else json.loads(typo.stdout)["exit_code"] == 2
    assert run_orch("todo", "add", plan, "extra").returncode == 0
    assert run_orch("todo", "rm", plan, "extra").returncode == 0
    removed = run_orch("history", plan, "--task", "extra")
    assert removed.returncode == 0 and "extra" in removed.stdout, removed.stderr
    known = run_orch("history", plan, "--task", "measure")
    assert known.returncode == 0 and "-> completed" in known.stdout, known.stderr


def test_logs_of_a_plan_without_an_id_says_the_id_is_missing(pdir: PlanDir) -> None:
    """`orch logs PLAN` (the ID forgotten) is not "no task 'plan.yaml'": usage, exit 2,
    with an example naming a task of the store."""
    plan = pdir.write("name: t\ntasks: [{id: measure, kind: shell, params: {command: echo}}]\n")
    for when in ("before the first run", "after it"):
        r = run_orch("logs", "plan.yaml", cwd=pdir.root)
        assert r.returncode == 2, (when, r.returncode, r.stderr)
        assert "task ID is missing" in r.stderr and "no task" not in r.stderr, (when, r.stderr)
        example = "orch logs plan.yaml measure" if when == "after it" else "orch logs plan.yaml ID"
        assert example in r.stderr, (when, r.stderr)
        assert run_orch("run", plan).returncode == 0
    assert run_orch("logs", "measure", cwd=pdir.root).returncode == 0  # the store found here
    typo = run_orch("logs", "mesure", cwd=pdir.root)
    assert typo.returncode == 2 and "did you mean 'measure'?" in typo.stderr
