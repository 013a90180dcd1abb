import os
import sys

# `python -m orchestrator` puts the working directory first on sys.path, where a user's tasks.py
# would hide orch's own `tasks` package. orch finds the user's modules itself (kinds/registry.py);
# the directory stays only where orch itself comes from it.
_here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
if not sys.flags.safe_path and sys.path and os.path.realpath(sys.path[0] or ".") != _here:
    del sys.path[0]

from orchestrator.shortcut import main  # noqa: E402

main()
