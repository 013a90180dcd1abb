"""Functions and classes used by test plans through `python` tasks and `module:Class` kinds."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from orchestrator import CheckResult, Context, Precondition, Section, Task
from orchestrator.core.findings import Finding


def measure(ctx: Context, tokens: int) -> dict[str, float]:
    ctx.finding("accept_rate", 0.42, "ratio", "no speedup")
    return {"tokens": tokens, "throughput": tokens / 2}


def noop() -> None:
    """Does nothing: a step that is done at once, in orch's own process."""


def boom() -> None:
    raise RuntimeError("kaboom in user code")


class GreetParams(BaseModel):
    name: str
    times: int = 1


class Greet(Task[GreetParams]):
    """A user's own task kind, loaded as `helpers_tasks:Greet`."""

    Params = GreetParams

    def run(self, ctx: Context) -> None:
        ctx.finding("greeting", f"hello {self.params.name}" * self.params.times)


class BrokenCheck(Precondition):  # type: ignore[type-arg]
    """A precondition with a bug in it."""

    def check(self) -> CheckResult:
        raise ZeroDivisionError("division by zero in the check")


def flags() -> dict[str, bool | int]:
    return {"changed": True, "cached": False, "count": 1}


class FindingsSink:
    """The findings a task records, by key: the executor's part of a Context, without a store
    (for driving a kind's `record` in-process)."""

    def __init__(self) -> None:
        self.found: dict[str, Finding] = {}

    def finding(self, finding: Finding) -> None:
        self.found[finding.key] = finding

    def process_started(self, pgid: int, started_at: float) -> None: ...
    def progress(self, message: str) -> None: ...
    def hold(self, name: str, data: dict[str, Any]) -> None: ...
    def held(self, name: str) -> dict[str, Any] | None:
        return None

    def release(self, name: str) -> None: ...
    def stalled(self, report: object) -> None: ...


class Reported(Task):  # type: ignore[type-arg]
    """Records a finding; its report section says so (`orch report`'s failures tests)."""

    def run(self, ctx: Context) -> None:
        ctx.finding("reported", 1)

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        return [Section("Reported fine", notes=("the healthy section",))]


class BrokenReport(Reported):
    """Its report raises, quoting a secret it read and some markup."""

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        raise RuntimeError(f"<b>no</b> access with {os.environ['ORCH_TEST_TOKEN']}")


class GarbageReport(Reported):
    """Its report returns something that is not Sections."""

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        return "not sections"  # type: ignore[return-value]


class AnswerParams(BaseModel):
    verdict: str


class Answered(Task[AnswerParams]):
    """Records a verdict; its report section, under a heading every task of the kind shares,
    gives the verdict as its headline: the answer `orch report`'s page opens with."""

    Params = AnswerParams

    def run(self, ctx: Context) -> None:
        ctx.finding("verdict", self.params.verdict)

    @classmethod
    def report(cls, findings: Mapping[str, Finding]) -> Sequence[Section]:
        verdict = findings["verdict"].value
        return [
            Section(
                "Analysis: baseline and candidates",
                notes=(f"the details behind {verdict}",),
                headline=(f"verdict: {verdict}", "capacity: 12 req/s"),
            )
        ]
