"""YAML loading that remembers where every value came from, so errors can name the line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import PlanError, PlanIssue

# The C loader is ~10x faster on large plans; the pure-Python one is the fallback.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Path_ = tuple[str | int, ...]


@dataclass
class Located:
    """Plain Python data plus the 1-based line of each path inside it."""

    data: Any
    file: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest located parent."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())

    def issue(self, path: Path_, message: str) -> PlanIssue:
        return PlanIssue(self.file, self.line(path), message)


def load_yaml(path: Path) -> Located:
    """Parse `path`; a syntax error becomes a PlanError naming file and line."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError([PlanIssue(file, None, f"cannot read the plan: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise PlanError([PlanIssue(file, None, "the plan is not UTF-8 text")]) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise PlanError([PlanIssue(file, line, f"YAML syntax error: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise PlanError([PlanIssue(file, None, f"YAML error: {exc}")]) from None
    located = Located(None, file)
    if node is None:
        return located
    located.lines[()] = node.start_mark.line + 1
    try:
        located.data = _construct(node, (), located)
    except _DuplicateKey as exc:
        raise PlanError([PlanIssue(file, exc.line, f"duplicate key {exc.key!r}")]) from None
    except yaml.MarkedYAMLError as exc:  # an unknown tag, `!!int abc`
        mark = exc.problem_mark or exc.context_mark
        raise PlanError([PlanIssue(file, mark.line + 1 if mark else None,
                                   f"YAML error: {exc.problem or exc.context}")]) from None
    except (TypeError, ValueError, RecursionError) as exc:  # `? [a, b]`, a self-referring alias
        raise PlanError([PlanIssue(file, None, f"unsupported YAML: {exc}")]) from None
    return located


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


_scalar_constructor = yaml.SafeLoader("")


def _construct(node: yaml.Node, path: Path_, located: Located) -> Any:
    located.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        merged: set[Any] = set()  # keys from `<<: *anchor`, which the mapping's own override
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # shallow, as YAML 1.1 says
                value = _construct(value_node, path, located)
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, dict):
                        new = {k: v for k, v in item.items() if k not in result}
                        result.update(new)
                        merged |= new.keys()
                continue
            key = _construct(key_node, (*path, "<key>"), located)
            if key in result and key not in merged:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
            merged.discard(key)
            result[key] = _construct(value_node, (*path, key), located)
            # A value's line is its key's: a block mapping or list starts a line below it.
            located.lines[(*path, key)] = key_node.start_mark.line + 1
        located.lines.pop((*path, "<key>"), None)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*path, i), located) for i, child in enumerate(node.value)]
    return _scalar_constructor.construct_object(node, deep=True)
