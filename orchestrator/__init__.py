"""orch's engine. What task authors import is listed in __all__.

Exports are loaded on first use (PEP 562), so `import orchestrator` costs nothing and
`orch status` never pays for pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time they load on first use
    from .durations import parse_duration as parse_duration
    from .errors import TaskError as TaskError
    from .errors import TaskTimeout as TaskTimeout
    from .findings import Finding as Finding
    from .status import Status as Status
    from .task import Argv as Argv
    from .task import CheckResult as CheckResult
    from .task import Context as Context
    from .task import Duration as Duration
    from .task import NoParams as NoParams
    from .task import Pool as Pool
    from .task import PoolUnavailable as PoolUnavailable
    from .task import Precondition as Precondition
    from .task import Task as Task

_EXPORTS = {
    "Task": "task",
    "Precondition": "task",
    "Context": "task",
    "Finding": "findings",
    "CheckResult": "task",
    "NoParams": "task",
    "Pool": "task",
    "PoolUnavailable": "task",
    "Duration": "task",
    "Argv": "task",
    "TaskError": "errors",
    "TaskTimeout": "errors",
    "Status": "status",
    "parse_duration": "durations",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
