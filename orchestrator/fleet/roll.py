"""A rolling run of one plan over an inventory's hosts: canary, approval, batches, stop, resume.

The roll's shape is fixed when it begins and kept in the record: the first `canary` hosts
(inventory order) are batch 0, the rest go in batches of `serial` (a number or a percentage of
the hosts). Before a batch starts, its hosts are recorded `running` (committed), then Ansible
runs orch's host command on all of them at once (host.py). Each answer is recorded as it comes.

- A host that failed (its plan failed there; its compensations ran there, as on one host),
  refused (another orch build), errored, or stopped at one of the plan's own gates stops the
  roll after its batch: no later batch starts. An unreachable host stops it too, unless
  `unreachable="skip"`: then the roll goes on and the host is tried again by the next run.
- After the canary batch the roll waits for a person (`orch fleet approve`), exit 4.
- Running again resumes the open roll: completed hosts are not contacted; a host recorded
  `running` (the controller died while it worked) is sent the plan again, and its orch waits
  for the earlier run there to end and resumes from its own store, so nothing runs twice.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WAITING,
    UsageError,
)
from orchestrator.core.periodic import every
from orchestrator.core.status import Status
from orchestrator.fleet.ansible import HostResult, clear_work, last_line, run_command, run_roll
from orchestrator.fleet.answer import (
    BoardTask,
    Errored,
    Finding,
    Missing,
    Ran,
    Refused,
    Unreadable,
    one_line,
    progress_line,
    read_answer,
    read_progress,
)
from orchestrator.fleet.build import build_id
from orchestrator.fleet.folder import collect, entries
from orchestrator.fleet.inventory import InventoryHost, read_inventory
from orchestrator.fleet.progress import PROGRESS_S
from orchestrator.fleet.record import DONE, UNREADABLE, FleetRecord, Roll, record_path

Answered = Ran | Refused | Errored | Missing | Unreadable

# A new roll's batches when --serial, --canary and --max-fail are not given: one host a batch,
# a canary of one, and any failure stops the roll (as before --max-fail).
SERIAL, CANARY, MAX_FAIL = "1", 1, "0"
DEFAULT_VENV = "/opt/orch/venv"
DEFAULT_HOME = "/var/lib/orch"
# What ends a host's part in a batch without completing it; all but `unreachable` stop the roll.
STOPPING = ("failed", "refused", "error", "waiting")
# A roll's hosts a rollback puts back: those that ran some of the plan (or may have: `running`
# is a killed controller's batch). Pending, refused, unreachable or removed hosts were not
# touched; an `error` host never ran the plan (it could not be placed or its store was held).
TOUCHED = ("completed", "failed", "waiting", "running")


@dataclass(frozen=True)
class RollOptions:
    inventory: Path
    # Hosts a batch after the canary ("N" or "N%"), hosts in the canary batch (0: no canary, no
    # approval gate). None: not given; a new roll takes the defaults, a resumed one its own.
    serial: str | None = None
    canary: int | None = None
    max_fail: str | None = None  # failed hosts a batch may have: "N" or "N%"; None: the roll's
    limit: str | None = None  # Ansible's --limit pattern
    unreachable: str = "stop"  # or "skip": go on without it, try it again next run
    approve: Sequence[str] = ()  # the plan's own gates, passed on every host
    new_roll: bool = False  # abandon the open roll and begin again
    wait_s: float = 3600.0  # how long a host waits for an earlier run of its store
    install: bool = False  # put this orch on a host that refuses (install.py), then run there
    rollback: bool = False  # put back the hosts of the open (or latest) roll: `orch fleet rollback`


@dataclass
class RollSummary:
    roll_id: int
    state: str
    exit_code: int
    message: str
    record: Path


def batches_of(hosts: Sequence[str], canary: int, serial: str) -> list[list[str]]:
    """Canary batch first (when canary > 0), then batches of `serial` hosts (N or N%, of all)."""
    size = batch_size(serial, len(hosts))
    head, rest = list(hosts[:canary]), list(hosts[canary:])
    return ([head] if head else []) + [rest[i : i + size] for i in range(0, len(rest), size)]


def hosts_or_share(option: str, value: str, least: int, example: str) -> int | float:
    """An option's `N` (hosts, an int of at least `least`) or `N%` (a share, a float from
    just above 0, or from 0 where `least` is 0, to 100); else a UsageError naming it."""
    text = value.strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 <= share <= 100 or (share == 0 and least > 0):
                raise ValueError
            return share
        count = int(text)
        if count < least:
            raise ValueError
        return count
    except ValueError:
        raise UsageError(
            f"--{option} {value!r}: give a number of hosts ({example}) or a share ({example}0%)"
        ) from None


def batch_size(serial: str, total: int) -> int:
    """A batch's hosts: `N`, or `N%` of `total`, rounded up."""
    size = hosts_or_share("serial", serial, 1, "2")
    return max(1, math.ceil(total * size / 100)) if isinstance(size, float) else size


def failures_allowed(max_fail: str, batch: int) -> int:
    """How many of a batch of `batch` hosts may fail and the roll go on: `N`, or `N%` as
    Ansible's max_fail_percentage counts it (the roll stops when the share that failed
    exceeds N%: 1 of 6 is 16.7%, over 10%)."""
    allowed = hosts_or_share("max-fail", max_fail, 0, "1")
    return math.floor(batch * allowed / 100) if isinstance(allowed, float) else allowed


@dataclass
class _Flight:
    """The batch in flight: its hosts still at work (the heartbeat and the progress poll read
    them from their threads: the set is changed in place, never replaced), since when."""

    label: str = ""  # "canary", "batch 2"; "" between batches
    number: int = -1
    todo: list[str] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    lacking: list[str] = field(default_factory=list)  # answered they lack files: sent whole
    started: float = 0.0

    def begin(self, label: str, number: int, todo: Sequence[str]) -> None:
        self.label, self.number, self.todo, self.lacking = label, number, list(todo), []
        self.started = time.monotonic()
        self.hosts.update(todo)

    def over(self) -> None:
        self.label = ""
        self.hosts.clear()


@dataclass
class _Course:
    """What a roll's gates have decided so far."""

    max_fail: str
    flight: _Flight = field(default_factory=_Flight)
    end: RollSummary | None = None  # the roll ends at the next gate
    skipped: list[str] = field(default_factory=list)  # unreachable, --unreachable skip
    tolerated: list[str] = field(default_factory=list)  # failed within --max-fail


class Roller:
    """One `orch fleet run`: the record open, the roll chosen, the batches run."""

    def __init__(
        self,
        plan_file: Path,
        var_args: Sequence[str],
        options: RollOptions,
        say: Callable[[str], None],
    ) -> None:
        from orchestrator.api import Runbook

        batch_size(options.serial or SERIAL, 1)  # a bad --serial is said before anything
        failures_allowed(options.max_fail or MAX_FAIL, 1)  # and a bad --max-fail
        self.plan_file = plan_file
        self.options = options
        self.say = say
        self.runbook = Runbook(plan_file, None, var_args)
        self.plan = self.runbook.load()  # a bad plan stops here, before any host is reached
        self.shipped = collect(plan_file, self.plan.files)  # and a folder that cannot travel
        self.var_args = tuple(var_args)
        self.record_path = record_path(self.runbook.store_path)
        self.stopping = threading.Event()

    # --- the roll --------------------------------------------------------------------------

    def run(self) -> RollSummary:
        from orchestrator.store.lock import RunLock

        hosts = read_inventory(self.options.inventory, self.options.limit)
        lock = RunLock(self.record_path)
        lock.acquire({"pid": os.getpid(), "host": socket.gethostname(), "run_id": "fleet"})
        clear_work(self.work)  # a killed controller's plays' files
        record = FleetRecord.open(self.record_path, create=True)
        try:
            roll = self._choose_roll(record, hosts)
            with self._stoppable():
                return self._roll(record, roll, {h.name: h for h in hosts})
        finally:
            record.close()
            lock.release()

    def _choose_roll(self, record: FleetRecord, hosts: Sequence[InventoryHost]) -> Roll:
        names = [h.name for h in hosts]
        o = self.options
        rolls = record.rolls()
        open_roll = next((r for r in rolls if r.open), None)
        if o.rollback and (open_roll is None or open_roll.rollback_of is None or o.new_roll):
            if open_roll is None:  # the latest roll, whatever its end
                target = rolls[0] if rolls else None
            elif open_roll.rollback_of is None:  # the open roll forward
                target = open_roll
            else:  # an open rollback begun again (--new-roll): what it puts back
                target = record.roll(open_roll.rollback_of)
            return self._begin_rollback(record, target, hosts)
        if open_roll is not None and not o.new_roll:
            if open_roll.rollback_of is not None and not o.rollback:
                raise UsageError(
                    f"roll #{open_roll.id} is a rollback of roll #{open_roll.rollback_of} "
                    f"({open_roll.state}): `orch fleet rollback {self.plan_file}` resumes it; "
                    "--new-roll begins a roll forward"
                )
            if open_roll.state == UNREADABLE:  # its canary or serial may be lost: no guessing
                raise UsageError(
                    f"roll #{open_roll.id} cannot be resumed: {open_roll.detail}; "
                    "`--new-roll` begins a new one (each host's store knows what it did)"
                )
            self.say(
                f"resuming {self.noun} #{open_roll.id} ({open_roll.state}"
                + (f": {open_roll.detail}" if open_roll.detail else "")
                + ")"
            )
            if open_roll.build != build_id():
                self.say(f"  orch here is now {build_id()}; the roll began with {open_roll.build}")
            given = {"canary": o.canary, "serial": o.serial, "max_fail": o.max_fail}
            kept = {"canary": open_roll.canary, "serial": open_roll.serial,
                    "max_fail": open_roll.options.get("max_fail", MAX_FAIL)}  # fmt: skip
            if any(v is not None and v != kept[k] for k, v in given.items()):  # only if asked
                self.say(
                    f"  the roll keeps its batches (canary {open_roll.canary}, serial "
                    f"{open_roll.serial}, max-fail {kept['max_fail']}); --new-roll begins one "
                    "with yours"
                )
            known = {h.host: h.state for h in record.hosts(open_roll.id)}
            for host, state in known.items():
                if host not in names and state != "removed":
                    record.finish_host(open_roll.id, host, "removed", "no longer in the inventory")
                elif host in names and state == "removed":
                    record.finish_host(open_roll.id, host, "pending", "back in the inventory")
            new = [n for n in names if n not in known]
            if new:
                self.say(f"  {len(new)} host(s) new in the inventory go last: {', '.join(new)}")
                record.add_hosts(open_roll.id, batches_of(new, 0, open_roll.serial))
            return record.roll(open_roll.id)
        canary = CANARY if o.canary is None else o.canary
        roll = self._new_roll(record, names, canary, o.serial or SERIAL, o.max_fail or MAX_FAIL)
        self.say(f"roll #{roll.id} of {self.plan.name}: {len(names)} hosts{self._how(roll, names)}")
        return roll

    def _new_roll(
        self,
        record: FleetRecord,
        hosts: Sequence[str],
        canary: int,
        serial: str,
        max_fail: str,
        **more: Any,
    ) -> Roll:
        """A roll of `hosts` in their order, recorded (any open roll abandoned); `more`: other
        options it keeps (`rollback_of`)."""
        o = self.options
        roll_id = record.new_roll(
            plan=self.plan.name,
            plan_file=str(self.plan_file),
            inventory=str(o.inventory),
            build=build_id(),
            canary=min(canary, len(hosts)),
            serial=serial,
            options={"unreachable": o.unreachable, "limit": o.limit, "max_fail": max_fail, **more},
            batches=batches_of(hosts, canary, serial),
        )
        return record.roll(roll_id)

    def _how(self, roll: Roll, hosts: Sequence[str]) -> str:
        """`, canary web1, then batches of 2 (record: ...)`: how a new roll of `hosts` goes."""
        first = hosts[: roll.canary]
        return (
            f", canary {', '.join(first)}" if first else ", no canary"
        ) + f", then batches of {roll.serial} (record: {self.record_path})"

    @property
    def noun(self) -> str:
        return "rollback" if self.options.rollback else "roll"

    def _begin_rollback(
        self, record: FleetRecord, target: Roll | None, hosts: Sequence[InventoryHost]
    ) -> Roll:
        """A new roll that puts back `target`'s touched hosts (TOUCHED): the last batch first,
        with the canary, approval and max-fail of a roll (the target's, unless given)."""
        if target is None:
            raise UsageError(
                f"no roll of {self.plan.name} to roll back (record: {self.record_path})"
            )
        if target.rollback_of is not None:
            raise UsageError(
                f"the latest roll, #{target.id}, is itself a rollback (of roll "
                f"#{target.rollback_of}, {target.state}): nothing is left to put back"
            )
        names = {h.name for h in hosts}
        rows = sorted(
            (r for r in record.hosts(target.id) if r.state in TOUCHED),
            key=lambda r: (-r.batch, r.position),
        )
        chosen = [r.host for r in rows if r.host in names]
        absent = [r.host for r in rows if r.host not in names]
        if not chosen:
            why = (
                "none of its hosts ran the plan" if not rows else "none of them is in the inventory"
            )
            raise UsageError(f"roll #{target.id} has no host to put back: {why}")
        o = self.options
        roll = self._new_roll(
            record,
            chosen,
            target.canary if o.canary is None else o.canary,
            o.serial or target.serial,
            o.max_fail or target.options.get("max_fail", MAX_FAIL),
            rollback_of=target.id,
        )
        if target.open:  # abandoned by new_roll, in the same transaction; now say why
            record.set_roll(target.id, "abandoned", f"rolled back by roll #{roll.id}")
        self.say(
            f"rollback #{roll.id} of roll #{target.id}: {len(chosen)} hosts, the last batch "
            f"first{self._how(roll, chosen)}"
        )
        if absent:
            self.say(f"  not in the inventory, left as they are: {', '.join(absent)}")
        return roll

    def _roll(
        self, record: FleetRecord, roll: Roll, inventory: dict[str, InventoryHost]
    ) -> RollSummary:
        """The roll's batches still to do, in one ansible-playbook: at each gate (fleet/ansible.py)
        the batch before is judged and the next begun, or the roll ends there."""
        rows = record.hosts(roll.id)
        left = [r for r in rows if r.state not in (DONE, "removed")]
        batches = [
            (number, todo)
            for number in sorted({r.batch for r in left})
            if (todo := [r.host for r in left if r.batch == number])
        ]
        hosts = [h for _, todo in batches for h in todo]
        held = record.held_files(hosts)
        self._argv = {h: _host_argv(inventory[h]) for h in hosts}
        payloads = {h: self._payload(roll, inventory[h], held.get(h, {})) for h in hosts}
        course = _Course(max_fail=roll.options.get("max_fail", MAX_FAIL))
        flight = course.flight

        def on_gate(number: int) -> bool:
            if flight.label:  # the batch before: its files sent again, orch installed, judged
                course.end = self._judged(record, roll, inventory, course)
            if course.end or self.stopping.is_set() or number == len(batches):
                return False
            batch, todo = batches[number]
            if roll.canary and batch > 0 and roll.approved_by is None:
                why = f"the canary passed ({', '.join(_batch(rows, 0))}): approve the roll"
                record.set_roll(roll.id, "awaiting_approval", why)
                msg = (
                    f"{why} with `orch fleet approve {self.plan_file}`, then `{roll.command}` again"
                )
                course.end = self._end(roll, "awaiting_approval", EXIT_WAITING, msg)
                return False
            flight.begin("canary" if roll.canary and batch == 0 else f"batch {batch}", batch, todo)
            self.say(f"{flight.label}: {', '.join(todo)}")
            record.start_hosts(roll.id, todo)
            return True

        def on_result(result: HostResult) -> None:
            self._answered(record, roll, flight, result)

        beats = _heartbeat(self.say, flight, self.stopping)
        with beats, self._progress(roll, flight, inventory):
            ended = run_roll(
                self.options.inventory,
                [todo for _, todo in batches],
                self._argv,
                payloads,
                on_gate,
                on_result,
                work=self.work,
                cancel=self.stopping.is_set,
            )
        if self.stopping.is_set():
            msg = "interrupted: the hosts' runs in flight go on there; run again to collect"
            record.set_roll(roll.id, "interrupted", msg)
            return self._end(roll, "interrupted", EXIT_INTERRUPTED, msg)
        if course.end:
            return course.end
        if flight.label:  # Ansible ended inside a batch: its silent hosts, then the batch judged
            for host in sorted(flight.hosts):
                why = f"Ansible ended without an answer: {ended}"
                self._answered(record, roll, flight, HostResult(host, True, None, "", "", why))
            if end := self._judged(record, roll, inventory, course):
                return end
        if ended:  # before a batch it had to run
            why = f"Ansible ended before the roll's end: {one_line(ended)}"
            record.set_roll(roll.id, "stopped", why)
            return self._end(roll, "stopped", EXIT_FAILED, f"roll stopped: {why}")
        if course.skipped or course.tolerated:
            parts = []
            if course.tolerated:
                parts.append(f"failed within --max-fail {course.max_fail}: "
                             + ", ".join(course.tolerated))  # fmt: skip
            if course.skipped:
                parts.append(f"unreachable, skipped: {', '.join(course.skipped)}")
            why = "; ".join(parts) + "; run again to try them"
            record.set_roll(roll.id, "stopped", why)
            return self._end(roll, "stopped", EXIT_FAILED, f"roll incomplete: {why}")
        record.set_roll(roll.id, "completed", None)
        return self._end(
            roll, "completed", EXIT_OK, f"{self.noun} #{roll.id} completed on every host"
        )

    def _judged(
        self,
        record: FleetRecord,
        roll: Roll,
        inventory: dict[str, InventoryHost],
        course: _Course,
    ) -> RollSummary | None:
        """The batch in flight, over: the files a host lacked sent whole, orch installed where
        it was refused (--install) and the plan sent again there; then judged: the roll's end
        when the batch stops it, None when the roll goes on."""
        flight = course.flight
        todo, label, number = flight.todo, flight.label, flight.number
        if flight.lacking and not self.stopping.is_set():
            self._send(record, roll, flight.lacking, inventory, whole=True)
        if self.options.install and not self.stopping.is_set():
            refused = [
                r.host for r in record.hosts(roll.id) if r.host in todo and r.state == "refused"
            ]
            installed = self._install(record, roll, refused, inventory) if refused else []
            if installed and not self.stopping.is_set():
                self._send(record, roll, installed, inventory)
        flight.over()
        if self.stopping.is_set():
            return None
        states = {r.host: r for r in record.hosts(roll.id) if r.host in todo}
        stopped = [h for h in todo if states[h].state in STOPPING]
        gone = [h for h in todo if states[h].state == "unreachable"]
        if gone and self.options.unreachable == "skip":
            course.skipped += gone
            self.say(f"  going on without {', '.join(gone)} (--unreachable skip)")
            gone = []
        failed = [h for h in stopped + gone if states[h].state != "waiting"]
        # The canary is there to stop the roll: no failure of it is ever tolerated.
        max_fail = course.max_fail
        allowed = 0 if roll.canary and number == 0 else failures_allowed(max_fail, len(todo))
        if failed and len(failed) == len(stopped + gone) and len(failed) <= allowed:
            course.tolerated += failed
            self.say(f"  going on without {', '.join(failed)}: within --max-fail {max_fail}")
            stopped, gone = [], []
        if not (stopped or gone):
            return None
        first = states[(stopped + gone)[0]]
        why = f"{first.host} {first.state}: {first.detail}"
        later = [r.host for r in record.hosts(roll.id) if r.batch > number]
        if len(failed) > allowed and max_fail != MAX_FAIL:  # over the limit: all named
            why = (f"{len(failed)} of {len(todo)} failed in {label}, over --max-fail "
                   f"{max_fail}: {', '.join(failed)}; first {why}")  # fmt: skip
        record.set_roll(roll.id, "stopped", why)
        msg = f"roll stopped: {why}" + (f"; not started: {', '.join(later)}" if later else "")
        waiting = all(states[h].state == "waiting" for h in stopped + gone)
        return self._end(roll, "stopped", EXIT_WAITING if waiting else EXIT_FAILED, msg)

    def _end(self, roll: Roll, state: str, code: int, message: str) -> RollSummary:
        return RollSummary(roll.id, state, code, message, self.record_path)

    # --- a batch -----------------------------------------------------------------------------

    def _answered(
        self,
        record: FleetRecord,
        roll: Roll,
        flight: _Flight,
        result: HostResult,
        whole: bool = False,
    ) -> None:
        """A host's result recorded (and said) as it comes; a host that lacks files sent by
        digest alone is kept for sending them whole, unless they were (`whole`)."""
        answer = read_answer(result.stdout)
        if isinstance(answer, Missing) and not whole:
            flight.lacking.append(result.host)
            self.say(f"  {result.host} lacks {len(answer.missing)} of the plan's files: sent")
            return
        state, detail, board = judge(result, self._argv[result.host][0], answer)
        files = answer.files if isinstance(answer, Ran) else None
        record.finish_host(roll.id, result.host, state, detail, board, files)
        flight.hosts.discard(result.host)
        took = _took(time.monotonic() - flight.started)
        self.say(f"  {result.host} {state} after {took}" + (f": {detail}" if detail else ""))

    def _send(
        self,
        record: FleetRecord,
        roll: Roll,
        hosts: Sequence[str],
        inventory: dict[str, InventoryHost],
        whole: bool = False,
    ) -> None:
        """The plan again to `hosts` of the batch in flight, in a play of its own (orch just
        installed there, or the files they lack sent whole), each answer recorded as it comes."""
        held = {} if whole else record.held_files(hosts)
        payloads = {h: self._payload(roll, inventory[h], held.get(h, {})) for h in hosts}
        record.start_hosts(roll.id, hosts)
        flight = _Flight()
        flight.begin("again", -1, hosts)
        run_command(
            self.options.inventory,
            hosts,
            {h: self._argv[h] for h in hosts},
            payloads,
            on_result=lambda result: self._answered(record, roll, flight, result, whole),
            work=self.work / "again",
            cancel=self.stopping.is_set,
        )
        if flight.lacking and not whole and not self.stopping.is_set():
            self._send(record, roll, flight.lacking, inventory, whole=True)

    def _progress(
        self, roll: Roll, flight: _Flight, inventory: dict[str, InventoryHost]
    ) -> AbstractContextManager[None]:
        """Every PROGRESS_S of a batch's run: its hosts still running asked, in one play, what
        their stores say now (fleet/progress.py), each answer put on the board; a batch that
        ends sooner is never asked. Its own connection to the record (another thread), its
        own folder for Ansible's files."""
        name = self.plan.name
        waiting = flight.hosts
        asked = [0.0]  # when last asked

        def ask(_: float) -> None:
            hosts = sorted(waiting)
            now = time.monotonic()
            if (
                not hosts
                or self.stopping.is_set()
                or now - max(flight.started, asked[0]) < PROGRESS_S
            ):
                return
            asked[0] = now
            argv = {
                h: [_host_argv(inventory[h])[0], "-P", "-m", "orchestrator.fleet.progress",
                    f"{inventory[h].vars.get('orch_home', DEFAULT_HOME)}/{name}/.orch/{name}.db"]
                for h in hosts
            }  # fmt: skip
            with closing(FleetRecord.open(self.record_path)) as record:

                def on_result(result: HostResult) -> None:
                    board = read_progress(result.stdout) if result.reached else None
                    if board and result.host in waiting:
                        record.note_progress(roll.id, result.host, board, progress_line(board))

                run_command(
                    self.options.inventory,
                    hosts,
                    argv,
                    dict.fromkeys(hosts, ""),
                    on_result=on_result,
                    work=self.work / "progress",
                    cancel=lambda: self.stopping.is_set() or not waiting,
                )

        return every(1.0, ask, "fleet-progress")

    def _install(
        self,
        record: FleetRecord,
        roll: Roll,
        hosts: Sequence[str],
        inventory: dict[str, InventoryHost],
    ) -> list[str]:
        """This orch on `hosts` (install.py); the hosts where it went in."""
        from orchestrator.fleet.ansible import run_play
        from orchestrator.fleet.install import install_tasks, wheelhouse

        self.say(f"  building orch {build_id()} as wheels for {', '.join(hosts)}")
        tar = wheelhouse(self.work)
        self.say(f"  installing it ({tar.stat().st_size / 2**20:.0f} MiB of wheels)")
        setup = {h: _install_vars(inventory[h]) for h in hosts}
        installed: list[str] = []
        flight = _Flight()
        flight.begin("install", -1, hosts)

        def on_result(result: HostResult) -> None:
            flight.hosts.discard(result.host)
            took = _took(time.monotonic() - flight.started)
            if result.reached and not result.failed:
                installed.append(result.host)
                self.say(f"  {result.host} has orch {build_id()} after {took}")
                return
            state = "unreachable" if not result.reached else "error"
            said = last_line(result.stderr) or last_line(result.msg)
            record.finish_host(roll.id, result.host, state, f"install failed: {said}")
            self.say(f"  {result.host} install failed after {took}: {said}")

        with _heartbeat(self.say, flight, self.stopping):
            run_play(
                self.options.inventory,
                hosts,
                install_tasks(tar),
                {"orch_install": setup},
                on_result,
                self.work,
                self.stopping.is_set,
            )
        return installed

    @property
    def work(self) -> Path:
        """Ansible's private files and the wheels: beside the record, the user's alone."""
        return self.record_path.with_suffix(".d")

    def _payload(self, roll: Roll, host: InventoryHost, held: dict[str, str]) -> str:
        import base64

        declared = set(self.plan.vars)
        host_vars = [f"{k}={json.dumps(v)}" for k, v in host.vars.items() if k in declared]
        doc = {
            "build": build_id(),  # this controller's, also on a roll begun by an older one
            "plan": {
                "name": self.plan.name,
                "file": self.plan_file.name,
                "files": entries(self.shipped, held),
            },
            "vars": host_vars + list(self.var_args),  # the command line's --var wins
            "home": str(host.vars.get("orch_home", DEFAULT_HOME)),
            "approve": list(self.options.approve),
            "wait_s": self.options.wait_s,
            "argv": [*roll.command.split(), self.plan_file.name, f"({self.noun} #{roll.id})"],
            "rollback": self.options.rollback,
        }
        return base64.b64encode(json.dumps(doc).encode()).decode()

    @contextmanager
    def _stoppable(self) -> Iterator[None]:
        """Ctrl-C, SIGTERM, SIGHUP: stop waiting after asking Ansible to cancel."""

        def stop(signum: int, frame: object) -> None:
            self.stopping.set()

        kept = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            yield
        finally:
            for s, handler in kept.items():
                signal.signal(s, handler)


def approve_roll(store: Path, note: str | None) -> Roll:
    """Approve the roll waiting after its canary, as the person running this."""
    from orchestrator.run.approvals import who

    record = FleetRecord.open(record_path(store))
    try:
        roll = next((r for r in record.rolls() if r.open), None)
        if roll is None or roll.state != "awaiting_approval":
            what = f"roll #{roll.id} is {roll.state}" if roll else "no roll is open"
            raise UsageError(f"nothing waits for approval: {what}")
        record.approve(roll.id, who(), note)
        return record.roll(roll.id)
    finally:
        record.close()


def judge(
    result: HostResult, python: str, answer: Answered | None = None
) -> tuple[str, str | None, list[BoardTask] | None]:
    """A host's state, a one-line detail and its board, from what Ansible brought back (and
    the answer in its stdout, when already read). The detail carries the host's (or
    Ansible's) words: escaped and cut here, once."""
    state, detail, board = _judge(result, python, answer or read_answer(result.stdout))
    return state, one_line(detail) if detail else None, board


def _judge(
    result: HostResult, python: str, answer: Answered | None
) -> tuple[str, str | None, list[BoardTask] | None]:
    if not result.reached:
        return "unreachable", last_line(result.msg) or "Ansible could not reach it", None
    if answer is None:
        said = last_line(result.stderr) or last_line(result.msg)
        # The shell found no such program: rc 127 and not a word on stdout.
        if result.rc == 127 and not result.stdout.strip():
            return "refused", f"no orch at {python} (set orch_venv, or install it)", None
        if "No module named" in said:
            return "refused", f"the orch at {python} has no fleet support: {said}", None
        return "error", said or f"exit code {result.rc} and no answer", None
    if isinstance(answer, Unreadable):  # counted as any failure: it stops the roll
        return (
            "failed",
            f"the host answered in a shape this controller cannot read: {answer.reason}",
            None,
        )
    if isinstance(answer, Refused):
        return "refused", answer.refused, None
    if isinstance(answer, Errored):
        return "error", last_line(answer.error), None
    if isinstance(answer, Missing):  # after they were sent whole
        return "error", f"the plan's files are not there once sent: {answer.missing[0]}", None
    board, code = answer.board, answer.result.exit_code
    if code == EXIT_OK:
        return "completed", _headline(board), board
    if code == EXIT_WAITING:
        gates = [t.id for t in board if t.status is Status.WAITING]
        return "waiting", f"at the plan's gate {', '.join(gates)}", board
    if code == EXIT_INTERRUPTED:
        return "failed", "its run was interrupted there", board
    failed = next((t for t in board if t.status is Status.FAILED), None)
    if failed is None:
        return "failed", f"its run ended {answer.result.outcome}", board
    error = last_line(failed.last_error or "")
    return "failed", f"at {failed.id}" + (f" ({error})" if error else ""), board


