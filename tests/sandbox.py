"""A throwaway systemd: PID 1 of private PID and mount namespaces, for the systemd task tests.

The development and CI machines run as root without systemd as PID 1. A systemd started in
new PID and mount namespaces alone still shares the host's file system, and at "boot" its
systemd-tmpfiles-setup.service ran `D /tmp` and wiped the host's /tmp. So, before
systemd is exec'd, inside the new mount namespace:

- private tmpfs is mounted over /tmp, /var/tmp and /run (nothing systemd does there reaches the
  host), and the few host paths under them that the tests need are bind-mounted back: the venv
  (when it lives in /tmp, as a developer's may) read-only, the checkout read-write;
- systemd boots a target of its own, `orch-sandbox.target`, that pulls in nothing: no
  multi-user.target (postgresql, timers, getty, logind ... would start against the host);
- every unit that the host's `*.wants/` and `*.requires/` folders would pull in is masked at
  runtime (in the private /run), so a test unit with default dependencies reaches sysinit.target
  and basic.target without starting tmpfiles, journald, sysctl, timesyncd or apt timers.

systemd runs in container mode (`container=`, as systemd-nspawn sets it): it does not log to the
host's kmsg or console (its stdio is /dev/null) and loads no kernel modules. The sandbox log
holds what the start script said; on a boot failure the error shows it and systemd's own view.

Files the tests share with the sandbox live in a folder under the checkout (`.sandbox/`), never
under /tmp, which the namespace cannot see. Code under test runs inside with `Sandbox.run`
(nsenter), because `systemctl` outside the namespace refuses to talk to this manager.

Every sandbox roots its units in a cgroup of its own (`orch-sandbox-NS` for one booted in
network namespace NS, `orch-sandbox-PID-N` otherwise): rooted at the shared top, two sandboxes'
`foo.service` would be one group, and one manager's stop or clean-up would break the other's
start (status 219, CGROUP). Two suites side by side, or a test fleet's hosts, each boot theirs.
systemd reports a unit's control group under that root (`Sandbox.control_group`).

`start(netns=NS)` boots it inside network namespace NS (`ip netns exec`), as one host of a test
fleet (tests/fleet_hosts.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
SANDBOX_PARENT = CHECKOUT / ".sandbox"
SYSTEMD = "/lib/systemd/systemd"
HIDDEN = (Path("/tmp"), Path("/var/tmp"), Path("/run"))  # covered by private tmpfs inside
UNIT_DIRS = (
    Path("/etc/systemd/system"),
    Path("/usr/lib/systemd/system"),
    Path("/lib/systemd/system"),
)
# Masked as well, by name: what would reach the host even when nothing pulls it in by a
# .wants folder (tmp.mount would hide the bind-mounted venv; tmpfiles wiped the host's /tmp).
ALWAYS_MASKED = (
    "tmp.mount",
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
    "systemd-timesyncd.service",
    "systemd-sysctl.service",
    "systemd-remount-fs.service",
    "systemd-random-seed.service",
    "systemd-udevd.service",
    "systemd-logind.service",
    "dbus.service",
    "dbus.socket",
    "getty@.service",
    "serial-getty@.service",
    "console-getty.service",
    "container-getty@.service",
    "postgresql.service",
    "postgresql@.service",
)
BOOT_TARGET = "orch-sandbox.target"  # written by the start script; pulls in nothing
_plain_sandboxes = itertools.count()  # names the own cgroups of those booted outside a netns

# Runs as the namespace's first process: $1 the shared folder, then the host paths to keep,
# each as ro:PATH or rw:PATH. Values arrive as arguments, never spliced into the script's text.
# `set -e`: if a tmpfs cannot be mounted, systemd is never started.
_INIT = r"""
set -eu
dir=$1; shift
# Kept paths wait in a private tmpfs on a folder outside /tmp, /var/tmp and /run: staging them
# under the shared folder fails when the checkout itself lies under /tmp (hidden next).
for stage in /mnt /media /srv /opt; do [ -d "$stage" ] && break; done
mount -t tmpfs -o mode=700 tmpfs "$stage"
i=0
for p in "$@"; do
    mkdir -p "$stage/keep/$i" && mount --bind "${p#*:}" "$stage/keep/$i"; i=$((i+1))
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
i=0
for p in "$@"; do
    mkdir -p "${p#*:}"
    mount --move "$stage/keep/$i" "${p#*:}"
    if [ "${p%%:*}" = ro ]; then mount -o remount,bind,ro "${p#*:}"; fi
    i=$((i+1))
done
mkdir -p /run/systemd/system /run/systemd/system.control
printf '[Unit]\nDescription=orch test sandbox\n' > "/run/systemd/system/$BOOT_TARGET"
while read -r unit; do
    ln -sf /dev/null "/run/systemd/system.control/$unit"
