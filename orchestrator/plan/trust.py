"""Where a finding may go: into data, never into the choice of what runs.

A finding is whatever a task printed: a server's log line, a model's output. Spliced into an
argument it is data (quoted, inert: templating.inert_word); spliced into the name of a function,
a module, an interpreter, a venv, a package to install or a program to start, it would let that
output choose the code orch runs. So each kind declares the params that name code
(`Task.code_params`, `Precondition.code_params`), and a `${tasks.ID.findings.KEY}` in one is
refused: by the plan's loader, with its line, and again when the task starts (a task added
through the store too). A var is the operator's own word and stays allowed.

Shell text (`shell_params`) is read word by word: a finding may be an argument, never the
command of a simple command (the first word, after `;`, `&&`, `|`, `(`, `$(`, a backquote, a
keyword such as `then`, a prefix such as `sudo`, `env` or `xargs`), nor an environment
variable that chooses code (`PATH`, `LD_PRELOAD`, `PYTHONPATH`, ...) assigned in front of a
command or in `env_params`. What bash reads again as commands is read the same way (`eval`'s
words, a shell's `-c`, a here-document fed to a shell); another interpreter's `-c`/`-e`, or a
here-document it reads, is code throughout; `(( ))` is arithmetic and a here-document fed to
any other command is data. This is a reading of bash's grammar good for the commands plans
hold, not bash itself; where the text cannot be split into words (an unbalanced quote) every
finding in it counts as a command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from typing import Any

from orchestrator.plan.templating import Ref, iter_refs, replace_refs

# Environment variables whose value chooses the code a process loads or runs.
CODE_ENV = frozenset(
    {
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
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
    }
)
# Words after which the next word is a command again.
_PREFIXES = frozenset(
    {
        "if", "then", "else", "elif", "do", "while", "until", "!", "{", "time",
        "exec", "command", "builtin", "source", ".", "env", "sudo", "doas", "nohup",
        "nice", "ionice", "setsid", "stdbuf", "timeout", "xargs", "chroot", "taskset",
        "numactl", "strace", "unbuffer", "watch", "flock",
    }
)  # fmt: skip
# Commands whose `-c`/`-e` argument is code.
_SHELLS = re.compile(r"(ba|da|z|k)?sh")
_INTERPRETERS = re.compile(r"(ba|da|z|k)?sh|python[0-9.]*|perl|ruby|node|php|lua|Rscript")
_HEREDOC = re.compile(r"(?<!<)<<(-?)\s*(['\"]?)([A-Za-z0-9_-]+)\2")
_SEPARATORS = frozenset({";", ";;", "&", "&&", "|", "||", "|&", "(", ")", "`"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_PLACEHOLDER = re.compile(r"ORCHREF([0-9]+)Z")


def finding_refs(value: Any) -> list[Ref]:
    """The finding references in a value (its mappings' keys included); malformed ones are
    the loader's to report, so they are skipped here."""
    try:
        refs = list(iter_refs(value))
    except ValueError:
        return []
    if isinstance(value, Mapping):
        for key in value:
            refs += finding_refs(key) if isinstance(key, str) else []
    return [r for r in refs if r.task is not None]


def choosing_code(cls: type[Any], params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(param, why) for each place where a finding would choose what runs."""
    out = []
    for key in sorted(getattr(cls, "code_params", frozenset()) & params.keys()):
        out += [
            (key, f"${{{ref}}}: a finding cannot choose what runs; {key!r} names code")
            for ref in _unique(finding_refs(params[key]))
        ]
    for key in sorted(getattr(cls, "shell_params", frozenset()) & params.keys()):
        value = params[key]
        if isinstance(value, str):
            found = command_findings(value)
        elif isinstance(value, list):
            found = argv_findings(value)
        else:
            found = []
        out += [
            (key, f"${{{ref}}}: a finding cannot be the command; pass it as an argument")
            for ref in _unique(found)
        ]
    for key in sorted(getattr(cls, "env_params", frozenset()) & params.keys()):
        env = params[key]
        if isinstance(env, Mapping):
            out += [
                (key, f"${{{ref}}}: a finding cannot set {name}, which chooses code")
                for name, ref in _env_findings(env)
            ]
    return out


def _unique(refs: list[Ref]) -> Iterator[Ref]:
    yield from dict.fromkeys(refs)


def _env_findings(env: Mapping[Any, Any]) -> Iterator[tuple[str, Ref]]:
    for name, value in env.items():
        for ref in finding_refs(name):
            yield "a variable's name", ref
        if str(name) in CODE_ENV:
            for ref in finding_refs(value):
                yield str(name), ref


def command_findings(text: str) -> list[Ref]:
    """The finding references in shell text that stand where a command is named."""
    refs: list[Ref] = []

    def placeholder(ref: Ref) -> str:
        refs.append(ref)
        return f"ORCHREF{len(refs) - 1}Z"

    masked = replace_refs(text, placeholder)
    if not any(r.task for r in refs):
        return []
    return [refs[i] for i in _commands(masked) if refs[i].task]


def _commands(text: str) -> list[int]:
    """The placeholders (by number) that name a command in shell text; every one where the text
    cannot be split into words."""
    everything = [int(m.group(1)) for m in _PLACEHOLDER.finditer(text)]
    try:
        text, bodies = _heredocs(text)
        words = _words(text)
    except ValueError:  # unbalanced quotes: no word boundaries to trust
        return everything
    found = [n for body in bodies for n in body]
    command_next, redirect_next, arithmetic = True, False, False
    command = ""  # the current simple command's name
    evaluated: list[str] | None = None  # eval's words, to be read as a command of their own
    code_next = False  # an interpreter's -c/-e argument comes next

    def numbers(word: str) -> list[int]:
        return [int(m.group(1)) for m in _PLACEHOLDER.finditer(word)]

    def end_eval() -> None:
        nonlocal evaluated
        if evaluated is not None:
            found.extend(_commands(" ".join(evaluated)))
            evaluated = None

    for word in words:
        if arithmetic:  # (( ... )) and $(( ... )): numbers and names, no commands
            if "))" in word:
                arithmetic = False
                command_next = bool(set(word) & set(";&|"))
            continue
        if word.startswith("(("):
            end_eval()
            arithmetic = True
            continue
        if word in _SEPARATORS or (set(word) <= set(";&|()`") and word):
            end_eval()
            command_next, code_next, command = True, False, ""
            continue
        if set(word) <= set("<>&|0123456789") and ("<" in word or ">" in word):
            redirect_next = True
            continue
        if redirect_next:  # a file name
            redirect_next = False
            continue
        if evaluated is not None:
            evaluated.append(word)
            continue
        if command_next:
            if m := _ASSIGNMENT.fullmatch(word):  # NAME=value before the command
                if m.group(1) in CODE_ENV:
                    found += numbers(m.group(2))
                continue
            found += numbers(word)
            command = word.rsplit("/", 1)[-1]
            command_next = word in _PREFIXES and word != "eval"
            evaluated = [] if word == "eval" else None
            continue
        if code_next:  # a shell's -c is read as commands; another interpreter's is all code
            found += _commands(word) if _SHELLS.fullmatch(command) else numbers(word)
            code_next = False
            continue
        if _INTERPRETERS.fullmatch(command) and word in ("-c", "-e"):
            code_next = True
    end_eval()
    return found


def argv_findings(argv: list[Any]) -> list[Ref]:
    """The finding references of an argv list that name a command: its first item, the item
    after a prefix (`sudo`, `env A=1`, `xargs`), and an interpreter's `-c`/`-e` code (a
    shell's read as shell text). Items are never split: the rest are arguments."""
    found: list[Ref] = []
    command_next, code_next, command = True, False, ""
    for item in argv:
        text = item if isinstance(item, str) else ""
        if command_next:
            if _ASSIGNMENT.fullmatch(text) and command == "env":  # env NAME=value prog
                name, _, value = text.partition("=")
                found += finding_refs(value) if name in CODE_ENV else []
                continue
            found += finding_refs(item)
            command = text.rsplit("/", 1)[-1]
            command_next = text in _PREFIXES
            continue
        if code_next:
            found += command_findings(text) if _SHELLS.fullmatch(command) else finding_refs(item)
            code_next = False
        elif _INTERPRETERS.fullmatch(command) and text in ("-c", "-e"):
            code_next = True
    return found


def _heredocs(text: str) -> tuple[str, list[list[int]]]:
    """`text` without its here-documents' bodies, and per body the placeholders that are code:
    all of them when an interpreter reads the body (`bash <<EOF`), none for data (`cat`)."""
    lines, kept, bodies = text.split("\n"), [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        kept.append(line)
        i += 1
        for m in _HEREDOC.finditer(line):
            delimiter, tabs = m.group(3), bool(m.group(1))
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if tabs else lines[i]) != delimiter:
                body.append(lines[i])
                i += 1
            i += 1  # the delimiter's line
            reader = [w.rsplit("/", 1)[-1] for w in line[: m.start()].split()]
            code = any(_INTERPRETERS.fullmatch(w) for w in reader)
            bodies.append(
                [int(p.group(1)) for b in body for p in _PLACEHOLDER.finditer(b)] if code else []
            )
    return "\n".join(kept), bodies


def _words(text: str) -> list[str]:
    """Shell words and operators; newlines end commands as `;` does."""
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars="();<>|&`")
    lexer.whitespace_split = True
    return list(lexer)
