"""parse_yaml builds plain data and lines in one pass over libyaml's events. It must give what
the bounds pass, yaml.compose and construction of the nodes gave before (`reference` below,
kept as the oracle): the same data, the same line for every path, the same first error."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import PlanError, PlanIssue
from orchestrator.plan import yamlsource
from orchestrator.plan.yamlsource import Located, Path_, check_bounds, parse_yaml

# --- the oracle: loading as it was, through yaml's nodes ----------------------------------------

_STR, _MERGE = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"
_constructor = yaml.SafeLoader("")


class _Duplicate(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


def _construct(node: yaml.Node, path: Path_, located: Located) -> Any:
    located.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        merged: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                value = _construct(value_node, path, located)
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, dict):
                        new = {k: v for k, v in item.items() if k not in result}
                        result.update(new)
                        merged |= new.keys()
                continue
            if key_node.tag == _STR and type(key_node) is yaml.ScalarNode:
                key = key_node.value
            else:
                key = _construct(key_node, (*path, "<key>"), located)
            if key in result and key not in merged:
                raise _Duplicate(str(key), key_node.start_mark.line + 1)
            merged.discard(key)
            if value_node.tag == _STR and type(value_node) is yaml.ScalarNode:
                result[key] = value_node.value
            else:
                result[key] = _construct(value_node, (*path, key), located)
            located.lines[(*path, key)] = key_node.start_mark.line + 1
        located.lines.pop((*path, "<key>"), None)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*path, i), located) for i, child in enumerate(node.value)]
    if node.tag == _STR:
        return node.value
    return _constructor.construct_object(node, deep=True)


def reference(text: str, file: str) -> Located:
    def error(line: int | None, message: str) -> PlanError:
        return PlanError([PlanIssue(file, line, message)])

    try:
        check_bounds(text, file)
        node = yaml.compose(text, Loader=yaml.CSafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise error(mark.line + 1 if mark else None, f"YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise error(None, f"YAML error: {exc}") from None
    located = Located(None, file)
    if node is None:
        return located
    try:
        located.data = _construct(node, (), located)
    except _Duplicate as exc:
        raise error(exc.line, f"duplicate key {exc.key!r}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise error(
            mark.line + 1 if mark else None, f"YAML error: {exc.problem or exc.context}"
        ) from None
    except (TypeError, ValueError) as exc:
        raise error(None, f"unsupported YAML: {exc}") from None
    return located


def outcome(parse: Any, text: str) -> tuple[Any, ...]:
    """What a parse gives, comparable: repr keeps 1, 1.0, True and NaN apart."""
    try:
        located = parse(text, "p.yaml")
    except PlanError as exc:
        return ("plan error", [(i.file, i.line, i.message) for i in exc.issues])
    except Exception as exc:  # the same crash, if any (`!!timestamp x`)
        return ("exception", type(exc).__name__, str(exc))
    return ("ok", repr(located.data), repr(sorted(located.lines.items(), key=repr)))


# --- YAML with the features that take their own paths: anchors, aliases, merges, tags, odd keys
# `&@` and `*@` are numbered by documents(): mostly an alias of an anchor written before it.

SCALARS = [
    *["a", "t0", "1", "0x1f", "1.5", ".nan", "~", "null", "yes", "2024-01-02", "''", "'q'"],
    *['"<<"', "<<", "<key>", "'<key>'", "=", "! 12", "! '12'", "!!str 1", "!!int 3"],
    *["!!int x", "!foo x", "!!binary aGk=", "!!merge x", "!!timestamp x", "*@", "*@"],
]
KEYS = [
    *["k", "k", "x", "y", "<<", "<<", "'<<'", "!!merge <<", "1", "~", "true", "<key>"],
    *["'<key>'", "!!merge [a]", "*@ ", "&@ <<", "&@ k"],
]
FLOW_KEYS = [*KEYS, "[a]", "{a: 1}"]
ANCHORS = st.sampled_from(["", "", "", "&@ "])


def flow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    seq = st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
    pairs = st.lists(st.tuples(st.sampled_from(FLOW_KEYS), children), max_size=4)
    mapping = pairs.map(lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}")
    return st.tuples(ANCHORS, seq | mapping).map("".join)


LEAVES = st.tuples(ANCHORS, st.sampled_from(SCALARS)).map(
    lambda pair: pair[1] if pair[1] == "*@" else "".join(pair)  # an alias has no anchor
)
VALUES = st.recursive(LEAVES, flow, max_leaves=12)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A block mapping of flow values and nested block mappings, on many lines."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            lines.append(f"{key}: {draw(VALUES)}")
        else:
            lines.append(f"{key}: {draw(ANCHORS)}".rstrip())
            for _ in range(draw(st.integers(1, 3))):
                lines.append(f"  {draw(st.sampled_from(KEYS))}: {draw(VALUES)}")
    if draw(st.integers(0, 9)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["---", "]", "- x"])))
    text, anchors = "\n".join(lines) + "\n", 0
    rarely = st.sampled_from([False] * 30 + [True])
    while "@" in text:
        at = text.index("@")
        if text[at - 1] == "&" and not draw(rarely):  # rarely a duplicate anchor
            anchors += 1
            name = f"a{anchors}"
        else:  # an anchor written before, rarely a0 (undefined)
            name = f"a{draw(st.integers(0 if draw(rarely) else min(anchors, 1), anchors))}"
        text = text[:at] + name + text[at + 1 :]
    return text


@pytest.mark.parametrize("eager", [yamlsource.MAX_EAGER_ALIAS_EVENTS, 5, 0])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=documents())
def test_parse_yaml_gives_what_composing_and_constructing_gave(eager: int, text: str) -> None:
    """Also when aliases are built in a second pass (`eager` events replayed in the first)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yamlsource, "MAX_EAGER_ALIAS_EVENTS", eager)
        assert outcome(parse_yaml, text) == outcome(reference, text)


