"""A running host's progress, on the host: `python -P -m orchestrator.fleet.progress STORE`.

While a batch runs, the controller asks every host still running, all in one Ansible play,
once every PROGRESS_S (roll.py): not an SSH round trip per host per second, and nothing from
the host's own run, which answers only at its end. This reads the host's store as it is now
(a peek: read-only, no lock, beside the live run's commits) and answers one JSON line,
{"progress": [{"id", "status", "role"}, ...]}, the plan's tasks in order; an empty list
while the run has not made its store yet. Only the store's modules are imported: the answer
costs a Python start and one query.
"""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path

from orchestrator.core.errors import StoreError
from orchestrator.store.db import SQLITE_ERRORS, Store

PROGRESS_S = 10.0  # how often the controller asks


def progress_of(store_path: Path) -> list[dict[str, str | None]]:
    try:
        with closing(Store.peek(store_path)) as store:
            rows = store.board()
    except (*SQLITE_ERRORS, StoreError, OSError):
        return []  # not made yet (or mid-creation): no progress to tell
    return [{"id": r["id"], "status": str(r["status"]), "role": r["role"]} for r in rows]


def main() -> int:
    if len(sys.argv) != 2:
        print(json.dumps({"error": "usage: python -m orchestrator.fleet.progress STORE"}))
        return 2
    print(json.dumps({"progress": progress_of(Path(sys.argv[1]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
