"""A FUSE file system that keeps unsynced writes apart, for simulated power cuts.

    python tests/crashfs.py BACKING MOUNT EVENTS_FD CONTROL_FD [--cut-at N] [--keep none|some]
        [--fail-at N --errno ENOSPC|EIO|EROFS] [--seed S]

What a kernel's page cache does to a file's data, made explicit (LazyFS's model, in Python over
Debian's libfuse3 through mfusepy): a write reaches only this process's memory, where reads see
it; `fsync` (or `fdatasync`) of the file writes what is pending for it, in order, to the backing
folder and syncs it there. A power cut (op N reached, or `cut` on the control pipe) drops
what is pending, or with `--keep some` keeps a random part of it, each write whole, torn at a
512-byte sector or lost (a drive may persist any part of an unsynced write, in any order);
after it every operation waits forever: the host is down. What the backing folder then holds is
what a disk would hold after the cut. Metadata (create, rename, link, unlink, mkdir, chmod) goes
through at once, as in LazyFS: only file data is held back.

`--fail-at N --errno E` instead fails every mutating operation from the N-th on (a disk that
fills, a device that errs, a file system remounted read-only), for the storage-fault tests.

Operations are counted in the order they arrive (one thread: `-s`); each mutating one (write,
truncate, fsync, create, mkdir, unlink, rename, link, chmod) is a point where a cut can fall.
EVENTS_FD gets lines: `ready`, `cut N OP PATH`, `ops N` at a clean unmount (then everything
pending is written: a clean shutdown syncs its cache). The harness that drives it is
tests/crashharness.py.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import mfusepy
from mfusepy import FuseOSError, Operations

SECTOR = 512
MUTATING = frozenset(
    ("write", "truncate", "fsync", "create", "mkdir", "unlink", "rmdir", "rename", "link",
     "chmod", "symlink")
)  # fmt: skip


@dataclass
class Pending:
    """One file's data as the processes see it, and the writes since its last fsync."""

    data: bytearray
    log: list[tuple[str, int, bytes]] = field(default_factory=list)  # (write|truncate, at, bytes)


def _whole(fd: int) -> bytearray:
    """A backing file's bytes as they are on disk."""
    return bytearray(os.pread(fd, os.fstat(fd).st_size, 0))


