"""Fleet hosts for the `orch fleet` tests: many "machines" on this one, each reached over SSH.

A fleet host is a Linux network namespace with an address of its own, joined to this machine
(the controller) by a veth pair, and its own sshd listening on that address. Ansible and the
`ssh` client reach it exactly as they would a remote machine: a TCP connection, a key login.

- A systemd host also runs its own systemd (tests/sandbox.py, booted inside the namespace):
  private PID namespace, hostname, /tmp, /var/tmp and /run, with sshd as a unit of that
  systemd, so an SSH session lands "on" the host and its `systemctl` talks to the host's systemd.
- A bare host is only the namespace and an sshd: it shares this machine's file system,
  processes and hostname. Cheap (a benchmark starts 50 of them).

`fleet(n)` brings n hosts up and takes everything down again (namespaces, veths, processes,
cgroups, its folder under CHECKOUT/.sandbox/), also when the body raises or a host fails to
come up. Nothing goes to /tmp: files the hosts share live in the fleet's folder.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sandbox import SANDBOX_PARENT, Sandbox, _die_with_parent, remove, start

SSHD = "/usr/sbin/sshd"
SSHD_UNIT = "sshd-test"
READY_TIMEOUT = 20.0
# Ansible's own ssh_args (ControlMaster=auto, ControlPersist=60s) come first on ssh's command
# line and ssh takes an option's first value, so ansible_ssh_common_args alone cannot turn
# multiplexing off: ansible_ssh_args replaces them. A persisted master would outlive the test
# (a leftover process) and answer for whichever host next takes the address.
NO_MULTIPLEXING = "-o ControlMaster=no -o ControlPath=none"
SSH_OPTIONS = (
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ControlMaster=no"
    " -o ControlPath=none"
)
INSTALL = "install openssh-server (the README's set-up does)"


_fleets = itertools.count()


def netns_prefix() -> str:
    """What the names of this process's namespaces start with: `PREFIX` `fleet` `-` `host`
    (orchf1234a-17; its veth, with an h, fits the kernel's 15 characters)."""
    return f"orchf{os.getpid() % 10000}"


class FleetError(RuntimeError):
    """A fleet could not come up or go down cleanly: the fleet tests fail (never skip)."""


@dataclass
class FleetHost:
    """One host: `ip` is its address in namespace `netns`, `sandbox` its systemd (or None)."""

    name: str
    ip: str
    netns: str
    sandbox: Sandbox | None
    veth: str  # the controller's end of the pair, in the root namespace
    gateway: str  # the controller's address on the host's link
    log: Path  # what its sshd said (-e: to stderr)
    sshd: subprocess.Popen[bytes] | None = None  # a bare host's sshd

    def run(self, argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """argv on this host: in its sandbox, or in its network namespace for a bare host."""
        if self.sandbox is not None:
            return self.sandbox.run(argv, timeout=timeout)
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def systemctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        if self.sandbox is None:
            raise FleetError(f"{self.name} is a bare host: it has no systemd")
        return self.sandbox.systemctl(*args, timeout=timeout)

    def private(self, path: str | Path) -> Path:
        """`path` on this host (in its private /tmp or /var/tmp) as the controller sees it."""
        if self.sandbox is None:
            return Path(path)  # a bare host shares the controller's file system
        return Path(f"/proc/{self.sandbox.pid}/root") / Path(path).relative_to("/")


@dataclass
class Fleet:
    hosts: list[FleetHost]
    key: Path  # the client's private key; root on every host accepts it
    folder: Path

    def __getitem__(self, name: str) -> FleetHost:
        return next(h for h in self.hosts if h.name == name)

    def ssh(
        self, host: FleetHost, command: str, *, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """`command` on `host` as root over a real SSH connection, with the fleet's key."""
        return _ssh(self.key, host.ip, command, timeout)

    def inventory(
        self,
        path: Path,
        host_vars: Mapping[str, Mapping[str, object]] = {},  # noqa: B006 (read only)
        group_vars: Mapping[str, object] = {},  # noqa: B006
        extra_hosts: Mapping[str, Mapping[str, object]] = {},  # noqa: B006
    ) -> Path:
        """An Ansible YAML inventory of the fleet at `path`. `extra_hosts` adds entries as
        given (one pointing nowhere stands for an unreachable host)."""
        hosts: dict[str, dict[str, object]] = {
            h.name: {"ansible_host": h.ip, **host_vars.get(h.name, {})} for h in self.hosts
        }
        hosts.update({name: dict(v) for name, v in extra_hosts.items()})
        connection = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_args": NO_MULTIPLEXING,
            "ansible_ssh_common_args": SSH_OPTIONS,
        }
        doc = {"all": {"vars": {**connection, **group_vars}, "hosts": hosts}}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


@contextmanager
def fleet(n: int, *, systemd: bool = True, prefix: str = "web") -> Iterator[Fleet]:
    """n hosts, `{prefix}1`..`{prefix}n`, up and accepting the fleet's key; all gone after."""
    if not 1 <= n <= 250:
        raise ValueError(f"a fleet has 1 to 250 hosts, not {n}")
    _check_tools(systemd)
    SANDBOX_PARENT.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="fleet-", dir=SANDBOX_PARENT))
    slots: list[_Slot] = []
    # PR_SET_PDEATHSIG (a sandbox's unshare, a bare sshd) fires when the *thread* that started
    # the process ends, so the pool that brings hosts up lives until they are down.
    pool = ThreadPoolExecutor(max_workers=min(n, 16), thread_name_prefix="fleet")
    ups: list[Future[None]] = []
    try:
        key, host_key = _keys(folder)
        subnet = _free_subnet()
        tag = f"{netns_prefix()}{next(_fleets) % 16:x}"  # a process may hold several fleets
        slots = [
            _Slot(f"{prefix}{i}", f"{tag}-{i}", subnet, i, folder, host_key, systemd)
            for i in range(1, n + 1)
        ]
        ups = [pool.submit(s.bring_up, key) for s in slots]
        wait(ups)
        errors = [e for f in ups if (e := f.exception()) is not None]
        if errors:
            raise FleetError(
                f"{len(errors)} of {n} fleet hosts did not come up; the first:\n{errors[0]}"
            ) from errors[0]
        yield Fleet([s.host() for s in slots], key, folder)
    except BaseException as exc:
        # Interrupted while hosts came up: none may still be coming up while it is taken down.
        for f in ups:
            f.cancel()
        wait(ups)
        if problems := _tear_down(slots, pool, folder):  # the body's (or bring-up's) error wins
            exc.add_note("fleet teardown left things behind:\n" + "\n".join(problems))
        raise
    else:
        if problems := _tear_down(slots, pool, folder):
            raise FleetError("fleet teardown left things behind:\n" + "\n".join(problems))


