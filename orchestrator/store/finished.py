"""Is this plan already finished? Answered without loading it, so a re-run of a finished plan
costs a hash and one query instead of importing pydantic, yaml and structlog (~150 ms even on
a fast machine; the issue's budget for the whole re-run is 80 ms).

A completed run records the digest of the plan file's bytes and its --var overrides. If the
file is byte-identical, the plan that was validated then is the plan now, so the stored todos
answer for it. Anything else (another digest, a task not done, a run open) takes the full path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.errors import StoreError
from orchestrator.core.files import MAX_PLAN_BYTES, read_bounded
from orchestrator.store.db import SQLITE_ERRORS, Store
from orchestrator.store.lock import RunLock

if TYPE_CHECKING:
    from hashlib import sha256
else:
    # CPython's own sha256 (3.11 _sha256, 3.12 _sha2): hashlib would first load OpenSSL,
    # ~2.5 ms of each re-run. The digest is the same; elsewhere hashlib's serves.
    try:
        from _sha256 import sha256
    except ImportError:
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256

DIGEST_KEY = "finished_digest"
_NAME = re.compile(
    rb"^name:[ \t]*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]*)['\"]?[ \t]*(?:#.*)?$", re.MULTILINE
)


# A var declared `{env: NAME}` takes its value from the environment: the same bytes are another
# plan when NAME changes. The names are read by a pattern; one read wrongly only adds a value.
_ENV_NAME = re.compile(rb"\benv:[ \t]*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


def plan_digest(plan_file: Path, var_args: Sequence[str]) -> str | None:
    """sha256 of the plan file, the overrides and the environment values its vars may read;
    None if the file cannot be read."""
    data = read_bounded(plan_file, MAX_PLAN_BYTES)  # /dev/zero, a FIFO: the full load says so
    if data is None or len(data) > MAX_PLAN_BYTES:
        return None
    # The pattern's `\b` keeps re from searching for its literal: a plain `in` first (a plan
    # with no `env:` is the common case; ~0.4 ms of each start for a 1000-task file).
    found = _ENV_NAME.findall(data) if b"env:" in data else ()
    names = sorted({m.decode() for m in found})
    env = "\0".join(f"{n}={os.environ.get(n, '')}" if n in os.environ else n for n in names)
    return sha256(data + b"\0" + "\0".join(var_args).encode() + b"\0" + env.encode()).hexdigest()


def guess_store(plan_file: Path, store_opt: str | None) -> Path | None:
    """Where the plan's store would be. The name is read by a pattern, not by YAML: a wrong
    guess only finds no matching digest, and the full path runs."""
    if store_opt:
        return Path(store_opt)
    if (data := read_bounded(plan_file, MAX_PLAN_BYTES)) is None:
        return None
    m = _NAME.search(data)
    return plan_file.parent / ".orch" / f"{m.group(1).decode()}.db" if m else None


def already_finished(store_path: Path, digest: str) -> bool:
    if not store_path.exists() or not RunLock(store_path).try_probe():
        return False
    # A peek, not an open: the board shown next opens it with every check (a damaged or
    # older store read here only sends the run down the full path, which says what is wrong).
    try:
        with closing(Store.peek(store_path)) as store:
            return store.meta(DIGEST_KEY) == digest and store.all_done()
    except (*SQLITE_ERRORS, StoreError):
        return False