class CrashFS(Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: str, args: argparse.Namespace, events: Any) -> None:
        self.root = backing
        self.args = args
        self.events = events
        self.rng = random.Random(args.seed)
        self.pending: dict[int, Pending] = {}  # by backing inode: links and renames keep it
        # Open files: a file handle is the backing file's descriptor, opened for reading only
        # (writes are held here, never sent to the backing file).
        self.open_fds: set[int] = set()
        self.ops = 0
        self.down = threading.Event()
        self.mutex = threading.Lock()

    # --- the model ------------------------------------------------------------------------------

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _count(self, op: str, path: str) -> None:
        """Every operation passes here first: a cut or a fault falls on the N-th mutating one."""
        with self.mutex:
            if self.down.is_set():
                pass
            elif op in MUTATING:
                self.ops += 1
                if self.args.trace:
                    print(self.ops, op, path, file=sys.stderr, flush=True)
                if self.args.cut_at is not None and self.ops >= self.args.cut_at:
                    self._cut(f"{op} {path}")
                elif self.args.fail_at is not None and self.ops >= self.args.fail_at:
                    raise FuseOSError(getattr(errno, self.args.errno))
        if self.down.is_set():
            threading.Event().wait()  # the host is down: nothing answers again

    def _cut(self, what: str) -> None:
        """Power lost now: what is pending is dropped, or part of it kept (--keep some)."""
        if self.args.keep == "some":
            for ino, pending in self.pending.items():
                path = self._path_of(ino)
                if path is not None:
                    self._apply(path, [op for op in pending.log if self._kept(op) is not None],
                                sync=False)  # fmt: skip
        self.pending.clear()
        self.down.set()
        self._say(f"cut {self.ops} {what}")

    def _kept(self, op: tuple[str, int, bytes]) -> tuple[str, int, bytes] | None:
        """Whether a pending write reached the disk: whole, a leading part (torn at a sector), or
        not at all; a truncate, or not."""
        kind, at, data = op
        roll = self.rng.random()
        if roll < 1 / 3:
            return None
        if kind == "write" and roll < 2 / 3 and len(data) > SECTOR:
            cut = self.rng.randrange(1, (len(data) + SECTOR - 1) // SECTOR) * SECTOR
            return (kind, at, data[:cut])
        return op

    def _path_of(self, ino: int) -> str | None:
        for top, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(top, name)
                if os.lstat(path).st_ino == ino:
                    return path
        return None

    def _apply(self, real: str, log: list[tuple[str, int, bytes]], sync: bool) -> None:
        fd = os.open(real, os.O_WRONLY)
        try:
            for kind, at, data in log:
                if kind == "write":
                    os.pwrite(fd, data, at)
                else:
                    os.ftruncate(fd, at)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _held(self, real: str) -> Pending:
        """The file's pending state, begun from what the backing file holds."""
        ino = os.lstat(real).st_ino
        if ino not in self.pending:
            fd = os.open(real, os.O_RDONLY)
            try:
                self.pending[ino] = Pending(_whole(fd))
            finally:
                os.close(fd)
        return self.pending[ino]

    def _say(self, line: str) -> None:
        os.write(self.events, (line + "\n").encode())

    def control(self, fd: int) -> None:
        """The harness's commands: `cut` (power lost now)."""
        with os.fdopen(fd, "r") as pipe:
            for line in pipe:
                if line.strip() == "cut":
                    with self.mutex:
                        if not self.down.is_set():
                            self._cut("on command")

    # --- the file system --------------------------------------------------------------------------

    def init(self, path: str) -> None:
        self._say("ready")

    def destroy(self, path: str) -> None:
        if not self.down.is_set():  # a clean unmount: the cache is written back
            for ino, pending in list(self.pending.items()):
                real = self._path_of(ino)
                if real is not None:
                    self._apply(real, pending.log, sync=True)
            self.pending.clear()
            self._say(f"ops {self.ops}")

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._count("getattr", path)
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        attrs = {k: getattr(st, k) for k in (
            "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")}  # fmt: skip
        for when in ("st_atime", "st_mtime", "st_ctime"):  # use_ns: nanoseconds
            attrs[when] = getattr(st, when + "_ns")
        if (pending := self.pending.get(st.st_ino)) is not None:
            attrs["st_size"] = len(pending.data)
        return attrs

    def access(self, path: str, amode: int) -> int:
        self._count("access", path)
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self._count("readdir", path)
        # With use_ino an entry needs its inode: one of 0 is skipped by readdir(3).
        real = self._real(path)
        return [
            (name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0)
            for name in (".", "..", *os.listdir(real))
            for st in (os.lstat(os.path.join(real, name)),)
        ]

    def readlink(self, path: str) -> str:
        self._count("readlink", path)
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, int]:
        self._count("statfs", path)
        sv = os.statvfs(self._real(path))
        out = {k: getattr(sv, k) for k in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}  # fmt: skip
        if self.args.fail_at is not None and self.ops >= self.args.fail_at:
            if self.args.errno == "ENOSPC":  # what a full disk shows
                out["f_bavail"] = out["f_bfree"] = 0
            elif self.args.errno == "EROFS":
                out["f_flag"] |= os.ST_RDONLY
        return out

    def _wrap(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as exc:
            raise FuseOSError(exc.errno) from None

    def mkdir(self, path: str, mode: int) -> int:
        self._count("mkdir", path)
        return self._wrap(os.mkdir, self._real(path), mode) or 0

    def rmdir(self, path: str) -> int:
        self._count("rmdir", path)
        return self._wrap(os.rmdir, self._real(path)) or 0

    def unlink(self, path: str) -> int:
        self._count("unlink", path)
        real = self._real(path)
        st = self._wrap(os.lstat, real)
        self._wrap(os.unlink, real)
        if st.st_nlink <= 1 and not any(self._fd_ino(fd) == st.st_ino for fd in self.open_fds):
            self.pending.pop(st.st_ino, None)
        return 0

    def _fd_ino(self, fd: int) -> int:
        return os.fstat(fd).st_ino

    def rename(self, old: str, new: str) -> int:
        self._count("rename", old)
        return self._wrap(os.rename, self._real(old), self._real(new)) or 0

    def link(self, target: str, source: str) -> int:
        self._count("link", target)
        return self._wrap(os.link, self._real(source), self._real(target)) or 0

    def symlink(self, target: str, source: str) -> int:
        self._count("symlink", target)
        return self._wrap(os.symlink, source, self._real(target)) or 0

    def chmod(self, path: str, mode: int) -> int:
        self._count("chmod", path)
        return self._wrap(os.chmod, self._real(path), mode) or 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._count("chown", path)
        return self._wrap(os.chown, self._real(path), uid, gid) or 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._count("utimens", path)
        if times is None:
            self._wrap(os.utime, self._real(path))
        else:
            self._wrap(os.utime, self._real(path), None, times)
        return 0

    def _handle(self, fd: int) -> int:
        self.open_fds.add(fd)
        return fd

    def open(self, path: str, flags: int) -> int:
        self._count("open", path)
        fd = self._wrap(os.open, self._real(path), os.O_RDONLY)
        return self._handle(fd)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._count("create", path)
        real = self._real(path)
        self._wrap(os.close, self._wrap(os.open, real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
        return self._handle(self._wrap(os.open, real, os.O_RDONLY))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._count("read", path)
        pending = self.pending.get(self._fd_ino(fh))
        if pending is not None:
            return bytes(pending.data[offset : offset + size])
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._count("write", path)
        ino = self._fd_ino(fh)
        pending = self.pending.get(ino)
        if pending is None:
            pending = self.pending[ino] = Pending(_whole(fh))
        end = offset + len(data)
        if len(pending.data) < offset:
            pending.data.extend(bytes(offset - len(pending.data)))
        pending.data[offset:end] = data
        pending.log.append(("write", offset, bytes(data)))
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._count("truncate", path)
        if fh is not None and fh in self.open_fds:
            ino = self._fd_ino(fh)
            pending = self.pending.get(ino) or self.pending.setdefault(ino, Pending(_whole(fh)))
        else:
            pending = self._wrap(self._held, self._real(path))
        del pending.data[length:]
        pending.data.extend(bytes(length - len(pending.data)))
        pending.log.append(("truncate", length, b""))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._count("fsync", path)
        ino = self._fd_ino(fh)
        if (pending := self.pending.pop(ino, None)) is not None:
            real = self._real(path) if path and path != "-" else None
            if real is None or not os.path.exists(real) or os.lstat(real).st_ino != ino:
                real = self._path_of(ino)
            if real is not None:
                self._apply(real, pending.log, sync=True)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._count("fsyncdir", path)  # metadata is never held back
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        self.open_fds.discard(fh)
        os.close(fh)
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing")
    parser.add_argument("mount")
    parser.add_argument("events", type=int)
    parser.add_argument("control", type=int)
    parser.add_argument("--cut-at", type=int)
    parser.add_argument("--keep", choices=("none", "some"), default="none")
    parser.add_argument("--fail-at", type=int)
    parser.add_argument("--errno", default="ENOSPC", choices=("ENOSPC", "EIO", "EROFS"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", action="store_true", help="each mutating operation to stderr")
    args = parser.parse_args()
    fs = CrashFS(os.path.abspath(args.backing), args, args.events)
    threading.Thread(target=fs.control, args=(args.control,), daemon=True).start()
    # -s: one thread, so operations are counted in one order; use_ino: a file's identity is its
    # backing inode's (orch checks its store's); default_permissions: the kernel checks modes.
    mfusepy.FUSE(fs, args.mount, foreground=True, nothreads=True, use_ino=True,
                 default_permissions=True, fsname="crashfs")  # fmt: skip
    sys.exit(0)


if __name__ == "__main__":
    main()
