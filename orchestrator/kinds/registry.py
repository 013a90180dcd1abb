"""Where task and precondition kinds come from, in this order:

1. the engine's built-ins (`shell`, `python`, precondition `command`);
2. entry points: group `orch.tasks` / `orch.preconditions` (how `tasks/` and plugins register);
3. `module:Class`, a user's own class, importable from the plan's folder, the working directory
   or PYTHONPATH.

Entry points are loaded only for the kinds a plan names, so a plan pays for what it uses.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import did_you_mean
from orchestrator.kinds.task import Pool, Precondition, Task

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

TASK_GROUP = "orch.tasks"
PRECONDITION_GROUP = "orch.preconditions"
POOL_GROUP = "orch.pools"  # resources by id that tasks hold (GPUs): `resources: {gpus: 2}`

_BUILTINS: dict[str, dict[str, str]] = {
    TASK_GROUP: {
        "shell": "orchestrator.kinds.builtins:ShellTask",
        "python": "orchestrator.kinds.builtins:PythonTask",
        "approve": "orchestrator.kinds.builtins:ApproveTask",
    },
    PRECONDITION_GROUP: {
        "command": "orchestrator.kinds.builtins:CommandSucceeds",
    },
    POOL_GROUP: {},
}
_BASES: dict[str, type[Any]] = {
    TASK_GROUP: Task,
    PRECONDITION_GROUP: Precondition,
    POOL_GROUP: Pool,
}
_NOUNS = {TASK_GROUP: "task kind", PRECONDITION_GROUP: "precondition kind", POOL_GROUP: "pool"}


class UnknownKind(LookupError):
    """The message is the sentence the plan error shows."""


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points  # ~30 ms: only when a plan needs a plugin

    return {ep.name: ep for ep in entry_points(group=group)}


def known_kinds(group: str = TASK_GROUP) -> list[str]:
    return sorted({*_BUILTINS[group], *_entry_points(group)})


@cache
def resolve(kind: str, group: str = TASK_GROUP) -> type[Any]:
    """The class for `kind`; UnknownKind with a helpful sentence otherwise."""
    noun = _NOUNS[group]
    if kind in _BUILTINS[group]:
        cls = _import(_BUILTINS[group][kind])
    elif kind in _entry_points(group):
        try:
            cls = _entry_points(group)[kind].load()
        except Exception as exc:  # a broken plugin must not take the loader down
            raise UnknownKind(f"{noun} {kind!r} failed to load: {exc}") from None
    elif ":" in kind:
        try:
            cls = _import(kind)
        except Exception as exc:  # ImportError, AttributeError, or `:` alone (ValueError)
            raise UnknownKind(f"cannot import {noun} {kind!r}: {exc}") from None
    else:
        known = known_kinds(group)
        raise UnknownKind(
            f"unknown {noun} {kind!r}{did_you_mean(kind, known)}; known: "
            f"{', '.join(known)}, or module:Class"
        )
    base = _BASES[group]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UnknownKind(f"{kind!r} is not a subclass of orchestrator.{base.__name__}")
    return cls


@contextmanager
def search(folder: Path) -> Iterator[None]:
    """`module:Class` kinds and `module:function` targets are imported from `folder` (the
    plan's) first, while the block runs."""
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        with suppress(ValueError):
            sys.path.remove(str(folder))


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")  # module:Class from the working directory, like `python -m`
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