@dataclass
class _Slot:
    """One host while it comes up and goes down: what exists so far, to undo at teardown."""

    name: str
    netns: str
    subnet: int  # the second octet: host i is 10.SUBNET.i.2, the controller's end .1
    index: int
    folder: Path
    host_key: Path
    systemd: bool
    netns_made: bool = False
    sandbox: Sandbox | None = None
    sshd: subprocess.Popen[bytes] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def ip(self) -> str:
        return f"10.{self.subnet}.{self.index}.2"

    @property
    def veth(self) -> str:
        return f"{self.netns}h"  # at most 15 characters

    @property
    def log(self) -> Path:
        return self.folder / f"sshd-{self.name}.log"

    def host(self) -> FleetHost:
        gateway = f"10.{self.subnet}.{self.index}.1"
        return FleetHost(
            self.name, self.ip, self.netns, self.sandbox, self.veth, gateway, self.log, self.sshd
        )

    def bring_up(self, key: Path) -> None:
        self._network()
        config = self.folder / f"sshd-{self.name}.conf"
        config.write_text(_sshd_config(self.ip, self.host_key, self.folder))
        if self.systemd:
            self._systemd(config)
        else:
            self._bare(config)
        self._wait_for_login(key)

    def _network(self) -> None:
        _ip("netns", "add", self.netns)
        self.netns_made = True
        # The peer is made inside the namespace as eth0, as on a real host.
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _ip("addr", "add", f"10.{self.subnet}.{self.index}.1/24", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        _ip("-n", self.netns, "link", "set", "eth0", "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")

    def _systemd(self, config: Path) -> None:
        self.sandbox = start(netns=self.netns)
        _set_hostname(self.sandbox, self.name)
        r = self.sandbox.run(
            [
                "systemd-run",
                f"--unit={SSHD_UNIT}",
                "-p",
                "RuntimeDirectory=sshd",  # sshd's privilege separation directory
                "-p",
                f"StandardOutput=append:{self.log}",  # stderr follows (inherit)
                SSHD,
                "-D",
                "-e",
                "-f",
                str(config),
            ]
        )
        if r.returncode != 0:
            raise FleetError(f"{self.name}: systemd-run sshd failed: {r.stderr.strip()}")

    def _bare(self, config: Path) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # shared with the controller
        with self.log.open("wb") as out:
            self.sshd = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # gone with the test process
            )

    def _wait_for_login(self, key: Path) -> None:
        end = time.monotonic() + READY_TIMEOUT
        said = ""
        while time.monotonic() < end:
            if (gone := self._sshd_gone()) is not None:
                raise FleetError(f"{self.name}: sshd {gone}\n{self._sshd_said()}")
            if _port_open(self.ip, 22):
                r = _ssh(key, self.ip, "true", 15)
                if r.returncode == 0:
                    return
                said = r.stderr.strip()
            time.sleep(0.1)
        raise FleetError(
            f"{self.name} ({self.ip}): no ssh login within {READY_TIMEOUT:.0f}s"
            f" (ssh said: {said or 'nothing; the port never opened'})\n{self._sshd_said()}"
        )

    def _sshd_gone(self) -> str | None:
        """Why sshd is not running, if it is not (an exited process, a failed unit)."""
        if self.sshd is not None:
            code = self.sshd.poll()
            return None if code is None else f"exited with {code}"
        if self.sandbox is not None:
            state = self.sandbox.systemctl("is-active", SSHD_UNIT).stdout.strip()
            return None if state in ("active", "activating") else f"unit is {state}"
        return None

    def _sshd_said(self) -> str:
        parts = []
        if self.sandbox is not None:
            status = self.sandbox.systemctl("status", "--no-pager", SSHD_UNIT)
            parts.append(f"systemctl status {SSHD_UNIT}:\n{status.stdout}{status.stderr}")
        try:
            text = self.log.read_text(errors="replace").strip() or "(nothing)"
        except OSError:
            text = "(no log)"
        parts.append(f"sshd's output:\n{text}")
        return "\n".join(parts)

    def tear_down(self) -> list[str]:
        """Undo what bring_up did; returns what could not be undone."""
        with self.lock:
            if self.sandbox is not None:
                self.sandbox.shutdown()
                remove(self.sandbox)
                self.sandbox = None
            if self.sshd is not None:
                self.sshd.terminate()
                try:
                    self.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.sshd.kill()
                    self.sshd.wait(timeout=5)
                self.sshd = None
            if not self.netns_made:
                return []
            # What is left in the namespace is ours: session processes of a bare host's sshd.
            # A namespace with processes outlives `ip netns del`, and its veth with it.
            _kill_all_in(self.netns)
            problems = []
            r = subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append(f"ip netns del {self.netns}: {r.stderr.strip()}")
            if _wait_until(lambda: not Path(f"/sys/class/net/{self.veth}").exists(), 5):
                self.netns_made = False
            else:
                problems.append(f"{self.veth} still exists after its namespace was deleted")
            return problems


