"""The hosts of an Ansible inventory, in its order, with their variables, as Ansible reads them.

`ansible-inventory --list` parses every format Ansible does (YAML, INI, a folder, a dynamic
script), resolves group and host vars, and applies `--limit`; orch never parses an inventory
itself. Its JSON lists each group's hosts in inventory order; walking the groups from `all`
gives the order a roll goes in.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UsageError
from orchestrator.fleet.ansible import ansible_env, ansible_tool


@dataclass(frozen=True)
class InventoryHost:
    name: str
    vars: dict[str, Any]


def read_inventory(inventory: Path, limit: str | None = None) -> list[InventoryHost]:
    if not inventory.exists():
        raise UsageError(f"{inventory}: no such inventory")
    argv = [ansible_tool("ansible-inventory"), "-i", str(inventory), "--list"]
    if limit:
        argv += ["--limit", limit]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=ansible_env(), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"ansible-inventory could not read {inventory}: {exc}") from None
    said = done.stderr.strip()
    if done.returncode != 0:
        raise UsageError(
            f"ansible-inventory could not read {inventory}: {gist(said or done.stdout)}"
        )
    if "Unable to parse" in said or "did not meet" in said:  # a warning, exit 0, no hosts
        raise UsageError(f"ansible-inventory could not read {inventory}: {gist(said)}")
    data = json.loads(done.stdout)
    hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})
    names: dict[str, None] = {}

    def walk(group: str) -> None:
        entry = data.get(group, {})
        for host in entry.get("hosts", []):
            names.setdefault(host)
        for child in entry.get("children", []):
            walk(child)

    walk("all")
    if not names:
        what = f" matching --limit {limit}" if limit else ""
        raise UsageError(f"{inventory} has no hosts{what}")
    return [InventoryHost(name, hostvars.get(name, {})) for name in names]


def gist(said: str) -> str:
    """Ansible's first parser complaint and where, of the pages it prints for a bad inventory
    (every plugin it tried, each with its traceback-like cause)."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    first = next(
        (
            m.group(1)
            for line in lines
            if (
                m := re.search(
                    r"Failed to parse inventory with '\w+' "
                    r"plugin: (.+)",
                    line,
                )
            )
        ),
        lines[-1] if lines else "(nothing said)",
    )
    origin = next((line[len("Origin: ") :] for line in lines if line.startswith("Origin: /")), None)
    return f"{first} ({origin})" if origin else first
