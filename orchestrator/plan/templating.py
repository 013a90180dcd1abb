"""`${vars.x}` and `${tasks.<id>.findings.<key>}` in params and `when`.

References are found when the plan loads (so an unknown var or task is a plan error) and
resolved when the task starts (so a finding recorded a minute ago is seen). `$${` writes a
literal `${`.

A finding reaches a process only as data (trust.py says where); a var the operator chose may be
spliced into shell text, as an inert word (inert_word): quoting cannot make a value safe,
because bash arithmetic (`(( X ))`, `[[ X -eq 0 ]]`, `declare -i`, array subscripts)
evaluates the text of a quoted word or a variable, `$(...)` included. A word made only of
`[A-Za-z0-9_@%+:,./-]` cannot start a substitution anywhere in bash. A value put in a
process's environment (env_text) is read by the command as data, and holds no `$` or backquote
when it is a finding, so no shell evaluating the variable can run it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import TemplateError

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


def replace_refs(text: str, replace: Callable[[Ref], str]) -> str:
    """`text` with each well-formed reference replaced by replace(ref); `$${` escapes and
    malformed references are kept as written (the loader reports those)."""

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return m.group(0)
        try:
            return replace(parse_ref(m.group(2)))
        except ValueError:
            return m.group(0)

    return _TEMPLATE.sub(one, text)


def before_finding(text: str) -> str | None:
    """What `text` says before its first finding reference (still a template), or None when
    it has none."""
    for m in _TEMPLATE.finditer(text):
        if not m.group(1) and parse_ref(m.group(2)).task:
            return text[: m.start()]
    return None


Lookup = Callable[[Ref], Any]
Splice = Callable[[Ref, Any], str]


def resolve(value: Any, lookup: Lookup, splice: Splice | None = None) -> Any:
    """`value` with every reference replaced by lookup(ref).

    A string that is exactly one reference takes the referenced value's own type (a port stays
    an int); inside a longer string the value is formatted. With `splice` every value becomes
    text through splice(ref, value), which may refuse it (TemplateError): shell text
    (inert_word) and a process's environment (env_text).
    """
    if isinstance(value, str):
        m = _TEMPLATE.fullmatch(value)
        if m and not m.group(1) and splice is None:
            return lookup(parse_ref(m.group(2)))

        def one(m: re.Match[str]) -> str:
            if m.group(1):
                return "${" + m.group(2) + "}"
            ref = parse_ref(m.group(2))
            return splice(ref, lookup(ref)) if splice else _format(lookup(ref))

        return _TEMPLATE.sub(one, value)
    if isinstance(value, Mapping):
        return {k: resolve(v, lookup, splice) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(v, lookup, splice) for v in value]
    return value


def splices(cls: Any, params: Mapping[str, Any]) -> dict[str, Splice]:
    """How each param of a task or check of kind `cls` takes a value as text: shell text
    written as a string (only vars reach it: trust.py refuses findings there) as an inert word,
    an environment mapping as env_text. Other params keep each value's type."""
    shell = {k: inert_word for k in cls.shell_params if isinstance(params.get(k), str)}
    return shell | {k: env_text for k in cls.env_params & params.keys()}


# shlex's safe set without `=` (an assignment in arithmetic) and without non-ASCII letters.
INERT_MAX = 4096
_INERT = re.compile(r"[A-Za-z0-9_@%+:,./-]+", re.ASCII)


def is_inert(text: str) -> bool:
    """Whether bash can only ever read `text` as a plain word (or, in arithmetic, a number or a
    variable's name): no `$`, backtick, quote, bracket, blank, glob, `=`, `~`, `;&|<>` or
    newline."""
    return 0 < len(text) <= INERT_MAX and _INERT.fullmatch(text) is not None


def inert_word(ref: Ref, value: Any) -> str:
    """The text of a var that bash will read; TemplateError unless it is an inert word."""
    # Lists, dicts and None have no one-word form: refused rather than guessed at.
    if isinstance(value, str | bool | int | float) and is_inert(text := _format(value)):
        return text
    raise TemplateError(
        f"${{{ref}}} = {_shown(value)} cannot be spliced into shell text: a value there must "
        f"be one plain word of letters, digits and _@%+:,./- (at most {INERT_MAX} "
        f'characters); pass it in the environment (env: {{NAME: "${{{ref}}}"}}, then "$NAME")'
    )


# Linux's limit on one string of a process's environment (MAX_ARG_STRLEN): past it exec fails.
ENV_MAX = 128 * 1024
# `$` and the backquote start a substitution wherever a shell evaluates a variable's text:
# bash arithmetic (`(( X ))`, `$(( X ))`, `[[ X -eq 0 ]]`, `declare -i`, an array subscript)
# reads `a[$(cmd)]` in X's value and runs cmd. Without them, a value evaluated there can only
# be a number or a variable's name. NUL cannot be in an environment at all.
_NOT_IN_ENV = re.compile(r"[$`\x00]")


def env_text(ref: Ref, value: Any) -> str:
    """A value as text of a process's environment, where the command reads it as data
    ("$NAME"); TemplateError for a finding that holds `$`, a backquote or NUL, or is too long.
    A var is the operator's own word: only made text."""
    if not isinstance(value, str | bool | int | float):
        raise TemplateError(
            f"${{{ref}}} = {_shown(value)} cannot go into an environment variable: only a "
            "string, a number or a boolean has one text"
        )
    text = _format(value)
    if ref.task is not None and (len(text) > ENV_MAX or _NOT_IN_ENV.search(text)):
        raise TemplateError(
            f"${{{ref}}} = {_shown(value)} cannot go into an environment variable: a finding "
            f"there must hold no `$`, backquote or NUL (a shell evaluating the variable, as "
            f"bash arithmetic does, would run what follows `$(`) and be at most "
            f"{ENV_MAX // 1024} KiB"
        )
    return text


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


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
            ast.Expression,
            ast.Constant,
            ast.Name,
            ast.Load,
            ast.Compare,
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.USub,
            ast.List,
            ast.Tuple,
            *_COMPARE,
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
