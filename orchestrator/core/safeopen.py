"""orch's folder and the files it writes there, opened without following links (CWE-59).

A cloned repository may ship `.orch/` with links planted in it: `<plan>.runs/1/<task>.log`
pointing at `~/.bashrc`, the report folder pointing elsewhere. Every writer of orch goes
through this module, so the rule is kept in one place:

- orch's own folders (`.orch`, the runs folder and a run's folder, the report folder, the
  fleet's work folder) must be real folders, the user's, and writable by no one else: another
  user who may write one could plant a link in it between our check and our open. One orch
  makes is 0700. One an older orch made (0755, before umask 077) is tightened, not refused:
  it is ours and no one else could write into it, so nothing in it was planted by another user;
  tightening only hides what it holds (commands, outputs) from other users.
- Files are opened with O_NOFOLLOW, created with O_EXCL, or replaced by renaming a new file
  over them (rename never follows a link); a link where orch writes is refused, never removed:
  the user should see what was planted.
- SQLite follows a link to its database itself, and names its -wal/-shm/-journal after it:
  those four names are looked at (lstat) before a connection is made.

Standard library only (core/): every layer uses it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, TextIO, overload

from orchestrator.core.errors import UnsafePath

ORCH_FOLDER = ".orch"
PRIVATE_DIR = 0o700
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _link_message(path: Path) -> str:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return f"{path} is a symbolic link{target}: orch never writes through a link; remove it"


def refuse_link(path: Path) -> None:
    """Refuse `path` if it is a symbolic link (dangling or not); nothing there is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError:  # cannot be looked at: whoever opens it says why
        return
    if stat.S_ISLNK(mode):
        raise UnsafePath(_link_message(path))


def ensure_private_dir(path: Path, *, tighten: bool = True, no_links_inside: bool = False) -> None:
    """`path` as a folder of orch's own: made 0700 when missing (its parents as the user's
    umask makes them); refused when it is a link, not a folder, another user's, or writable by
    group or others. An older orch's looser mode is tightened to 0700 with `tighten` (a reader
    changes nothing; a read-only mount keeps its mode). `no_links_inside`: also refuse a link
    directly in it (a folder orch is about to write files into by name, e.g. a run's logs)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another orch made it meanwhile: checked below
            os.mkdir(path, PRIVATE_DIR)
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(
            _link_message(path).replace("remove it", "remove it (orch makes a folder of its own)")
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a folder: move it aside (orch makes a folder of its own)")
    if st.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): its owner could "
            f"plant links in it; move it aside (orch makes a folder of its own), or chown it"
        )
    if st.st_mode & 0o022:
        who = "world-writable" if st.st_mode & 0o002 else "group-writable"
        raise UnsafePath(
            f"{path} is {who} (mode {stat.S_IMODE(st.st_mode):04o}): others could plant links "
            f"in it; chmod 700 {path}, or move it aside"
        )
    if tighten and st.st_mode & 0o077:
        with contextlib.suppress(OSError):  # a read-only mount: no one can plant anything there
            os.chmod(path, PRIVATE_DIR, follow_symlinks=False)
    if no_links_inside:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_symlink():
                    raise UnsafePath(_link_message(path / entry.name))


def ensure_store_folder(db: Path, *, create: bool) -> None:
    """Before SQLite opens `db`: its folder checked (`.orch`, or one orch is about to make, is
    private: ensure_private_dir; a folder the user named with --store is the user's), and
    neither `db` nor its -wal/-shm/-journal a link. `create`: the folder may be made, and an
    older orch's mode tightened."""
    folder = db.parent
    there = os.path.lexists(folder)
    if (folder.name == ORCH_FOLDER and there) or (create and not there):
        ensure_private_dir(folder, tighten=create)
    for path in (db, *(db.with_name(db.name + s) for s in SQLITE_SIDECARS)):
        refuse_link(path)


def open_fd(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a link at `path` (refused as UnsafePath, with what to do)."""
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(_link_message(path)) from None
        raise


@overload
def open_for_append(path: Path, binary: Literal[False] = ..., buffering: int = ...) -> TextIO: ...
@overload
def open_for_append(path: Path, binary: Literal[True], buffering: int = ...) -> BinaryIO: ...
def open_for_append(path: Path, binary: bool = False, buffering: int = -1) -> IO[Any]:
    """`path` opened to append (created 0600 if missing), never through a link: a log."""
    fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if binary:
        return os.fdopen(fd, "ab", buffering=buffering)
    return os.fdopen(fd, "a", buffering=buffering, encoding="utf-8")


def open_for_update(path: Path) -> IO[bytes]:
    """An existing `path` opened to read and rewrite in place ("r+b"), never through a link."""
    return os.fdopen(open_fd(path, os.O_RDWR), "r+b")


def write_atomically(path: Path, data: bytes | str) -> None:
    """`path` replaced by `data` (text as UTF-8): written to a new file beside it (O_EXCL),
    then renamed over it, so an existing file is never opened; a link at `path` is refused.
    The mode is what the umask gives a new file, as Path.write_bytes would.

    Durable on return: the data is synced before the rename and the folder after it. A task
    writes its result this way before its completion is recorded; without the syncs a power
    cut could keep the completion (synced) and lose the file it names (tests/crashharness.py
    saw an empty bench result, then the analysis fail on the resumed run)."""
    refuse_link(path)
    # os.urandom, not `secrets`: that imports hashlib, which `orch status` must not pay for.
    tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
