"""Ansible action plugin `orch_gate`: the playbook of a roll waits here, between batches, for
orch's controller to say whether the next batch goes.

It runs in Ansible's controller-side worker (no connection, nothing runs on a host) at the
start of each gate play (fleet/ansible.py). The controller sees the play begin in the event
stream, records what it decides (the last batch judged, the next one committed `running`) and
then writes `answer` whole (a rename) as `{"go": true|false}`; this plugin reads it. Polling a
file, not a socket: nothing to listen on, and a killed controller leaves no half-open peer.
"Stop" is a failure of the gate play's only host, and a play whose every host failed ends the
playbook (ansible-core's PlaybookExecutor: `break_play`). If the controller's process is gone,
the gate stops too: a playbook orphaned by a SIGKILLed controller must not roll on by itself.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.action import ActionBase

POLL_S = 0.01


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible ships no types
    _requires_connection = False
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: Any = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        path = str(self._task.args["answer"])
        controller = int(self._task.args["controller"])
        while True:
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                break
            except FileNotFoundError:
                pass
            if not alive(controller):
                return {**result, "failed": True, "msg": "orch's controller is gone"}
            time.sleep(POLL_S)
        if doc.get("go") is not True:  # the gate play's one host failed: Ansible ends the playbook
            return {**result, "failed": True, "msg": "orch's controller ends the roll here"}
        return {**result, "changed": False}
