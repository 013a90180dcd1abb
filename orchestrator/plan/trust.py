"""Where a finding may go: to a process only as data, by a rule that needs no grammar.

A finding is whatever a task printed: a server's log line, a model's output. Spliced into text
that a shell or an interpreter parses, nothing short of that interpreter can say whether it
stays an argument: `timeout 5 ${f}`, `bash ${f}`, `X=${f}; $X`, `python3 -Sc ${f}`, a
here-string to bash and `a[$(...)]` in arithmetic all beat a reader of bash's grammar, as
years of `${{ }}` in GitHub's `run:` beat every filter (GitHub's answer was an environment
variable that the script reads as data). So the rule is by position, each kind saying which
of its params are which, and a finding's text is never read:

- `shell_params` (shell text or an argv list) and `code_params` (a function, a module, a
  unit, a program, a package, a launcher's flags): no finding anywhere in them;
- `env_params` (mappings a process gets as its environment): no finding in a variable's name,
  nor in the value of one that chooses code (`CODE_ENV`); any other value takes a finding as
  data (templating.env_text), which the command reads as `"$NAME"`;
- every other param is typed by its kind's model and checked after substitution (a number, a
  duration, a URL, a path confined to its folder, a `python` task's `args`).

Refused by the plan's loader, with the line and the rewrite, and again when the task starts (a
task added through the store too). A var is the operator's own word and keeps its places.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from orchestrator.plan.templating import Ref, iter_refs

# Environment variables whose value chooses the code a process loads or runs: a finding never
# sets one, even through `env:`. Names a plan writes are its author's; these are the ones whose
# meaning every program on a host shares (the loader, the shells, the interpreters, git, ssh).
CODE_ENV = frozenset(
    {
        "PATH",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONWARNINGS",  # a category names a module to import
        "PYTHONBREAKPOINT",
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_EXTERNAL_DIFF",
        "GIT_PAGER",
        "GIT_EDITOR",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "LESSOPEN",
        "LESSCLOSE",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
    }
)
# Whole families: the dynamic loader's (LD_PRELOAD, LD_AUDIT, ...) and bash's exported
# functions (BASH_FUNC_name%%, whose value is a function body).
_CODE_ENV_PREFIXES = ("LD_", "BASH_FUNC_")


def chooses_code(name: str) -> bool:
    """Whether an environment variable of this name decides what code a process runs."""
    return name in CODE_ENV or name.startswith(_CODE_ENV_PREFIXES)


def finding_refs(value: Any) -> list[Ref]:
    """The finding references anywhere in a value, mappings' keys included; malformed ones
    are the loader's to report, so they are skipped here."""
    return [r for r in _refs(value) if r.task is not None]


def _refs(value: Any) -> Iterator[Ref]:
    if isinstance(value, str):
        try:
            yield from iter_refs(value)
        except ValueError:
            return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _refs(key)
            yield from _refs(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _refs(item)


def choosing_code(cls: type[Any], params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(param, why) for each finding that stands where a process would parse it as code."""
    code, shell, env = (_declared(cls, k) for k in ("code_params", "shell_params", "env_params"))
    out = []
    for key in sorted((code | shell) & params.keys()):
        if key in code:
            why = "a finding cannot choose what runs; {key!r} names code"
        else:
            why = "a finding reaches a process only as data, never in what a shell parses"
            if "env" in env:  # the kind has a place for it: say the rewrite
                why += '; pass it in the environment: env: {{{name}: "${{{ref}}}"}}'
                why += ', then read "${name}"'
        out += [
            (key, f"${{{ref}}}: " + why.format(key=key, ref=ref, name=env_name(ref)))
            for ref in _unique(finding_refs(params[key]))
        ]
    for key in sorted(env & params.keys() - code):
        if isinstance(params[key], Mapping):
            out += [
                (key, f"${{{ref}}}: a finding cannot {what}")
                for what, ref in _env_findings(params[key])
            ]
    return out


def _declared(cls: type[Any], attribute: str) -> frozenset[str]:
    found: frozenset[str] = getattr(cls, attribute, frozenset())
    return found


def env_name(ref: Ref) -> str:
    """The variable a refusal suggests for a finding: its key in capitals (`size` -> SIZE)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", ref.name).upper()
    return name if name[:1].isalpha() else f"F_{name}"


def _unique(refs: list[Ref]) -> Iterator[Ref]:
    yield from dict.fromkeys(refs)


def _env_findings(env: Mapping[Any, Any]) -> Iterator[tuple[str, Ref]]:
    for name, value in env.items():
        for ref in finding_refs(name):
            yield "name an environment variable", ref
        if chooses_code(str(name)):
            for ref in finding_refs(value):
                yield f"set {name}, which chooses the code that runs", ref