done < "$dir/masked"
exec "$SYSTEMD_BIN" --system --unit="$BOOT_TARGET" --log-target=console
"""


# Resolved once, at import: a preexec_fn runs between fork and exec, where a dlopen could
# deadlock on a lock another thread (a fleet brings hosts up in a pool) held at the fork.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
PR_SET_PDEATHSIG = 1


class SandboxError(RuntimeError):
    """The sandbox could not start: the systemd tests fail (they never skip)."""


@dataclass
class Sandbox:
    """A running sandbox: `pid` is its systemd on the host, `root` the shared folder."""

    pid: int
    root: Path
    log: Path
    unshare: subprocess.Popen[bytes]
    cgroup: str  # its own cgroup, a name under each hierarchy's top
    netns: str | None = None  # the network namespace it was booted in (start(netns=...))

    def run(
        self, argv: Sequence[str], *, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """argv inside the sandbox's namespaces, as a user on that host would run it."""
        # In a network namespace it is a host of its own: its network and hostname too.
        spaces = ["-m", "-p", "-n", "-u"] if self.netns else ["-m", "-p"]
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), *spaces, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "NO_COLOR": "1", **(env or {})},
        )

    def systemctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], timeout=timeout)

    def python(
        self, code: str, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """This test run's interpreter (and so the code under test) inside the sandbox."""
        return self.run(
            [sys.executable, "-c", code, *args], timeout=timeout, env={"PYTHONPATH": str(CHECKOUT)}
        )

    def write_unit(self, name: str, text: str) -> None:
        """A unit file in the sandbox's private /run/systemd/system (daemon-reload after)."""
        path = Path(f"/proc/{self.pid}/root/run/systemd/system") / name
        path.write_text(text)

    def control_group(self, unit: str) -> str:
        """The control group systemd reports for `unit`: under the sandbox's own group."""
        return f"/{self.cgroup}/system.slice/{unit}"

    def daemon_reload(self) -> None:
        r = self.systemctl("daemon-reload")
        if r.returncode != 0:
            raise SandboxError(f"daemon-reload failed: {r.stderr.strip()}")

    def log_tail(self) -> str:
        return _tail(self.log)

    def shutdown(self) -> None:
        """poweroff --force --force (SIGTERM to a namespace's PID 1 is ignored), then SIGKILL."""
        if self.unshare.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.systemctl("poweroff", "--force", "--force", timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.unshare.wait(timeout=5)
        # Our unshare is not reaped yet, so its pid (and its child's parent link) is still ours.
        if self.unshare.poll() is None:
            if _parent(self.pid) == self.unshare.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            self.unshare.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.unshare.wait(timeout=10)
        # A forced poweroff cleans nothing up in the host's (shared) cgroup hierarchies.
        _remove_own_cgroup(self.cgroup)


def _remove_own_cgroup(name: str) -> None:
    """A sandbox's own group `name` in every hierarchy, deepest groups first."""
    roots = [Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").glob("*/")]
    _remove_groups(
        [
            Path(folder)
            for r in roots
            if (r / name).is_dir()
            for folder, _, _ in os.walk(r / name, topdown=False)
        ]
    )


def _remove_groups(groups: list[Path]) -> None:
    """rmdir each group (children before parents); rmdir fails on a group with processes."""
    for _ in range(20):  # a killed process may leave its group a moment after it is reaped
        for group in list(groups):
            with contextlib.suppress(OSError):
                group.rmdir()
                groups.remove(group)
        if not groups:
            return
        time.sleep(0.05)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) or "(nothing)"
    except OSError:
        return "(no log)"


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def kept_paths() -> list[str]:
    """Host paths under /tmp, /var/tmp or /run the tests need inside, as `ro:PATH`/`rw:PATH`:
    the interpreter and venv read-only, the checkout (which holds the shared folder) writable."""
    wanted = {
        p.resolve(): "ro"
        for p in (Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent)
    }
    wanted[CHECKOUT] = "rw"
    hidden = [p for p in wanted if any(p.is_relative_to(h) for h in HIDDEN)]
    # A folder inside another kept folder comes with it.
    kept = sorted(p for p in hidden if not any(p != q and p.is_relative_to(q) for q in hidden))
    return [f"{wanted[p]}:{p}" for p in kept]


def masked_units() -> list[str]:
    """Every unit the host's .wants/.requires folders pull in (targets excepted), and more."""
    names = set(ALWAYS_MASKED)
    for folder in UNIT_DIRS:
        if not folder.is_dir():
            continue
        for deps in folder.iterdir():
            if deps.is_dir() and deps.name.endswith((".wants", ".requires")):
                names.update(u.name for u in deps.iterdir() if not u.name.endswith(".target"))
    return sorted(names)


def _die_with_parent() -> None:
    """In the unshare child: SIGKILL it if the test process dies (it takes the namespace along:
    --kill-child gives systemd the same fate). The "parent" is the thread that started it."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def _cgroup_roots() -> list[Path]:
    """The tops of the hierarchies systemd roots its units in: cgroup2 (pure or hybrid's
    `unified/`) and v1's named `systemd/`."""
    top = Path("/sys/fs/cgroup")
    pure = [top] if (top / "cgroup.controllers").is_file() else []
    return pure + [r for r in (top / "unified", top / "systemd") if (r / "cgroup.procs").is_file()]


def _joiner(procs: Sequence[Path]) -> Callable[[], None]:
    """A preexec_fn: die with the parent, then move into the cgroups whose `cgroup.procs` are
    given (0 means the writer). Only syscalls: it runs between fork and exec."""
    paths = [str(p) for p in procs]

    def join() -> None:
        _die_with_parent()
        for path in paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    return join


def start(boot_timeout: float = 30.0, *, netns: str | None = None) -> Sandbox:
    """Boot a sandbox and wait until `systemctl is-system-running` says running (or degraded).

    With `netns`, inside that (existing) network namespace. Always in a cgroup of its own."""
    if not Path(SYSTEMD).exists():
        raise SandboxError(f"{SYSTEMD} is missing: install systemd to run the systemd tests")
    cgroup = f"orch-sandbox-{netns or f'{os.getpid()}-{next(_plain_sandboxes)}'}"
    procs = []
    for r in _cgroup_roots():
        (r / cgroup).mkdir(exist_ok=True)
        procs.append(r / cgroup / "cgroup.procs")
    SANDBOX_PARENT.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="systemd-", dir=SANDBOX_PARENT))
    (root / "masked").write_text("".join(f"{u}\n" for u in masked_units()))
    log = root / "systemd.log"
    with log.open("wb") as out, _undo_cgroup_on_error(cgroup):
        unshare = subprocess.Popen(
            [
                # ip execs (no fork): the Popen's pid is still unshare's, systemd its child.
                # Its fresh /sys has no cgroup mounts: systemd mounts cgroup2 itself.
                *(["ip", "netns", "exec", netns] if netns else []),
                "unshare",
                "--fork",
                "--pid",
                "--mount",
                "--mount-proc",
                "--uts",
                "--propagation",
                "private",
                "--kill-child=SIGKILL",
                "--",
                "sh",
                "-c",
                _INIT,
                "sh",
                str(root),
                *kept_paths(),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "container": "orch-test",
                "SYSTEMD_BIN": SYSTEMD,
                "BOOT_TARGET": BOOT_TARGET,
                "LANG": "C.UTF-8",
            },
            start_new_session=True,
            preexec_fn=_joiner(procs) if procs else _die_with_parent,
        )
    try:
        pid = _wait_for_child(unshare, 10.0)
    except SandboxError as exc:
        said = _tail(log)
        _remove_folder(root)
        with contextlib.suppress(subprocess.TimeoutExpired):
            unshare.wait(timeout=10)
        _remove_own_cgroup(cgroup)
        raise SandboxError(f"{exc}; the start script said:\n{said}") from None
    sandbox = Sandbox(pid, root, log, unshare, netns=netns, cgroup=cgroup)
    try:
        _wait_until_running(sandbox, boot_timeout)
    except BaseException:
        sandbox.shutdown()
        remove(sandbox)  # the error carries the log
        raise
    return sandbox


