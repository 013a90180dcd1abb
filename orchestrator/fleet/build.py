"""Which orch a host runs: the package version and a digest of its source.

Two installs of the same version can differ (a checkout with local edits, a wheel built
yesterday); a roll that mixes them makes its per-host results incomparable. The digest covers
every .py file of the installed `orchestrator` and `tasks` packages, by relative path and
content, so the editable checkout and a wheel built from it agree and any edit differs.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

PACKAGES = ("orchestrator", "tasks")


@functools.cache
def build_id() -> str:
    """`<version>+<12 hex digits>`, e.g. `0.1.0+3f2a9c0d1e4b`."""
    import orchestrator

    root = Path(orchestrator.__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            if "__pycache__" in file.parts:
                continue
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return f"{metadata.version('orch')}+{digest.hexdigest()[:12]}"
