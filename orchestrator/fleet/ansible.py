"""One Ansible play over some hosts, through ansible-runner, with each host's result.

The play is one `command` task: orch's host command, given its payload on stdin (base64, so
no Jinja templating can touch the plan's text). `failed_when: false`: a host's outcome is
judged by orch from the host's answer, not by Ansible from an exit code; Ansible tells apart
only what it alone knows: a host it could not reach.

ansible-runner writes its artifacts (every event, module arguments included) into a private
folder beside the fleet record, removed when the play ends: the controller keeps only what
`record.py` keeps.
The user's own `ansible.cfg` (ANSIBLE_CONFIG, or one in the working directory) still applies.
"""

from __future__ import annotations

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
    task = {
        "name": "orch fleet host",
        "ansible.builtin.command": {
            "argv": "{{ orch_argv[inventory_hostname] }}",
            "stdin": "{{ orch_stdin[inventory_hostname] }}",
        },
        "failed_when": False,
        "changed_when": True,
    }
    extravars = {"orch_argv": dict(argv), "orch_stdin": dict(stdin)}
    run_play(inventory, hosts, [task], extravars, on_result, work, cancel)


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
    left there is removed by the next roll)."""
    import ansible_runner

    last = tasks[-1]["name"]
    play = [{"name": "orch", "hosts": "all", "gather_facts": False, "tasks": list(tasks)}]
    answered: set[str] = set()

    def on_event(event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host")
        final = kind in ("runner_on_failed", "runner_on_unreachable") or (
            kind == "runner_on_ok" and data.get("task") == last
        )
        if final and host and host not in answered:
            res = data.get("res", {})
            answered.add(host)
            on_result(
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
        return False  # written nowhere: the artifacts hold nothing we keep

    ensure_private_dir(work, no_links_inside=True)  # ansible's private data: core/safeopen.py
    for left in work.glob("ansible-*"):  # a killed controller's
        shutil.rmtree(left, ignore_errors=True)
    private = tempfile.mkdtemp(prefix="ansible-", dir=work.resolve())
    try:
        runner = ansible_runner.run(
            private_data_dir=private,
            playbook=play,
            inventory=str(inventory.resolve()),
            limit=",".join(hosts),
            extravars=dict(extravars),
            forks=max(1, len(hosts)),
            # Ansible's own scratch (~/.ansible/tmp otherwise) goes with the private folder,
            # also when a killed controller leaves it: the next play removes it.
            envvars={**ansible_env(), "ANSIBLE_LOCAL_TEMP": f"{private}/local"},
            quiet=True,
            event_handler=on_event,
            cancel_callback=cancel,
        )
        said = (
            (last_line(runner.stdout.read()) or "(nothing)") if len(answered) < len(hosts) else ""
        )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if cancel():  # the hosts still working stay `running` in the record
        return
    for host in hosts:  # Ansible ended without a word for it (a crash, a killed ansible)
        if host not in answered:
            why = f"Ansible ended ({runner.status}, rc {runner.rc}) without an answer: {said}"
            on_result(HostResult(host, reached=True, rc=None, stdout="", stderr="", msg=why))


def last_line(text: str) -> str:
    """The last non-empty line, 300 characters at most: what Ansible, a host's stderr or a
    task's error said last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
