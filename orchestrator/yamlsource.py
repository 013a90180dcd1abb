"""YAML loading that remembers where every value came from, so errors can name the line.

Input is bounded before anything is built (see `check_bounds`): a plan is small, hand-written
text, so the limits below are far above any real plan yet keep a hostile one (an alias bomb, a
10,000-deep list, a megabyte scalar) to a plan error in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import PlanError, PlanIssue

# The C loader is ~10x faster on large plans; the pure-Python one is the fallback.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Path_ = tuple[str | int, ...]

MAX_PLAN_BYTES = 1024 * 1024  # the repo's largest plan is ~5 KB
MAX_DEPTH = 32  # nested mappings/lists, aliases expanded; real plans nest 4-5 deep
MAX_VALUES = 100_000  # every key, value and item, each alias counted as all it stands for
MAX_SCALAR_CHARS = 64 * 1024  # one key or value: a long command still fits


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
        with path.open("rb") as f:  # read no more than the limit: the file may be /dev/zero
            raw = f.read(MAX_PLAN_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise PlanError([PlanIssue(file, None, f"cannot read the plan: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise PlanError([PlanIssue(file, None, "the plan is not UTF-8 text")]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise _too_large(file)
    return parse_yaml(text, file)


def parse_yaml(text: str, file: str) -> Located:
    """Parse plan text (bounded first); `file` names it in errors."""
    if len(text.encode()) > MAX_PLAN_BYTES:
        raise _too_large(file)
    try:
        check_bounds(text, file)
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
        raise PlanError(
            [
                PlanIssue(
                    file,
                    mark.line + 1 if mark else None,
                    f"YAML error: {exc.problem or exc.context}",
                )
            ]
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:  # `? [a, b]`, a self-referring alias
        raise PlanError([PlanIssue(file, None, f"unsupported YAML: {exc}")]) from None
    return located


def _too_large(file: str) -> PlanError:
    return PlanError(
        [
            PlanIssue(
                file,
                None,
                f"the plan is larger than {MAX_PLAN_BYTES >> 20} MiB"
                "; a plan is hand-written text, put data in files it names",
            )
        ]
    )


def check_bounds(text: str, file: str) -> None:
    """Refuse deep nesting, huge scalars and alias bombs from the event stream, before any
    node is built: libyaml's parser is iterative and this pass stops at the first excess, so
    time and memory stay bounded. Each anchor's expanded size and depth are kept, so an alias
    costs what it stands for without being expanded."""
    # Per open collection: [values in it, itself included; levels of nesting, itself included;
    # its anchor]. `anchors` holds the same for each finished anchor.
    stack: list[list[Any]] = []
    anchors: dict[str, tuple[int, int]] = {}
    total = 0

    def fail(event: yaml.Event, message: str) -> PlanError:
        mark = event.start_mark
        return PlanError([PlanIssue(file, mark.line + 1 if mark else None, message)])

    def count(event: yaml.Event, values: int, levels: int, alias: bool = False) -> None:
        nonlocal total
        total += values
        if total > MAX_VALUES:
            raise fail(
                event,
                f"the plan has more than {MAX_VALUES:,} values (an alias counts "
                "as all it stands for): is it an alias bomb?",
            )
        if len(stack) + levels > MAX_DEPTH:
            raise fail(
                event,
                f"nested more than {MAX_DEPTH} levels deep"
                + (" (aliases expanded)" if alias else ""),
            )

    def close(values: int, levels: int) -> None:
        if stack:
            stack[-1][0] += values
            stack[-1][1] = max(stack[-1][1], levels + 1)

    # Dispatch on the exact event class (the parsers make no subclasses): a plan is mostly
    # scalars, so theirs is the short path. get_event() returns None after the stream's end.
    loader = _Loader(text)
    try:
        while (event := loader.get_event()) is not None:
            kind = type(event)
            if kind is yaml.ScalarEvent:
                if len(event.value) > MAX_SCALAR_CHARS:
                    raise fail(
                        event,
                        f"a value of {len(event.value):,} characters; the limit is "
                        f"{MAX_SCALAR_CHARS:,} (put long text in a file)",
                    )
                # count(event, 1, 0) and close(1, 0), inlined: a scalar adds no level, and
                # the stack is never deeper than MAX_DEPTH (checked at each collection start)
                total += 1
                if total > MAX_VALUES:
                    count(event, 0, 0)  # raises
                if event.anchor is not None:
                    anchors[event.anchor] = (1, 0)
                if stack:
                    stack[-1][0] += 1
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                count(event, 1, 1)
                stack.append([1, 1, event.anchor])
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                values, levels, anchor = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (values, levels)
                close(values, levels)
            elif kind is yaml.AliasEvent:
                if any(frame[2] == event.anchor for frame in stack):
                    raise fail(event, f"alias *{event.anchor} refers to a value that contains it")
                if event.anchor in anchors:  # an undefined one is left to compose to report
                    count(event, *anchors[event.anchor], alias=True)
                    close(*anchors[event.anchor])
    finally:
        loader.dispose()


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


_scalar_constructor = yaml.SafeLoader("")
_STR = "tag:yaml.org,2002:str"


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
            # Text keys and values (most of a plan) inline: what _construct would return.
            if key_node.tag == _STR and type(key_node) is yaml.ScalarNode:
                key = key_node.value
            else:
                key = _construct(key_node, (*path, "<key>"), located)
            if key in result and key not in merged:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
            merged.discard(key)
            if value_node.tag == _STR and type(value_node) is yaml.ScalarNode:
                result[key] = value_node.value
            else:
                result[key] = _construct(value_node, (*path, key), located)
            # A value's line is its key's: a block mapping or list starts a line below it.
            located.lines[(*path, key)] = key_node.start_mark.line + 1
        located.lines.pop((*path, "<key>"), None)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*path, i), located) for i, child in enumerate(node.value)]
    if node.tag == _STR:  # most of a plan: the constructor would return the text as it is
        return node.value
    return _scalar_constructor.construct_object(node, deep=True)
