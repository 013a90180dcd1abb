"""Ansible for the fleet, through ansible-runner: a roll's one playbook, or one short play.

A roll is one `ansible-playbook` (run_roll): a gate play on the controller alone before each
batch and after the last (action_plugins/orch_gate.py holds Ansible there until orch has
judged the batch before and committed the next one `running`), and a play per batch whose one
task is orch's host command (action_plugins/orch_host.py: one shell command over Ansible's
connection, its payload on stdin, base64, so no Jinja templating can touch the plan's text).
A host's outcome is judged by orch from the host's answer, never by Ansible from an exit code;
Ansible tells apart only what it alone knows: a host it could not reach. Each host's result
reaches the controller from the event stream as it comes. Short plays of their own
(run_play, run_command) install orch, ask running hosts their progress, or send a batch's
files again.

ansible-runner writes its artifacts (every event, module arguments included) into a private
folder beside the fleet record, removed when the play ends: the controller keeps only what
`record.py` keeps.
The user's own `ansible.cfg` (ANSIBLE_CONFIG, or one in the working directory) still applies.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UsageError
from orchestrator.core.safeopen import ensure_private_dir


@dataclass(frozen=True)
class HostResult:
    host: str
    reached: bool
    rc: int | None
    stdout: str
    stderr: str
    msg: str
    failed: bool = False  # a task of the play failed there (the orch command's never does)


def ansible_tool(name: str) -> str:
    """An Ansible command from orch's own environment first (a venv need not be on PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise UsageError(f"{name} is not installed: pip install ansible-core (the README's set-up)")
    return found


