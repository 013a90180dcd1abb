"""Paths built from findings stay inside the folder the plan's author chose.

A path param (Task.path_params) written with a `${tasks.ID.findings.KEY}` in it is confined to
its root: the folder written before the first finding (`out/${...}` -> `out/`, vars in it
resolved; an absolute prefix is the author's choice), or, when nothing is written before it,
the plan's folder or orch's own folder of run logs and results (`--store` may put it
elsewhere). The resolved path, normalised and with the symlinks of its existing part resolved,
must lie inside that root, so a finding `../../..` or a symlink a process planted cannot lead
a write or a read elsewhere. Only findings are confined: they are output of processes. A var
is written by the plan's author or the operator (`--var`), who could as well write the
absolute path itself, and a path written without a finding is the author's own text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.errors import TemplateError
from orchestrator.plan.templating import Lookup, before_finding, resolve


def roots_of(written: str, homes: Sequence[Path], lookup: Lookup) -> list[Path] | None:
    """The folders a path param written as `written` may not leave (`homes` when nothing is
    written before the finding); None when it uses no finding (nothing to confine)."""
    if (before := before_finding(written)) is None:
        return None
    prefix = str(resolve(before, lookup)) if before else ""
    folder = prefix[: prefix.rfind("/") + 1]  # `out/run-${x}`: the folder is out/
    # A relative prefix is read by the task against orch's working directory, as it will be.
    return [Path(os.path.realpath(p)) for p in ([folder] if folder else homes)]


def confine(name: str, written: Any, resolved: Any, homes: Sequence[Path], lookup: Lookup) -> None:
    """TemplateError unless every path in `resolved` lies inside a root `written` gives it.

    `written` and `resolved` are a param's value before and after templating: a path, or a
    mapping or list of paths (analyze.compare's `candidates`). Anything else in them (an
    inline result) is not a path and is left to the kind's own model.
    """
    if isinstance(written, dict) and isinstance(resolved, dict):
        pairs = [(f"{name}.{k}", v, resolved.get(k)) for k, v in written.items()]
    elif isinstance(written, list) and isinstance(resolved, list):
        pairs = [
            (f"{name}.{i}", v, got)
            for i, (v, got) in enumerate(zip(written, resolved, strict=True))
        ]
    else:
        pairs = [(name, written, resolved)]
    for label, text, path in pairs:
        if isinstance(text, str) and isinstance(path, str):
            _inside(label, text, path, homes, lookup)


def _inside(name: str, written: str, resolved: str, homes: Sequence[Path], lookup: Lookup) -> None:
    if (roots := roots_of(written, homes, lookup)) is None:
        return
    try:  # realpath: `..` and the symlinks of the part that exists, as the OS will follow them
        target: Path | None = Path(os.path.realpath(resolved))
    except ValueError:  # a NUL byte: no file system path at all
        target = None
    if target is None or not any(target == r or r in target.parents for r in roots):
        raise TemplateError(
            f"param {name!r}: {resolved[:200]!r} (from {written!r}) leads to {target}, "
            f"outside {' and '.join(map(str, roots))}: a path built from a finding must stay "
            f"inside the folder written before it (or the plan's folder); write that folder "
            f"in the plan"
        )
