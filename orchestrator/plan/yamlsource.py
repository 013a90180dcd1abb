"""YAML loading that remembers where every value came from, so errors can name the line.

Input is bounded as it is read (see `_read`): a plan is small, hand-written text, so the limits
below are far above any real plan yet keep a hostile one (an alias bomb, a 10,000-deep list, a
megabyte scalar) to a plan error in milliseconds, before anything big is built.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError

from orchestrator.core.errors import PlanError, PlanIssue
from orchestrator.core.files import MAX_PLAN_BYTES, not_a_file

# The C loader is ~10x faster on large plans; the pure-Python one is the fallback.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Path_ = tuple[str | int, ...]
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"

MAX_DEPTH = 32  # nested mappings/lists, aliases expanded; real plans nest 4-5 deep
MAX_VALUES = 100_000  # every key, value and item, each alias counted as all it stands for
MAX_SCALAR_CHARS = 64 * 1024  # one key or value: a long command still fits
# Events replayed for aliases while the text is read, before it is known to be within bounds
# (more are replayed in a second pass): an alias bomb is refused after about a millisecond.
MAX_EAGER_ALIAS_EVENTS = 2_000
SYNTAX_ERROR = "YAML syntax error: "
YAML_ERROR = "YAML error: "  # an unknown tag, `!!int abc`


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
    if (what := not_a_file(path)) is not None:  # a FIFO would be waited on forever
        raise PlanError([PlanIssue(file, None, f"the plan is {what}, not a file")])
    try:
        with path.open("rb") as f:  # read no more than the limit: the file may be /dev/zero
            raw = f.read(MAX_PLAN_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as exc:
        hint = _similar_file(path) if isinstance(exc, FileNotFoundError) else ""
        raise PlanError(
            [PlanIssue(file, None, f"cannot read the plan: {exc.strerror}{hint}")]
        ) from None
    except UnicodeDecodeError:
        raise PlanError([PlanIssue(file, None, "the plan is not UTF-8 text")]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise _too_large(file)
    return parse_yaml(text, file)


def _similar_file(path: Path) -> str:
    """'; did you mean plans/demo.yaml?' for a plan file misnamed (demo.yml, dmo.yaml)."""
    folder = path.parent
    try:
        names = [p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml")]
    except OSError:
        return ""
    stem = {p.rpartition(".")[0]: p for p in names}
    close = [stem[n] for n in difflib.get_close_matches(path.stem, stem, n=1, cutoff=0.75)]
    return f"; did you mean {folder / close[0]}?" if close else ""


def _at(text: str, mark: Any) -> str:
    """The character a YAML error mark points at ('' past the end)."""
    lines = text.splitlines()
    if mark.line >= len(lines):
        return ""
    row = lines[mark.line]
    return row[mark.column] if mark.column < len(row) else ""


def parse_yaml(text: str, file: str) -> Located:
    """Parse plan text (bounded as it is read); `file` names it in errors."""
    if len(text.encode()) > MAX_PLAN_BYTES:
        raise _too_large(file)
    try:
        builder = _Builder(expand=MAX_EAGER_ALIAS_EVENTS)
        _read(text, file, builder)
        if builder.deferred:  # aliases stand for more: built now that all is known in bounds
            builder = _Builder(expand=math.inf)
            _read(text, file, builder)
        if builder.composer_error is not None:
            raise builder.composer_error
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is not None and _at(text, mark) == "\t":  # the one character YAML never allows
            problem += " (a tab: YAML indents with spaces only)"
        raise PlanError([PlanIssue(file, line, SYNTAX_ERROR + problem)]) from None
    except yaml.YAMLError as exc:
        raise PlanError([PlanIssue(file, None, f"{YAML_ERROR}{exc}")]) from None
    try:
        if builder.error is not None:  # the first construction error, handled as it always was
            raise builder.error
    except _DuplicateKey as exc:
        raise PlanError([PlanIssue(file, exc.line, f"duplicate key {exc.key!r}")]) from None
    except yaml.MarkedYAMLError as exc:  # an unknown tag, `!!int abc`
        mark = exc.problem_mark or exc.context_mark
        raise PlanError(
            [
                PlanIssue(
                    file,
                    mark.line + 1 if mark else None,
                    f"{YAML_ERROR}{exc.problem or exc.context}",
                )
            ]
        ) from None
    except (TypeError, ValueError) as exc:  # `? [a, b]` (unhashable), `!!int abc`
        raise PlanError([PlanIssue(file, None, f"unsupported YAML: {exc}")]) from None
    return Located(builder.data, file, builder.lines)


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
    """Refuse deep nesting, huge scalars and alias bombs (see `_read`), building nothing."""
    _read(text, file, None)


def _read(text: str, file: str, builder: _Builder | None) -> None:
    """Read libyaml's event stream once, refusing deep nesting, huge scalars and alias bombs,
    and hand the events to `builder`. libyaml's parser is iterative and this pass stops at the
    first excess, so time and memory stay bounded; its recursive C composer is never used, so
    no nesting can overflow the C stack. Each anchor's expanded size and depth are kept, so an
    alias costs what it stands for without being expanded here."""
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
                if builder:
                    builder.scalar(event)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                count(event, 1, 1)
                stack.append([1, 1, event.anchor])
                if builder:
                    builder.start(event)
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                values, levels, anchor = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (values, levels)
                close(values, levels)
                if builder:
                    builder.end(event)
            elif kind is yaml.AliasEvent:
                if any(frame[2] == event.anchor for frame in stack):
                    raise fail(event, f"alias *{event.anchor} refers to a value that contains it")
                if event.anchor in anchors:  # an undefined one is left to the builder to report
                    count(event, *anchors[event.anchor], alias=True)
                    close(*anchors[event.anchor])
                if builder:
                    builder.alias(event)
            elif kind is yaml.DocumentStartEvent and builder:
                builder.document(event)
    finally:
        loader.dispose()


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


_safe: Any = yaml.SafeLoader("")  # its resolver and constructor, for one scalar at a time
_KEY = object()  # what a mapping being built expects next: a key,
_MERGING = object()  # or the value of a `<<` key (otherwise: the value of the key it holds)


class _Frame:
    """A collection being built, and where its lines go."""

    __slots__ = ("anchor", "data", "key", "key_line", "mark", "merged", "path", "tape_start")

    def __init__(self, data: dict[Any, Any] | list[Any] | None, path: Path_, mark: Any) -> None:
        self.data = data  # None: not built (a merge key and what is in it: see start)
        self.path = path
        self.mark = mark  # where it starts
        self.key: Any = _KEY
        self.key_line = 0
        self.merged: set[Any] | None = None  # keys from `<<: *anchor`, which its own override
        self.anchor: str | None = None  # its anchor, and where its events start on the tape
        self.tape_start = 0


class _Builder:
    """Plain data and the line of each path, built from the events as composing nodes and then
    constructing them did, without the nodes: a value's line is where it starts, except a
    mapping value's, which is its key's (a block value starts a line below); a merge key is
    shallow, as YAML 1.1 says, and the mapping's own keys override it. An alias is built again
    where it is used, from its anchor's events, which are kept on a tape, up to `expand` events
    in all; past that the builder stops, `deferred` (see parse_yaml).

    Errors wait for the end of the stream, so they come in the order they did: a syntax or
    bounds error anywhere first (_read raises it), then the first composer error (an undefined
    alias, a duplicate anchor, a second document), then the first construction error.

    Events are typed Any, as _read's loader gives them (their marks are always set)."""

    def __init__(self, expand: float) -> None:
        self.lines: dict[Path_, int] = {}
        self.expand = expand  # events replayed for aliases, at most
        self.deferred = False
        self.data: Any = None
        self.stack: list[_Frame] = []
        self.composer_error: yaml.MarkedYAMLError | None = None
        self.error: Exception | None = None  # the first construction error
        self.building = True  # until the first error, or until `deferred`
        self.defined: dict[str, Any] = {}  # anchor -> where it is
        self.root_mark: Any = None
        self.documents = 0
        self.tape: list[Any] = []  # the events of every anchored value (yaml.Event)
        self.spans: dict[str, tuple[int, int]] = {}  # anchor -> its events on the tape
        self.recording = 0  # anchored collections open
        self.tags: dict[str, str] = {}  # plain scalar -> its implicit tag (no path resolvers)

    # The events, from _read or replayed from the tape (whose anchors are not defined again).

    def scalar(self, event: Any, replayed: bool = False) -> None:
        if not replayed and (event.anchor is not None or self.recording):
            self._record(event)
        if not self.building:
            return
        frame = self.stack[-1] if self.stack else None
        if frame is not None and frame.data is None:
            return
        tag = event.tag
        if tag is None or tag == "!":
            if not event.implicit[0]:  # quoted
                tag = _STR
            elif (tag := self.tags.get(event.value)) is None:
                tag = _safe.resolve(yaml.ScalarNode, event.value, (True, False))
                self.tags[event.value] = tag
        mark = event.start_mark
        if frame is not None and isinstance(frame.data, dict) and frame.key is not _MERGING:
            if tag == _STR:  # most of a plan: text keys and values, whose line is the key's
                self._add(frame, event.value, mark)
                return
            if tag == _MERGE and frame.key is _KEY:
                frame.key = _MERGING
                return
        self.lines[self._path(frame, mark)] = mark.line + 1
        if tag == _STR:
            self._add(frame, event.value, mark)
            return
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            value = _safe.construct_object(node, deep=True)
            _safe.constructed_objects.clear()  # it keeps each by node: a leak in `orch mcp`
        except Exception as exc:  # raised when the stream has been read, as it was
            self._failed(exc)
            return
        self._add(frame, value, mark)

    def start(self, event: Any, replayed: bool = False) -> None:
        anchored = not replayed and event.anchor is not None
        if anchored or (not replayed and self.recording):
            self._record(event)
        if not self.building:
            return
        frame = self.stack[-1] if self.stack else None
        mark = event.start_mark
        if frame is not None and (
            frame.data is None or (event.tag == _MERGE and frame.key is _KEY)
        ):
            new = _Frame(None, (), mark)  # a merge key is not built, nor anything in it
        else:
            path = self._path(frame, mark)
            self.lines[path] = mark.line + 1
            new = _Frame({} if type(event) is yaml.MappingStartEvent else [], path, mark)
        if anchored:
            new.anchor, new.tape_start = event.anchor, len(self.tape) - 1
            self.recording += 1
        self.stack.append(new)

    def end(self, event: Any, replayed: bool = False) -> None:
        if not self.building:
            return
        if not replayed and self.recording:
            self.tape.append(event)
        frame = self.stack.pop()
        if frame.anchor is not None:
            self.spans[frame.anchor] = (frame.tape_start, len(self.tape))
            self.recording -= 1
        parent = self.stack[-1] if self.stack else None
        if frame.data is None:
            if parent is not None and parent.data is not None:  # it was a merge key
                parent.key = _MERGING
        else:
            if isinstance(frame.data, dict):
                self.lines.pop(frame.path + ("<key>",), None)
            self._add(parent, frame.data, frame.mark)

    def alias(self, event: Any, replayed: bool = False) -> None:
        if not replayed and self.composer_error is None and event.anchor not in self.defined:
            self._composer_failed(
                ComposerError(None, None, "found undefined alias", event.start_mark)
            )
        if not self.building:
            return
        if not replayed and self.recording:
            self.tape.append(event)
        start, end = self.spans[event.anchor]
        if end - start > self.expand:
            self.deferred, self.building = True, False
            return
        self.expand -= end - start
        for replay in self.tape[start:end]:  # build the anchor's value again, here
            kind = type(replay)
            if kind is yaml.ScalarEvent:
                self.scalar(replay, replayed=True)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                self.start(replay, replayed=True)
            elif kind is yaml.AliasEvent:
                self.alias(replay, replayed=True)
            else:
                self.end(replay, replayed=True)
            if not self.building:
                return

    def document(self, event: Any) -> None:
        self.documents += 1
        if self.documents > 1 and self.composer_error is None:
            self._composer_failed(
                ComposerError(
                    "expected a single document in the stream",
                    self.root_mark,
                    "but found another document",
                    event.start_mark,
                )
            )

    def _record(self, event: Any) -> None:
        """The composer's part of a value or collection start read: its anchor, the tape."""
        anchor = event.anchor
        if anchor is not None:
            self._define(anchor, event.start_mark)
        if self.building:
            if anchor is not None and type(event) is yaml.ScalarEvent:
                self.spans[anchor] = (len(self.tape), len(self.tape) + 1)
            self.tape.append(event)

    def _define(self, anchor: str, mark: Any) -> None:
        if self.composer_error is None and anchor in self.defined:
            self._composer_failed(
                ComposerError(
                    "found duplicate anchor; first occurrence",
                    self.defined[anchor],
                    "second occurrence",
                    mark,
                )
            )
        self.defined.setdefault(anchor, mark)

    def _composer_failed(self, error: yaml.MarkedYAMLError) -> None:
        self.composer_error = error
        self.building = False

    def _failed(self, error: Exception) -> None:
        self.error = error
        self.building = False

    def _path(self, frame: _Frame | None, mark: Any) -> Path_:
        """Where the value starting now goes (a text key or value needs none: see scalar)."""
        if frame is None:
            self.root_mark = mark
            return ()
        if isinstance(frame.data, list):
            return frame.path + (len(frame.data),)
        if frame.key is _KEY:
            return frame.path + ("<key>",)
        if frame.key is _MERGING:
            return frame.path
        return frame.path + (frame.key,)

    def _add(self, frame: _Frame | None, value: Any, mark: Any) -> None:
        """Put a finished value where it goes; `mark` is where it starts."""
        if frame is None:
            self.data = value
        elif isinstance(frame.data, list):
            frame.data.append(value)
        elif frame.key is _KEY:
            assert frame.data is not None  # nothing is added to what is not built
            try:  # TypeError: an unhashable key
                if value in frame.data and (frame.merged is None or value not in frame.merged):
                    raise _DuplicateKey(str(value), mark.line + 1)
            except (_DuplicateKey, TypeError) as exc:
                self._failed(exc)
                return
            if frame.merged is not None:
                frame.merged.discard(value)
            frame.key, frame.key_line = value, mark.line + 1
        elif frame.key is _MERGING:
            assert frame.data is not None
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    new = {k: v for k, v in item.items() if k not in frame.data}
                    frame.data.update(new)
                    frame.merged = (frame.merged or set()) | new.keys()
            frame.key = _KEY
        else:
            assert frame.data is not None
            frame.data[frame.key] = value
            self.lines[frame.path + (frame.key,)] = frame.key_line
            frame.key = _KEY