# --- the same, case by case ------------------------------------------------------------------


def parsed(text: str) -> Located:
    return parse_yaml(textwrap.dedent(text).lstrip("\n"), "p.yaml")


def test_an_alias_is_a_copy_with_the_anchors_lines() -> None:
    """An alias is built anew where it is used; its inner lines are the anchor's, its own is
    its key's (line 3), as each use of a node was constructed before."""
    located = parsed("""
        a: &x
          k: [1, 2]
        b: *x
    """)
    assert located.data == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}}
    assert located.data["b"] is not located.data["a"]
    assert located.data["b"]["k"] is not located.data["a"]["k"]
    assert located.lines[("b",)] == 3
    assert located.lines[("b", "k")] == located.lines[("b", "k", 1)] == 2


def test_a_merge_key_gives_its_keys_and_their_lines() -> None:
    located = parsed("""
        base: &b {kind: shell, timeout: 5s}
        task:
          <<: *b
          kind: python
    """)
    assert located.data["task"] == {"kind": "python", "timeout": "5s"}
    assert located.lines[("task", "kind")] == 4
    assert located.lines[("task", "timeout")] == 1


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        # a syntax error anywhere comes before a duplicate key
        ("a: 1\na: 2\nb: [\n", 4, "YAML syntax error"),
        # and so does a composer error: an undefined alias, a second document
        ("a: 1\na: 2\nb: *nowhere\n", 3, "YAML syntax error: found undefined alias"),
        ("a: 1\na: 2\n--- x\n", 3, "YAML syntax error: but found another document"),
        # then the first construction error
        ("a: !!int x\na: 2\n", None, "unsupported YAML: invalid literal"),
        ("a: 1\na: !!int x\n", 2, "duplicate key 'a'"),
    ],
)
def test_errors_come_in_the_order_they_did(text: str, line: int | None, message: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_yaml(text, "p.yaml")
    [issue] = info.value.issues
    assert issue.line == line and issue.message.startswith(message), issue
    assert outcome(parse_yaml, text) == outcome(reference, text)


def test_aliases_that_stand_for_much_are_built_in_a_second_pass() -> None:
    """Past MAX_EAGER_ALIAS_EVENTS the first pass only checks; the second builds it all."""
    items = ", ".join(str(i) for i in range(100))
    uses = "".join(f"u{i}: *big\n" for i in range(30))
    text = f"big: &big [{items}]\n{uses}"
    located = parse_yaml(text, "p.yaml")
    assert located.data["u29"] == list(range(100)) and located.lines[("u29",)] == 31
    assert outcome(parse_yaml, text) == outcome(reference, text)
    text += "u0: 1\n"  # an error found by the second pass
    assert outcome(parse_yaml, text) == outcome(reference, text)
    assert outcome(parse_yaml, text)[:2] == ("plan error", [("p.yaml", 32, "duplicate key 'u0'")])


def test_an_alias_bomb_is_refused_before_much_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Aliases are built as they are read only up to MAX_EAGER_ALIAS_EVENTS: the bomb (a
    billion values) is refused by the bounds after no more than that was replayed."""
    lines = ["l0: &l0 [a, a, a, a, a, a, a, a, a]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    built = 0
    scalar = yamlsource._Builder.scalar

    def counted(builder: Any, event: Any, replayed: bool = False) -> None:
        nonlocal built
        built += replayed
        scalar(builder, event, replayed)

    monkeypatch.setattr(yamlsource._Builder, "scalar", counted)
    with pytest.raises(PlanError, match="alias bomb"):
        parse_yaml("\n".join(lines) + "\n", "p.yaml")
    assert 0 < built <= yamlsource.MAX_EAGER_ALIAS_EVENTS


def test_typed_scalars_leave_nothing_behind() -> None:
    """The shared constructor forgets what it built (it keeps each value by its node): a
    long-lived process (`orch mcp`) that loads plans again and again does not grow."""
    for _ in range(3):
        parse_yaml("a: 1\nb: 2.5\nc: true\nd: 2026-12-04\ne: null\n", "plan.yaml")
    assert not yamlsource._safe.constructed_objects