def _tear_down(slots: list[_Slot], pool: ThreadPoolExecutor, folder: Path) -> list[str]:
    problems: list[str] = []
    futures = [pool.submit(s.tear_down) for s in slots]
    for s, f in zip(slots, futures, strict=True):
        try:
            problems += f.result()
        except Exception as exc:  # the other hosts still go down
            problems.append(f"{s.name}: {exc!r}")
            try:
                problems += s.tear_down()  # again, on this thread: what the failure skipped
            except Exception as again:
                problems.append(f"{s.name}, again: {again!r}")
    pool.shutdown(wait=True)
    shutil.rmtree(folder, ignore_errors=True)
    return problems


def _check_tools(systemd: bool) -> None:
    missing = [t for t in ("ip", "ssh", "ssh-keygen", "nsenter") if shutil.which(t) is None]
    if not Path(SSHD).is_file():
        missing.append(SSHD)
    if systemd and shutil.which("unshare") is None:
        missing.append("unshare")
    if missing:
        raise FleetError(f"{', '.join(missing)} missing: {INSTALL}; `ip` is iproute2's")


def _keys(folder: Path) -> tuple[Path, Path]:
    """The client's key (authorized on every host) and one host key for all hosts."""
    key, host_key = folder / "id_ed25519", folder / "ssh_host_ed25519_key"
    for path, comment in ((key, "orch-fleet-client"), (host_key, "orch-fleet-host")):
        _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
        path.chmod(0o600)
    (folder / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    return key, host_key


def _sshd_config(ip: str, host_key: Path, folder: Path) -> str:
    # StrictModes no: the checkout's folders need not be root-only. PidFile none: several
    # bare hosts share /run. MaxStartups/MaxSessions: a fleet run opens many at once.
    return (
        f"ListenAddress {ip}\n"
        "Port 22\n"
        f"HostKey {host_key}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PidFile none\n"
        "MaxStartups 100:30:200\n"
        "MaxSessions 50\n"
        "Subsystem sftp internal-sftp\n"
    )


def _free_subnet() -> int:
    """A second octet RR such that nothing here uses 10.RR.0.0/16: spread by pid so test
    processes running at once rarely pick the same."""
    used = _check(["ip", "-o", "-4", "addr", "show"]) + _check(["ip", "-4", "route", "show"])
    for k in range(50):
        rr = 200 + (os.getpid() + k) % 50
        if f"10.{rr}." not in used:
            return rr
    raise FleetError("no free 10.200-249.0.0/16 subnet for a fleet")


def _set_hostname(sandbox: Sandbox, name: str) -> None:
    # Only in the sandbox's own UTS namespace: never rename the controller.
    if os.stat(f"/proc/{sandbox.pid}/ns/uts").st_ino == os.stat("/proc/self/ns/uts").st_ino:
        raise FleetError("the sandbox shares the controller's UTS namespace")
    r = sandbox.run(["hostname", name])
    if r.returncode != 0:
        raise FleetError(f"hostname {name}: {r.stderr.strip()}")


def _kill_all_in(netns: str) -> None:
    def pids() -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split() if p.isdigit()]

    for pid in pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not pids(), 5)  # a dead process leaves the namespace when it exits


def _ssh(key: Path, ip: str, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(key),
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=2",
            "-o",
            "LogLevel=ERROR",
            *SSH_OPTIONS.split(),
            f"root@{ip}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.02)


def _ip(*args: str) -> None:
    _check(["ip", *args])


def _check(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise FleetError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout
