"""Approval gates: who let a `kind: approve` task pass, and whether that still holds.

An approval is recorded with two hashes: the plan's (every task's spec hash and needs, so a
changed command, param or dependency voids it; a comment or a title does not) and the findings
upstream of the gate (what the person saw when they approved). A gate passes only on an
approval whose two hashes match the plan and the findings of now; otherwise it waits, and says
why an earlier approval no longer counts.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.core.findings import Finding
from orchestrator.core.redact import MASK
from orchestrator.plan.model import Plan

if TYPE_CHECKING:
    from orchestrator.store.db import Store
    from orchestrator.store.rows import ApprovalRow

GATE_KIND = "approve"


def plan_hash(plan: Plan) -> str:
    tasks = sorted((t.id, t.spec_hash, sorted(t.spec.needs)) for t in [*plan.tasks, *plan.guards])
    return hashlib.sha256(json.dumps(tasks).encode()).hexdigest()[:16]


def findings_hash(plan: Plan, task_id: str, findings: Mapping[str, Sequence[Finding]]) -> str:
    """The findings of the gate's upstream tasks' latest attempts (notes by people and agents
    left out: a comment on the board is not a changed measurement)."""
    seen = [
        (t, f.key, repr(f.value), f.unit)
        for t in plan.upstream(task_id)
        for f in findings.get(t, ())
        if f.author is None
    ]
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:16]


def hashes(plan: Plan, task_id: str, store: Store) -> tuple[str, str]:
    """What an approval of the gate `task_id` is recorded with, and judged against: the plan's
    hash and that of the findings upstream of the gate."""
    return plan_hash(plan), findings_hash(plan, task_id, store.findings())


def who() -> str:
    """The person approving: the login name (SUDO_USER when run through sudo) at this host."""
    name = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{name}@{socket.gethostname()}"


@dataclass(frozen=True)
class Verdict:
    approval: ApprovalRow | None  # the approval that holds now
    void: str | None  # why the latest approval no longer holds


def judge(latest: ApprovalRow | None, plan_digest: str, findings_digest: str) -> Verdict:
    """Whether a gate's latest approval (`Store.latest_approval`) holds for this plan and these
    findings; an earlier one never does (the latest replaces it)."""
    if latest is None:
        return Verdict(None, None)
    if latest["plan_hash"] != plan_digest:
        why = "the plan changed since"
    elif latest["findings_hash"] != findings_digest:
        why = "the findings it was shown changed since"
    else:
        return Verdict(latest, None)
    return Verdict(None, f"the approval by {latest['by']} no longer holds: {why}")


SAME_OPTIONS = ("--var", "--vars-file", "--store")


def approve_command(gate: str, plan_file: str | None, argv: str | None) -> str:
    """`orch approve PLAN GATE`: the plan file as the run was given it, with the run's --var,
    --vars-file and --store options from its (masked) command line `argv`; a secret var's
    value, masked there, is named by a caveat instead."""
    import shlex  # only for a waiting gate: not on every `orch status`

    try:
        words = shlex.split(argv or "")
    except ValueError:
        words = []
    same: list[str] = []
    secret = False
    rest = iter(words)
    for word in rest:
        name, eq, given = word.partition("=")
        if name in SAME_OPTIONS and (value := given if eq else next(rest, None)) is not None:
            if MASK in value:
                secret = True
            else:
                same += [name, value]
    command = shlex.join(["orch", "approve", plan_file or "PLAN", gate, *same])
    return command + (" (and the run's secret --var values)" if secret else "")