def ansible_env() -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", "True"),  # one ssh a task
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
    }
    if "ANSIBLE_CONFIG" not in env and Path("ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(Path("ansible.cfg").resolve())
    return env


PLUGINS = Path(__file__).with_name("action_plugins")  # orch_host, orch_gate
HOST_TASK = "orch host"
GATE_PLAY = "orch gate "  # and its number: gate k comes before batch k, the last after all


def host_task() -> dict[str, Any]:
    """orch's host command on each host, given its argv and stdin by the play's extravars
    (`orch_argv`, `orch_stdin`: base64, so no Jinja templating can touch the plan's text)."""
    args = {"argv": "{{ orch_argv[inventory_hostname] }}",
            "stdin": "{{ orch_stdin[inventory_hostname] }}"}  # fmt: skip
    # Nothing a host does ends the playbook: Ansible ends it by itself when every host of a
    # play failed or was unreachable (`break_play`); orch judges each host, and the roll.
    return {"name": HOST_TASK, "orch_host": args, "ignore_errors": True, "ignore_unreachable": True}


def run_command(
    inventory: Path,
    hosts: Sequence[str],
    argv: Mapping[str, Sequence[str]],
    stdin: Mapping[str, str],
    on_result: Callable[[HostResult], None],
    work: Path,
    cancel: Callable[[], bool] = lambda: False,
) -> None:
    """Run `argv[host]` with `stdin[host]` on each of `hosts` at once (forks: all of them);
    `on_result` is called as each host answers, from this thread."""
    extravars = {"orch_argv": dict(argv), "orch_stdin": dict(stdin)}
    run_play(inventory, hosts, [host_task()], extravars, on_result, work, cancel)


def run_roll(
    inventory: Path,
    batches: Sequence[Sequence[str]],
    argv: Mapping[str, Sequence[str]],
    stdin: Mapping[str, str],
    on_gate: Callable[[int], bool],
    on_result: Callable[[HostResult], None],
    work: Path,
    cancel: Callable[[], bool] = lambda: False,
) -> str:
    """A roll's batches in one ansible-playbook: gate 0, batch 0, gate 1, ..., batch n-1,
    gate n. At gate k (a play on the controller alone, action_plugins/orch_gate.py) Ansible
    waits for `on_gate(k)`, called from this thread as the gate's play begins: true lets
    batch k go (it was never called for batch k otherwise), false ends the playbook there.
    `on_result` once per host of a batch, as each answers. Returns how Ansible ended when it
    ended before gate n was answered ("" when it got there)."""
    answers = tempfile.mkdtemp(prefix="gates-", dir=ensure_work(work))
    gates: list[int] = []

    def gate(number: int) -> None:
        go = False
        try:
            go = on_gate(number)
        finally:  # also when on_gate raised: the gate must not hang (the error is said after)
            gates.append(number)
            Path(answers, "next").write_text(json.dumps({"go": go}))
            os.replace(Path(answers, "next"), Path(answers, f"{number}.json"))  # whole, or not

    def gate_play(number: int) -> dict[str, Any]:
        wait = {"answer": f"{answers}/{number}.json", "controller": os.getpid()}
        return {
            "name": f"{GATE_PLAY}{number}",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [{"name": "orch gate", "orch_gate": wait}],
        }

    plays: list[dict[str, Any]] = []
    for number, hosts in enumerate(batches):
        plays.append(gate_play(number))
        batch = {"name": f"orch batch {number}", "hosts": list(hosts), "gather_facts": False}
        plays.append({**batch, "tasks": [host_task()]})
    plays.append(gate_play(len(batches)))
    extravars = {"orch_argv": dict(argv), "orch_stdin": dict(stdin)}
    results = _Results({HOST_TASK}, on_result, only_last=True)

    def on_event(event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        if event.get("event") == "playbook_on_play_start":
            name = str(data.get("play", ""))
            if name.startswith(GATE_PLAY):
                gate(int(name.removeprefix(GATE_PLAY)))
        else:
            results.take(event)

    forks = max((len(b) for b in batches), default=1)
    try:
        ended = _run_playbook(inventory, plays, extravars, forks, None, on_event, work, cancel)
    finally:
        shutil.rmtree(answers, ignore_errors=True)
    return "" if len(batches) in gates else ended


def run_play(
    inventory: Path,
    hosts: Sequence[str],
    tasks: Sequence[Mapping[str, Any]],
    extravars: Mapping[str, Any],
    on_result: Callable[[HostResult], None],
    work: Path,
    cancel: Callable[[], bool] = lambda: False,
) -> None:
    """One play of `tasks` on `hosts` at once. `on_result` once per host, as soon as its part
    is over: its first failure, its unreachability, or the result of the last task. `work`:
    the private folder ansible-runner's files go in (removed after; what a killed controller
    left there is removed by the next roll: clear_work)."""
    play = [{"name": "orch", "hosts": "all", "gather_facts": False, "tasks": list(tasks)}]
    results = _Results({str(tasks[-1]["name"])}, on_result)
    limit = ",".join(hosts)
    ended = _run_playbook(
        inventory, play, extravars, max(1, len(hosts)), limit, results.take, work, cancel
    )
    if cancel():  # the hosts still working stay `running` in the record
        return
    for host in hosts:  # Ansible ended without a word for it (a crash, a killed ansible)
        if host not in results.answered:
            why = f"Ansible ended without an answer: {ended}"
            on_result(HostResult(host, reached=True, rc=None, stdout="", stderr="", msg=why))


class _Results:
    """Each host's HostResult from the event stream, once: its first failure, its
    unreachability, or the result of one of the `last` tasks (`only_last`: events of other
    tasks are not the hosts', as the roll's gates)."""

    def __init__(
        self, last: set[str], on_result: Callable[[HostResult], None], only_last: bool = False
    ) -> None:
        self.last = last
        self.on_result = on_result
        self.only_last = only_last
        self.answered: set[str] = set()

    def take(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host")
        ours = data.get("task") in self.last
        final = (ours or not self.only_last) and (
            kind in ("runner_on_failed", "runner_on_unreachable")
            or (kind == "runner_on_ok" and ours)
        )
        if not final or not host or host in self.answered:
            return
        res = data.get("res", {})
        self.answered.add(host)
        self.on_result(
            HostResult(
                host,
                reached=kind != "runner_on_unreachable",
                rc=res.get("rc"),
                stdout=res.get("stdout", ""),
                stderr=res.get("stderr", ""),
                msg=str(res.get("msg", "")),
                failed=kind == "runner_on_failed",
            )
        )


def ensure_work(work: Path) -> Path:
    """The private folder for Ansible's files (core/safeopen.py)."""
    ensure_private_dir(work, no_links_inside=True)
    return work.resolve()


def clear_work(work: Path) -> None:
    """What a killed controller's plays left in `work` and its subfolders: called before a
    roll, under its lock, when no play of this record can be running."""
    for left in [*work.glob("ansible-*"), *work.glob("gates-*"), *work.glob("*/ansible-*")]:
        shutil.rmtree(left, ignore_errors=True)


def _run_playbook(
    inventory: Path,
    plays: Sequence[Mapping[str, Any]],
    extravars: Mapping[str, Any],
    forks: int,
    limit: str | None,
    on_event: Callable[[dict[str, Any]], None],
    work: Path,
    cancel: Callable[[], bool],
) -> str:
    """ansible-playbook of `plays` through ansible-runner, every event to `on_event` as it
    comes; how Ansible ended, with its last word."""
    import ansible_runner

    failure: list[BaseException] = []

    def handler(event: dict[str, Any]) -> bool:
        if not failure:
            try:
                on_event(event)
            except BaseException as exc:  # Ansible is stopped, then it is raised
                failure.append(exc)
        return False  # written nowhere: the artifacts hold nothing we keep

    private = tempfile.mkdtemp(prefix="ansible-", dir=ensure_work(work))
    env = ansible_env()
    env["ANSIBLE_ACTION_PLUGINS"] = os.pathsep.join(
        p for p in (str(PLUGINS), os.environ.get("ANSIBLE_ACTION_PLUGINS")) if p
    )
    try:
        runner = ansible_runner.run(
            private_data_dir=private,
            playbook=list(plays),
            inventory=str(inventory.resolve()),
            limit=limit,
            extravars=dict(extravars),
            forks=forks,
            # Ansible's own scratch (~/.ansible/tmp otherwise) goes with the private folder,
            # also when a killed controller leaves it: the next play removes it.
            envvars={**env, "ANSIBLE_LOCAL_TEMP": f"{private}/local"},
            quiet=True,
            event_handler=handler,
            cancel_callback=lambda: bool(failure) or cancel(),
        )
        with runner.stdout as out:  # a file opened anew on each access
            said = last_line(out.read()) or "(nothing)"
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if failure:
        raise failure[0]
    return f"({runner.status}, rc {runner.rc}) {said}"


def last_line(text: str) -> str:
    """The last non-empty line, 300 characters at most: what Ansible, a host's stderr or a
    task's error said last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
