"""orch's engine. What task authors import is listed in __all__.

Exports are loaded on first use (PEP 562), so `import orchestrator` costs nothing and
`orch status` never pays for pydantic.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Task": "task", "Precondition": "task", "Context": "task", "Finding": "findings",
    "CheckResult": "task", "NoParams": "task", "TaskError": "errors", "TaskTimeout": "errors",
    "Status": "status", "parse_duration": "durations",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
