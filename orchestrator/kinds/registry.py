"""Where task and precondition kinds come from, in this order:

1. the engine's built-ins (`shell`, `python`, `approve`, precondition `command`);
2. entry points: group `orch.tasks` / `orch.preconditions` (how `tasks/` and plugins register);
3. `module:Class`, a user's own class, importable from the plan's folder, the working directory
   or PYTHONPATH.

Entry points are loaded only for the kinds a plan names, so a plan pays for what it uses.

Two namespaces, neither able to hide the other (a `tasks.py` beside a plan once hid orch's own
`tasks` package: "'tasks' is not a package"). Nothing here touches sys.path:

- orch's modules (built-ins, entry points: `tasks.host.gpus`, `probes.nvml`) are imported the normal
  way, with sys.path as the interpreter set it, so no file of the user's can stand in for them
  (`python -m orchestrator` drops the working directory Python puts first: __main__.py);
- a user's `module:Class` kind or `module:function` target (import_user) whose top-level module
  is a file or package in the plan's folder (then the working directory) is imported from there
  under a private parent package whose `__path__` is that folder: `tasks:MyTask` beside a plan is
  `orch_plan_<hash of the folder>.tasks`, never the top-level `tasks`. Only when no such file
  exists there is it imported by its own name (installed packages, PYTHONPATH).

The user's modules may import their siblings (`import helpers`, or `from . import helpers`):
while a plan is loaded or run (search), a finder placed after every other one on sys.meta_path
resolves a top-level name nothing else found to that folder's module, as the same module object
(`helpers` is `orch_plan_<hash>.helpers`: one copy of its state). Last, not first: sys.path's
end would not do, as an editable install's own finder comes after sys.path's; so a sibling named
like an installed module (`tasks`, `json`) gets the installed one, never the reverse.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from types import ModuleType
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


def resolve(kind: str, group: str = TASK_GROUP) -> type[Any]:
    """The class for `kind`; UnknownKind with a helpful sentence otherwise."""
    # A `module:Class` depends on the folders searched (two plans' `tasks:MyTask` differ).
    return _resolve(kind, group, where() if ":" in kind else ())


@cache
def _resolve(kind: str, group: str, folders: tuple[str, ...]) -> type[Any]:
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
            cls = import_user(kind)
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


_SEARCHED: list[str] = []  # the folders of the plans being loaded or run, innermost last
_PRIVATE = "orch_plan_"  # + a digest of the folder: the parent package of its modules


@contextmanager
def search(folder: Path) -> Iterator[None]:
    """While the block runs, a user's `module:Class` kinds and `module:function` targets are
    imported from `folder` (the plan's) first, and their sibling imports find its modules."""
    _install_finders()
    _SEARCHED.append(os.path.realpath(folder))
    try:
        yield
    finally:
        _SEARCHED.pop()


def where() -> tuple[str, ...]:
    """The folders a user's modules come from, in order: the plans' (innermost first), then
    the working directory (`orch run` works from the plan's folder: the same one)."""
    folders = list(reversed(_SEARCHED))
    with suppress(OSError):  # the working directory was removed: none
        folders.append(os.path.realpath(os.getcwd()))
    return tuple(dict.fromkeys(folders))


def _import(target: str) -> Any:
    """orch's own `module:attr`: the normal import, sys.path untouched."""
    module_name, _, attr = target.partition(":")
    return _attr(importlib.import_module(module_name), attr)


def import_user(target: str) -> Any:
    """A user's `module:Class` or `module:function`: from the first of where() holding its
    top-level module, under that folder's private package; else by its own name."""
    module_name, _, attr = target.partition(":")
    folder = _local(module_name.partition(".")[0], where())
    if folder is None:
        return _attr(importlib.import_module(module_name), attr)
    with search(Path(folder)):  # its sibling imports too, wherever it is imported from
        return _attr(importlib.import_module(f"{_package(folder)}.{module_name}"), attr)


def findable(module: str) -> bool:
    """Whether import_user would find the top-level module `module`, running none of it."""
    if _local(module, where()) is not None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a __spec__ (`__main__`): it is there
        return True


def _attr(obj: Any, attr: str) -> Any:
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _local(top: str, folders: Sequence[str]) -> str | None:
    """The first of `folders` holding module or package `top` (not a bare folder: a data
    directory named like a module is no namespace package of the plan's)."""
    if not top.isidentifier():
        return None
    for folder in folders:
        spec = importlib.machinery.PathFinder.find_spec(top, [folder])
        if spec is not None and spec.origin is not None:
            return folder
    return None


def _package(folder: str) -> str:
    """The private package whose `__path__` is `folder`, created (empty) at first use."""
    import hashlib  # OpenSSL: only for a plan with modules of its own

    name = _PRIVATE + hashlib.sha256(folder.encode()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [folder]
        sys.modules[name] = importlib.util.module_from_spec(spec)
    return name


class _Alias(importlib.abc.Loader):
    """Loads a name as the module already imported (or imported now) under another."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import set the alias's: the module keeps its own


_ALIASED: dict[str, str] = {}  # top-level name -> the private module it stands for


class _Siblings(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: a top-level name no other finder found, from the searched
    folders (a user module's `import helpers`), as that folder's private module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or not _SEARCHED:
            return None
        folder = _local(fullname, where())
        if folder is None:
            return None
        _ALIASED[fullname] = f"{_package(folder)}.{fullname}"
        return importlib.machinery.ModuleSpec(fullname, _Alias(_ALIASED[fullname]))


class _AliasedSubmodules(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: `helpers.sub` where `helpers` is an alias (_Siblings) is
    `orch_plan_<hash>.helpers.sub`, not a second copy. No other module has such a name: an
    alias is made only for a name nothing else provides."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top, dot, rest = fullname.partition(".")
        if not dot or top not in _ALIASED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"{_ALIASED[top]}.{rest}"))


_FINDERS = (_AliasedSubmodules(), _Siblings())


def _install_finders() -> None:
    first, last = _FINDERS
    if first not in sys.meta_path:
        sys.meta_path.insert(0, first)
    if last not in sys.meta_path:
        sys.meta_path.append(last)
