"""Which engine files `orch run PLAN` passes through before its first task starts.

    python scripts/trace_run_path.py plans/demo.yaml [--depth N] [--list]

Follows every Python call (sys.setprofile) from `orch run` until the run loop first visits a
task, and prints the stops (each time the call moves to another orchestrator/ file), the
distinct files, and the climbs (a stop into a file already on the call stack: control going
back up to a caller's level). --depth N counts only calls at most N files deep (a file calling
itself is one level): the path a reader follows, not every helper's helper. A new store in a
temporary folder each time: no store, no fast path. The figures of docs/design.md's "the path
of `orch run`" (under "Where to start reading") come from here.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ENGINE = Path(__file__).resolve().parent.parent / "orchestrator"


class Reached(BaseException):
    """The first task is about to be visited: stop tracing (not an Exception: nothing
    between here and main() may catch it)."""


def main() -> None:
    plan = Path(sys.argv[1]).resolve()
    listing = "--list" in sys.argv
    depth = int(sys.argv[sys.argv.index("--depth") + 1]) if "--depth" in sys.argv else 10**6
    stops: list[str] = []
    climbs = 0
    stack: list[str] = []
    importing = 0  # module bodies running (imports): what they call is not the run's path

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal climbs, importing
        where, name = frame.f_code.co_filename, frame.f_code.co_name
        if event == "return":
            importing -= name == "<module>"
            if stack and stack[-1] == where:
                stack.pop()
            return
        if event != "call":
            return
        if name == "<module>":
            importing += 1
        inside = where.startswith(str(ENGINE)) and not importing
        if inside and name == "visit" and Path(where).stem in ("loop", "executor"):
            sys.setprofile(None)
            raise Reached
        stack.append(where)
        engine = [f for f in stack if f.startswith(str(ENGINE))]
        deep = sum(1 for i, f in enumerate(engine) if i == 0 or engine[i - 1] != f)
        if inside and deep <= depth and (not stops or stops[-1] != where):
            if where in stack[:-1]:
                climbs += 1
            stops.append(where)

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(plan, Path(tmp) / plan.name)
        os.chdir(tmp)
        sys.argv = ["orch", "run", plan.name, "--quiet"]
        from orchestrator.cli import main as orch

        sys.setprofile(profile)
        try:
            orch()
        except (Reached, SystemExit):
            pass
        finally:
            sys.setprofile(None)
    names = [str(Path(s).relative_to(ENGINE.parent)) for s in stops]
    print(f"{len(names)} stops in {len(set(names))} files, {climbs} back up to a caller's file")
    if listing:
        print("\n".join(names))


if __name__ == "__main__":
    main()