def _headline(board: Sequence[BoardTask]) -> str | None:
    """Two findings of the plan's latest task that has any (not of a compensation): what a
    person glances at first."""
    for task in reversed([t for t in board if not t.role]):
        shown = [_finding(f) for f in task.findings][:2]
        if shown:
            return f"{task.id}: " + ", ".join(shown)
    return None


def _finding(f: Finding) -> str:
    return f"{f.key}={f.value}" + (f" {f.unit}" if f.unit else "")


def _venv(host: InventoryHost) -> str:
    return str(host.vars.get("orch_venv", DEFAULT_VENV)).rstrip("/")


def _host_argv(host: InventoryHost) -> list[str]:
    return [f"{_venv(host)}/bin/python", "-P", "-m", "orchestrator.fleet.host"]


def _install_vars(host: InventoryHost) -> dict[str, str]:
    home = str(host.vars.get("orch_home", DEFAULT_HOME)).rstrip("/")
    return {
        "venv": _venv(host),
        "python": str(host.vars.get("orch_python", "python3")),
        "wheels": f"{home}/.wheels-{build_id()}",
    }


def _batch(rows: Sequence[Any], number: int) -> list[str]:
    return [r.host for r in rows if r.batch == number]


def _took(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _heartbeat(
    say: Callable[[str], None], flight: _Flight, stop: threading.Event
) -> AbstractContextManager[None]:
    """A line every 30 s naming the hosts still at work: a batch can take an hour."""

    def beat(_: float) -> None:
        names = sorted(flight.hosts)
        if names and not stop.is_set():
            more = f" and {len(names) - 8} more" if len(names) > 8 else ""
            took = _took(time.monotonic() - flight.started)
            say(f"  still running after {took}: {', '.join(names[:8])}{more}")

    return every(30, beat, "fleet-heartbeat")
