"""Ansible action plugin `orch_host`: orch's host command on one host, its payload on stdin.

One shell command over the connection Ansible already holds (`_low_level_execute_command`, as
the `raw` module does, with `become` when the inventory asks for it), not a module: the host
starts one Python, orch's, instead of Ansible's module wrapper and then orch. What comes back
(rc, stdout, stderr) is judged by orch's controller from the event stream, never here:
`failed` stays false. A host Ansible cannot reach is Ansible's to say (unreachable).
"""

from __future__ import annotations

import shlex
from typing import Any

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible ships no types
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: Any = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        command = shlex.join(str(a) for a in self._task.args["argv"])
        stdin = str(self._task.args["stdin"]).encode()
        done = self._low_level_execute_command(command, in_data=stdin)
        return {**result, "rc": done["rc"], "stdout": done["stdout"], "stderr": done["stderr"],
                "changed": True}  # fmt: skip
