"""A roll's one ansible-playbook and its gates (orchestrator/fleet/ansible.py's run_roll, the
action plugins orch_gate and orch_host), with real Ansible over its `local` connection: what
orch's controller relies on, without SSH hosts (test_fleet.py rolls over those).

- Gate k is asked only after every result of batch k-1 has reached the controller: it judges
  a batch whole before the next one goes.
- A gate that says stop ends the playbook there: no later batch runs anything.
- An error in the controller's handling stops Ansible and is raised, never a hung playbook.
- A gate whose controller is gone stops the playbook by itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.fleet.ansible import (
    GATE_PLAY,
    PLUGINS,
    HostResult,
    ansible_env,
    ansible_tool,
    run_roll,
)

pytestmark = pytest.mark.fleet


def local_inventory(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "hosts.yml"
    hosts = {n: {} for n in names}
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path.write_text(json.dumps({"all": {"vars": common, "hosts": hosts}}))
    return path


class Roll:
    """run_roll over local hosts whose command appends its name (and its stdin) to a file."""

    def __init__(self, tmp_path: Path, batches: list[list[str]]) -> None:
        self.tmp_path = tmp_path
        self.batches = batches
        self.ran = tmp_path / "ran"
        self.seen: list[tuple[str, Any]] = []  # ("gate", k) and ("result", host) in order
        self.results: dict[str, HostResult] = {}

    def go(self, on_gate: Any = lambda number: True) -> str:
        hosts = [h for b in self.batches for h in b]
        argv = {
            h: ["sh", "-c", f"cat >> {self.ran}; echo ' {h}' >> {self.ran}; echo ok"] for h in hosts
        }

        def gate(number: int) -> bool:
            self.seen.append(("gate", number))
            return bool(on_gate(number))

        def result(r: HostResult) -> None:
            self.seen.append(("result", r.host))
            self.results[r.host] = r

        return run_roll(
            local_inventory(self.tmp_path, hosts),
            self.batches,
            argv,
            {h: f"payload-of-{h}" for h in hosts},
            gate,
            result,
            work=self.tmp_path / "work",
        )

    def ran_on(self) -> list[str]:
        return self.ran.read_text().split() if self.ran.exists() else []


def test_each_gate_comes_after_every_result_of_the_batch_before(tmp_path: Path) -> None:
    roll = Roll(tmp_path, [["h1"], ["h2", "h3"], ["h4"]])
    assert roll.go() == ""  # Ansible got to the last gate
    gates = [i for i, (kind, _) in enumerate(roll.seen) if kind == "gate"]
    assert [roll.seen[i][1] for i in gates] == [0, 1, 2, 3]
    for number, batch in enumerate(roll.batches):
        answered = [i for i, (kind, host) in enumerate(roll.seen) if host in batch]
        assert gates[number] < min(answered) and max(answered) < gates[number + 1], roll.seen
    assert {h: (r.reached, r.rc, r.stdout) for h, r in roll.results.items()} == dict.fromkeys(
        ("h1", "h2", "h3", "h4"), (True, 0, "ok\n")
    )
    # Each host was given its own stdin, once.
    assert sorted(roll.ran_on()) == sorted(
        [f"payload-of-{h}" for h in ("h1", "h2", "h3", "h4")] + ["h1", "h2", "h3", "h4"]
    )


def test_a_gate_that_says_stop_ends_the_playbook_there(tmp_path: Path) -> None:
    roll = Roll(tmp_path, [["h1"], ["h2"], ["h3"]])
    ended = roll.go(lambda number: number < 1)
    assert ended, "Ansible ended before its last gate: said"
    assert [s for s in roll.seen if s[0] == "gate"] == [("gate", 0), ("gate", 1)]
    assert "h1" in roll.ran_on() and "h2" not in roll.ran_on() and "h3" not in roll.ran_on()


def test_an_error_at_a_gate_is_raised_and_no_batch_runs_after_it(tmp_path: Path) -> None:
    roll = Roll(tmp_path, [["h1"], ["h2"]])

    def broken(number: int) -> bool:
        if number == 1:
            raise RuntimeError("the record is gone")
        return True

    with pytest.raises(RuntimeError, match="the record is gone"):
        roll.go(broken)
    assert "h1" in roll.ran_on() and "h2" not in roll.ran_on()
    assert not list((tmp_path / "work").glob("*/")), "the playbook's files are removed"


def test_a_gate_whose_controller_is_gone_stops_the_playbook(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    marker = tmp_path / "after-the-gate"
    plays = [
        {
            "name": f"{GATE_PLAY}0",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [{"orch_gate": {"answer": str(tmp_path / "never"), "controller": dead.pid}}],
        },
        {
            "name": "after",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.file": {"path": str(marker), "state": "touch"}}],
        },
    ]
    playbook = tmp_path / "play.json"
    playbook.write_text(json.dumps(plays))
    env = {
        **ansible_env(),
        "ANSIBLE_ACTION_PLUGINS": str(PLUGINS),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t"),
    }
    done = subprocess.run(
        [ansible_tool("ansible-playbook"), "-i", "localhost,", str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "orch's controller is gone" in done.stdout, done.stdout
    assert not marker.exists()
