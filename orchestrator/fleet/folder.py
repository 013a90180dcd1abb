"""The plan's folder as it travels to a fleet's hosts: chosen and read on the controller,
checked and placed on each host.

What travels: the plan file, the `*.py` beside it (its own kinds), and the plan's `files:`
(paths or globs under its folder); a plan without `files:` sends its whole folder but `.orch`,
`__pycache__` and what a `.` hides. Bounded (MAX_FILES, MAX_BYTES: the payload goes through
Ansible's variables to every host of a batch), refused when a name or a link leads out of the
folder. Each file goes with its sha256 and whether it is executable; one a host is known to
hold (its last answer said so, kept in the fleet record) goes as its digest alone, and a host
that no longer has it answers `missing`, and is sent it.

On the host every name is checked again (the payload is input): relative, no `..`, not into
`.orch`, no link followed, each file written whole (a temp file renamed) with its digest
checked first.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import UsageError

MAX_FILES = 1000
MAX_BYTES = 16 * 2**20  # all files together, before base64
SKIPPED = (".orch", "__pycache__")


@dataclass(frozen=True)
class Shipped:
    """One file of the folder as the controller read it."""

    name: str  # posix, relative to the plan's folder
    data: bytes
    executable: bool

    # Each computed once a roll, however many hosts the file goes to.
    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode()


def collect(plan_file: Path, patterns: Sequence[str] | None) -> list[Shipped]:
    """The files that travel with `plan_file` (see the module's docstring), sorted by name;
    UsageError naming what is wrong: a pattern matching nothing, a link out of the folder,
    a folder over the bounds."""
    top = plan_file.parent
    chosen: dict[str, Path] = {plan_file.name: plan_file}
    chosen |= {p.name: p for p in sorted(top.glob("*.py")) if p.is_file()}
    if patterns is None:
        chosen |= {_name(p, top): p for p in _walk(top)}
    for pattern in patterns or ():
        found = [p for p in sorted(top.glob(pattern)) if _wanted(p, top)]
        if not found:
            raise UsageError(f"files: {pattern!r} matches no file under {top}")
        chosen |= {_name(p, top): p for p in found}
    if len(chosen) > MAX_FILES:
        raise UsageError(
            f"{len(chosen)} files would travel with the plan (at most {MAX_FILES}): "
            "list what the hosts need in the plan's `files:`"
        )
    shipped, total = [], 0
    for name, path in sorted(chosen.items()):
        data = path.read_bytes()
        total += len(data)
        if total > MAX_BYTES:
            raise UsageError(
                f"the files travelling with the plan pass {MAX_BYTES // 2**20} MiB at {name}: "
                "list what the hosts need in the plan's `files:`; models and datasets are the "
                "hosts' own, or a step's to fetch"
            )
        shipped.append(Shipped(name, data, bool(path.stat().st_mode & stat.S_IXUSR)))
    return shipped


def _walk(top: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIPPED)
        found += [Path(dirpath, f) for f in sorted(filenames) if not f.startswith(".")]
        if len(found) > MAX_FILES:
            break  # said by collect, without walking a huge tree to the end
    return [p for p in found if _wanted(p, top)]


def _wanted(path: Path, top: Path) -> bool:
    parts = path.relative_to(top).parts
    return path.is_file() and not any(p in SKIPPED for p in parts)


def _name(path: Path, top: Path) -> str:
    """`path` (found under `top`) relative to it; a link that leads out of it is refused."""
    real = path.resolve()
    if not real.is_relative_to(top.resolve()):
        raise UsageError(f"{path} leads out of the plan's folder (to {real}): it is not sent")
    return path.relative_to(top).as_posix()


def entries(shipped: Sequence[Shipped], held: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The payload's `files`: each with its digest and mode, its bytes unless the host holds
    that digest already."""
    out: dict[str, dict[str, Any]] = {}
    for f in shipped:
        entry: dict[str, Any] = {"sha256": f.sha256, "executable": f.executable}
        if held.get(f.name) != f.sha256:
            entry["data"] = f.base64
        out[f.name] = entry
    return out


# --- on the host ------------------------------------------------------------------------------


class FileEntry(BaseModel):
    """One of the payload's `files`, as `entries` writes it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sha256: str = Field(pattern="^[0-9a-f]{64}$")
    executable: bool = False
    data: str | None = None  # base64; None: the host is believed to hold it


def checked_name(name: str) -> PurePosixPath:
    """A payload's file name as a relative path that stays in the folder; ValueError else."""
    path = PurePosixPath(name)
    if (
        not name
        or "\0" in name
        or "\\" in name
        or path.is_absolute()
        or any(p in ("..", ".", "") for p in name.split("/"))
        or path.parts[0] == ".orch"
    ):
        raise ValueError(f"not a file name under the plan's folder: {name[:80]!r}")
    return path


def place(folder: Path, files: Mapping[str, FileEntry]) -> list[str]:
    """Write each file sent with its bytes (unless identical there already) and check each
    sent by digest alone; the names of those that are missing or differ (empty: all placed).
    ValueError for a name out of the folder, bytes that do not match their digest, or a link
    on the way."""
    missing: list[str] = []
    for name, entry in sorted(files.items()):
        target = folder.joinpath(*checked_name(name).parts)
        _no_link_on_the_way(folder, target)
        have = _digest(target)
        if have == entry.sha256:
            _set_mode(target, entry.executable)
            continue
        if entry.data is None:
            missing.append(name)
            continue
        data = base64.b64decode(entry.data, validate=True)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ValueError(f"{name}: its bytes do not match their sha256")
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        _set_mode(partial, entry.executable)
        os.replace(partial, target)
    return missing


def held(folder: Path, names: Sequence[str]) -> dict[str, str]:
    """name -> sha256 of those of `names` the folder holds now: what the host answers."""
    found = {}
    for name in names:
        digest = _digest(folder.joinpath(*checked_name(name).parts))
        if digest is not None:
            found[name] = digest
    return found


def _digest(path: Path) -> str | None:
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _set_mode(path: Path, executable: bool) -> None:
    os.chmod(path, 0o700 if executable else 0o600)


def _no_link_on_the_way(folder: Path, target: Path) -> None:
    """A link in the host's folder (planted, or left by another tool) is never written
    through: each folder on the way must be a real folder or not yet exist."""
    at = folder
    for part in target.relative_to(folder).parts[:-1]:
        at = at / part
        if at.is_symlink() or (at.exists() and not at.is_dir()):
            raise ValueError(f"{at} is not a plain folder: the plan's files are not written there")
    if target.is_symlink():
        raise ValueError(f"{target} is a link: the plan's files are not written through it")
