"""The fleet harness (tests/fleet_hosts.py): hosts reached over real SSH, by `ssh` and Ansible,
each its own machine, and nothing left of them afterwards.

The `orch fleet` tests trust these hosts to be separate and to go away: if web2 could see
web1's files, or a namespace outlived its fleet, those tests would pass for the wrong reasons.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleet_hosts
from conftest import pid_alive
from fleet_hosts import Fleet, FleetError, fleet
from sandbox import SANDBOX_PARENT

ANSIBLE = str(Path(sys.executable).parent / "ansible")
ALIVE = ("running", "degraded")

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def two() -> Iterator[Fleet]:
    with fleet(2) as f:
        yield f


@pytest.mark.systemd
def test_ssh_lands_on_each_hosts_own_machine(two: Fleet) -> None:
    web1, web2 = two.hosts
    mark = f"web1's own file {time.time_ns()}"
    r = web1.run(["sh", "-c", 'printf %s "$1" > /var/tmp/identity', "sh", mark])
    assert r.returncode == 0, r.stderr
    assert web1.private("/var/tmp/identity").read_text() == mark

    for host in two.hosts:
        r = two.ssh(host, "hostname; systemctl is-system-running")
        assert r.returncode == 0 and r.stdout.split()[0] == host.name, r
        assert r.stdout.split()[1] in ALIVE, r  # the host's own systemd answers, not none
    assert two.ssh(web1, "cat /var/tmp/identity").stdout == mark
    r = two.ssh(web2, "cat /var/tmp/identity")
    assert r.returncode != 0 and "No such file" in r.stderr, r


@pytest.mark.systemd
def test_ansible_reaches_every_host_and_reports_the_dead_one(two: Fleet, tmp_path: Path) -> None:
    # Nothing listens on port 2: refused at once, where a silent address would time out.
    ghost = {"ansible_host": two.hosts[0].ip, "ansible_port": 2}
    inventory = two.inventory(tmp_path / "inventory.yaml", extra_hosts={"ghost": ghost})
    r = subprocess.run(
        [ANSIBLE, "all", "-i", str(inventory), "-m", "ping", "-o"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # no ansible.cfg from the working directory
        env={
            **os.environ,
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible"),
        },
    )
    said = {line.split(" | ")[0]: line for line in r.stdout.splitlines() if " | " in line}
    for host in two.hosts:
        assert "SUCCESS" in said.get(host.name, "") and "pong" in said[host.name], r
    assert "UNREACHABLE" in said.get("ghost", ""), r
    assert r.returncode == 4, r  # ansible's "some host unreachable"


@pytest.mark.parametrize("systemd", [pytest.param(True, marks=pytest.mark.systemd), False])
def test_nothing_outlives_the_fleet(systemd: bool) -> None:
    """Even when the body fails, and with a process left running in an SSH session."""
    with pytest.raises(RuntimeError, match="the body failed"), fleet(2, systemd=systemd) as f:
        for host in f.hosts:
            r = f.ssh(host, "setsid sleep 600 </dev/null >/dev/null 2>&1 &")
            assert r.returncode == 0, r
        pids = {h.netns: _pids_in(h.netns) for h in f.hosts}
        assert all({"sshd", "sleep"} <= {_comm(p) for p in ps} for ps in pids.values()), pids
        folder, veths = f.folder, [h.veth for h in f.hosts]
        raise RuntimeError("the body failed")
    assert not [ns for ns in _namespaces() if ns in pids]
    assert not [p for ps in pids.values() for p in ps if pid_alive(p)]  # (a zombie is dead)
    assert not [v for v in veths if Path(f"/sys/class/net/{v}").exists()]
    assert not [g for ns in pids for g in Path("/sys/fs/cgroup").glob(f"*/orch-sandbox-{ns}")]
    assert not folder.exists()


@pytest.mark.parametrize("systemd", [pytest.param(True, marks=pytest.mark.systemd), False])
def test_a_host_that_cannot_come_up_fails_the_fleet_with_sshds_words(
    systemd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """web2's sshd refuses its configuration: the error says why, and web1 and web3 go too."""
    config = fleet_hosts._sshd_config

    def broken_for_web2(ip: str, host_key: Path, folder: Path) -> str:
        return config(ip, host_key, folder) + ("NoSuchOption yes\n" if ".2.2" in ip else "")

    monkeypatch.setattr(fleet_hosts, "_sshd_config", broken_for_web2)
    before, namespaces = set(SANDBOX_PARENT.iterdir()), _ours()
    with pytest.raises(FleetError, match=r"(?s)web2.*NoSuchOption"), fleet(3, systemd=systemd):
        pytest.fail("the fleet came up with a broken host")
    assert _ours() == namespaces  # the module's fleet (`two`) may be up
    assert set(SANDBOX_PARENT.iterdir()) == before  # no fleet folder, no sandbox folder


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _ours() -> set[str]:
    return {ns for ns in _namespaces() if ns.startswith(fleet_hosts.netns_prefix())}


def _pids_in(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