@contextlib.contextmanager
def _undo_cgroup_on_error(cgroup: str) -> Iterator[None]:
    """Remove the sandbox's own (still empty) group if its process could not be started."""
    try:
        yield
    except BaseException:
        _remove_own_cgroup(cgroup)
        raise


def _wait_for_child(unshare: subprocess.Popen[bytes], timeout: float) -> int:
    """The host pid of unshare's child once it is systemd (the namespace's PID 1)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if unshare.poll() is not None:
            raise SandboxError(f"unshare exited with {unshare.returncode} before systemd ran")
        try:
            children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text()
        except OSError:
            children = ""
        for child in children.split():
            try:
                if os.readlink(f"/proc/{child}/exe").endswith("/systemd"):
                    return int(child)
            except OSError:
                pass
        time.sleep(0.02)
    unshare.kill()
    raise SandboxError(f"systemd did not start within {timeout:.0f}s")


def _wait_until_running(sandbox: Sandbox, timeout: float) -> None:
    end = time.monotonic() + timeout
    state = "(no answer)"
    while time.monotonic() < end:
        if sandbox.unshare.poll() is not None:
            raise SandboxError(
                f"the sandbox's systemd exited ({sandbox.unshare.returncode}):\n"
                f"{sandbox.log_tail()}"
            )
        r = sandbox.systemctl("is-system-running", timeout=10)
        said = (r.stdout.strip() or r.stderr.strip()).splitlines()
        state = said[-1] if said else "(no answer)"
        if state in ("running", "degraded"):
            return
        time.sleep(0.1)
    jobs = sandbox.systemctl("list-jobs", "--no-pager", timeout=10).stdout
    failed = sandbox.systemctl("list-units", "--failed", "--no-pager", timeout=10).stdout
    raise SandboxError(
        f"systemd did not reach running within {timeout:.0f}s (last: {state})\n"
        f"jobs:\n{jobs}\nfailed units:\n{failed}\nlog:\n{sandbox.log_tail()}"
    )


def remove(sandbox: Sandbox) -> None:
    """Delete the shared folder once the sandbox is down."""
    _remove_folder(sandbox.root)


def _remove_folder(root: Path) -> None:
    """The shared folder holds no mount points (kept paths are staged in the namespace's own
    tmpfs), so it can simply go."""
    shutil.rmtree(root, ignore_errors=True)
