"""What a task starts with: its `${...}` references resolved, and its preconditions checked.

Both look at the world as it is when the task is about to start: vars, the findings upstream
tasks recorded, the host (a precondition may wait for it, up to its `wait`). A reference that
cannot be resolved, or would reach a process as more than data, is a TemplateError (the task
fails); a precondition that does not hold is what was found (the task is blocked).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.core.errors import TemplateError
from orchestrator.plan.model import Plan, PlannedCheck, PlannedTask
from orchestrator.plan.templating import Ref, resolve, splices
from orchestrator.plan.trust import choosing_code
from orchestrator.proc.interrupts import nap
from orchestrator.run.confine import confine
from orchestrator.store.db import Store

NOTE_EVERY_S = 10.0  # while a precondition waits, say so this often


class Checks:
    """Params and preconditions of the plan's tasks, resolved against the store of this run.

    `log_dir` is the run's folder of task logs: its parent (orch's folder of run logs and
    results) is, with the plan's folder, where a path built from a finding may lead (confine)."""

    def __init__(self, plan: Plan, store: Store, log_dir: Path, log: Any) -> None:
        self.plan, self.store, self.log_dir, self.log = plan, store, log_dir, log
        self.home = plan.file.absolute().parent  # where the plan's relative paths start

    def lookup(self, ref: Ref) -> Any:
        """The value of a ${...} reference, now."""
        if ref.task is None:
            return self.plan.vars[ref.name]
        found = self.store.finding(ref.task, ref.name)
        if found is None:
            have = ", ".join(sorted(f.key for f in self.store.findings().get(ref.task, [])))
            raise TemplateError(
                f"${{{ref}}}: task {ref.task!r} recorded no finding "
                f"{ref.name!r} (it has: {have or 'none'})"
            )
        return found.value

    def resolve_params(self, cls: type[Any], params: dict[str, Any]) -> dict[str, Any]:
        """Params with their ${...} resolved; TemplateError where a finding would reach a
        process as more than data (trust.py), a value cannot be text where it must be, or a
        path built from a finding leaves its folder."""
        if chosen := choosing_code(cls, params):  # a task added through the store too
            raise TemplateError("; ".join(f"param {key!r}: {why}" for key, why in chosen))
        as_text = splices(cls, params)
        resolved = {}
        for k, v in params.items():
            try:
                resolved[k] = resolve(v, self.lookup, as_text.get(k))
            except TemplateError as exc:
                raise TemplateError(f"param {k!r}: {exc}") from None
        for k in cls.path_params & params.keys():
            confine(k, params[k], resolved[k], (self.home, self.log_dir.parent), self.lookup)
        return resolved

    def check_preconditions(self, task: PlannedTask) -> str | None:
        """None if every precondition holds (waiting where asked), else what was found."""
        if task.checks:
            self.store.flush()  # a check looks at the host, and may wait
        for check in task.checks:
            if (problem := self.check_one(task, check)) is not None:
                return problem
        return None

    def check_one(self, task: PlannedTask, check: PlannedCheck) -> str | None:
        try:
            params = check.cls.Params.model_validate(self.resolve_params(check.cls, check.params))
        except TemplateError:
            raise
        except Exception as exc:
            return f"precondition {check.kind}: {exc}"
        probe = check.cls(params)
        started = time.monotonic()
        deadline = started + (check.wait or 0.0)
        next_note = started + NOTE_EVERY_S
        while True:
            try:
                result = probe.check()
            except Exception as exc:  # a bug in a check blocks its task, not the whole run
                return f"precondition {check.kind} crashed: {type(exc).__name__}: {exc}"
            if result.ok:
                return None
            now = time.monotonic()
            if now >= deadline:
                waited = f" after waiting {now - started:.0f}s" if check.wait else ""
                return f"precondition {check.kind} failed{waited}: {result.found}"
            if now >= next_note:
                self.log.info(
                    "task.waiting",
                    task=task.id,
                    check=check.kind,
                    waited=f"{now - started:.0f}s",
                    found=result.found,
                )
                next_note = now + NOTE_EVERY_S
            nap(min(check.every, max(deadline - now, 0.0)))
