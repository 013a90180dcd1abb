"""`${vars.x}` and `${tasks.<id>.findings.<key>}` in params and `when`.

References are found when the plan loads (so an unknown var or task is a plan error) and
resolved when the task starts (so a finding recorded a minute ago is seen). `$${` writes a
literal `${`. A value spliced into a shell command is quoted with shlex.quote, so findings and
vars never reach a shell as code.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import TemplateError

_TEMPLATE = re.compile(r"\$(\$?)\{([^}]*)\}")
_VAR = re.compile(r"vars\.([A-Za-z_][A-Za-z0-9_]*)")
_FINDING = re.compile(r"tasks\.([A-Za-z0-9_.-]+?)\.findings\.([A-Za-z0-9_.-]+)")


@dataclass(frozen=True)
class Ref:
    """One `${...}` reference: a var (`task` is None) or a finding of a task."""

    name: str
    task: str | None = None

    def __str__(self) -> str:
        return f"tasks.{self.task}.findings.{self.name}" if self.task else f"vars.{self.name}"


def parse_ref(text: str) -> Ref:
    """The reference inside `${...}`; ValueError with a plain sentence otherwise."""
    text = text.strip()
    if m := _VAR.fullmatch(text):
        return Ref(m.group(1))
    if m := _FINDING.fullmatch(text):
        return Ref(m.group(2), m.group(1))
    raise ValueError(
        f"'${{{text}}}' is not a reference: use ${{vars.NAME}} or ${{tasks.ID.findings.KEY}}"
    )


def iter_refs(value: Any) -> Iterator[Ref]:
    """Every reference in a nested value; ValueError on a malformed one."""
    if isinstance(value, str):
        for m in _TEMPLATE.finditer(value):
            if not m.group(1):
                yield parse_ref(m.group(2))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from iter_refs(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from iter_refs(item)


Lookup = Callable[[Ref], Any]


def resolve(value: Any, lookup: Lookup, quote: bool = False) -> Any:
    """`value` with every reference replaced by lookup(ref).

    A string that is exactly one reference takes the referenced value's own type (a port stays
    an int); inside a longer string the value is formatted, and shell-quoted when `quote`.
    """
    if isinstance(value, str):
        m = _TEMPLATE.fullmatch(value)
        if m and not m.group(1) and not quote:
            return lookup(parse_ref(m.group(2)))

        def splice(m: re.Match[str]) -> str:
            if m.group(1):
                return "${" + m.group(2) + "}"
            text = _format(lookup(parse_ref(m.group(2))))
            return shlex.quote(text) if quote else text

        return _TEMPLATE.sub(splice, value)
    if isinstance(value, Mapping):
        return {k: resolve(v, lookup, quote) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(v, lookup, quote) for v in value]
    return value


_HEREDOC = re.compile(r"<<(-?)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def quoted_refs(command: str) -> list[str]:
    """References written inside '...', "..." or an unquoted heredoc in a shell command.

    resolve() shell-quotes each value; inside quotes that quoting is undone ("'$(x)'" runs x),
    and in a heredoc body the quotes are literal text and $(...) still runs, so such a
    reference is refused when the plan loads. Comments are skipped.
    """
    found: list[str] = []
    quote, i, heredocs = "", 0, []
    while i < len(command):
        c = command[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if not quote and c == "#" and (i == 0 or command[i - 1] in " \t\n;&|("):
            i = _line_end(command, i)  # a comment: its apostrophes are not quotes
            continue
        if (not quote and not command.startswith("<<<", i)
                and (m := _HEREDOC.match(command, i))):
            heredocs.append((m.group(3), bool(m.group(2)), bool(m.group(1))))
            i = m.end()
            continue
        if not quote and c == "\n" and heredocs:
            for delimiter, literal, dash in heredocs:  # bodies follow the line, in order
                start = i + 1
                i = _heredoc_end(command, start, delimiter, dash)
                if not literal:
                    found += [m.group(0) for m in _TEMPLATE.finditer(command[start:i])
                              if not m.group(1)]
            heredocs = []
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        elif quote and command.startswith("${", i) and not command.startswith("$${", i - 1):
            end = command.find("}", i)
            found.append(command[i : end + 1 if end >= 0 else len(command)])
        i += 1
    return found


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _heredoc_end(text: str, start: int, delimiter: str, dash: bool) -> int:
    """Where the heredoc body that starts at `start` ends (at its delimiter line)."""
    i = start
    while i < len(text):
        end = _line_end(text, i)
        line = text[i:end].lstrip("\t") if dash else text[i:end]
        if line == delimiter:
            return i - 1 if i > start else i
        i = end + 1
    return len(text)


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- `when` conditions ---------------------------------------------------------------------

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def compile_when(expr: str) -> tuple[ast.Expression, list[Ref]]:
    """Parse a `when` condition; references become names `_ref0`, `_ref1`, ...

    Only literals, comparisons, `and`/`or`/`not` and references are allowed: a condition is
    data, never code. ValueError with a plain sentence otherwise.
    """
    refs: list[Ref] = []

    def placeholder(m: re.Match[str]) -> str:
        refs.append(parse_ref(m.group(2)))
        return f"_ref{len(refs) - 1}"

    source = _TEMPLATE.sub(placeholder, expr)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"`when` is not a valid condition: {expr!r}") from None
    for node in ast.walk(tree):
        allowed = (
            ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Compare, ast.BoolOp,
            ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.List, ast.Tuple, *_COMPARE,
        )
        if not isinstance(node, allowed):
            raise ValueError(
                f"`when` may use only literals, comparisons, and/or/not and ${{...}}: {expr!r}"
            )
        # Only the placeholders made above: a `_ref7` written by hand names nothing.
        placeholders = {f"_ref{i}" for i in range(len(refs))}
        if isinstance(node, ast.Name) and node.id not in _NAMES and node.id not in placeholders:
            raise ValueError(f"`when` has an unknown name {node.id!r} (quote strings): {expr!r}")
    # A reference inside quotes would be compared as its placeholder's name, silently.
    if {f"_ref{i}" for i in range(len(refs))} - {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
    }:
        raise ValueError(f"`when` has a ${{...}} inside quotes; write it bare: {expr!r}")
    return tree, refs


def evaluate_when(when: bool | str | None, lookup: Lookup) -> bool:
    """Whether a task with this `when` should run."""
    if when is None or isinstance(when, bool):
        return when is not False
    tree, refs = compile_when(when)
    values = {f"_ref{i}": lookup(ref) for i, ref in enumerate(refs)}
    try:
        return bool(_eval(tree.body, values))
    except TypeError as exc:
        raise TemplateError(f"`when` {when!r} cannot be evaluated: {exc}") from None


def _eval(node: ast.expr, values: dict[str, Any]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return values[name] if name in values else _NAMES[name]
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            return [_eval(e, values) for e in elts]
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _eval(operand, values)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_eval(operand, values)
        case ast.BoolOp(op=ast.And(), values=items):
            return all(_eval(v, values) for v in items)
        case ast.BoolOp(op=ast.Or(), values=items):
            return any(_eval(v, values) for v in items)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            current = _eval(left, values)
            for op, right_node in zip(ops, comparators, strict=True):
                right = _eval(right_node, values)
                if not _COMPARE[type(op)](current, right):
                    return False
                current = right
            return True
    raise TemplateError(f"unsupported expression {ast.dump(node)}")
