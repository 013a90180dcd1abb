"""orch's engine. What task authors import is listed in __all__.

Exports are loaded on first use (PEP 562), so `import orchestrator` costs nothing and
`orch status` never pays for pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time they load on first use
    from orchestrator.core.durations import parse_duration as parse_duration
    from orchestrator.core.errors import TaskError as TaskError
    from orchestrator.core.errors import TaskTimeout as TaskTimeout
    from orchestrator.core.findings import Finding as Finding
    from orchestrator.core.status import Status as Status
    from orchestrator.kinds.sections import Figure as Figure
    from orchestrator.kinds.sections import Section as Section
    from orchestrator.kinds.task import Argv as Argv
    from orchestrator.kinds.task import CheckResult as CheckResult
    from orchestrator.kinds.task import Context as Context
    from orchestrator.kinds.task import Duration as Duration
    from orchestrator.kinds.task import NoParams as NoParams
    from orchestrator.kinds.task import OptionValue as OptionValue
    from orchestrator.kinds.task import Pool as Pool
    from orchestrator.kinds.task import PoolUnavailable as PoolUnavailable
    from orchestrator.kinds.task import Precondition as Precondition
    from orchestrator.kinds.task import Task as Task

_EXPORTS = {
    "Task": "kinds.task",
    "Precondition": "kinds.task",
    "Context": "kinds.task",
    "Finding": "core.findings",
    "CheckResult": "kinds.task",
    "NoParams": "kinds.task",
    "Pool": "kinds.task",
    "PoolUnavailable": "kinds.task",
    "Duration": "kinds.task",
    "Argv": "kinds.task",
    "OptionValue": "kinds.task",
    "Section": "kinds.sections",
    "Figure": "kinds.sections",
    "TaskError": "core.errors",
    "TaskTimeout": "core.errors",
    "Status": "core.status",
    "parse_duration": "core.durations",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
