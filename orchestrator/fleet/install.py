"""The controller's orch put on a host that lacks it or runs another build (`--install`).

The controller builds orch and every dependency as wheels once per build (`pip wheel`, from
its checkout: the registry or pip's cache is asked here, never on a host), packs them in one
tar, and an Ansible play per batch copies it to each refusing host, makes the host's venv
(`orch_venv`, with `orch_python`, default python3) and installs from those wheels alone
(`--no-index`): a GPU host that reaches no registry gets the same bytes. The wheels are
built for the controller's Python and platform; a host with another Python minor version
fails its install, and says so (pip's words).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UsageError
from orchestrator.core.safeopen import ensure_private_dir
from orchestrator.fleet.ansible import last_line
from orchestrator.fleet.build import build_id


def source_root() -> Path:
    """The checkout this orch runs from (its pyproject.toml names the project `orch`)."""
    import orchestrator

    root = Path(orchestrator.__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    if not project.is_file() or 'name = "orch"' not in project.read_text(encoding="utf-8"):
        raise UsageError(
            f"--install builds orch from its checkout, and this orch ({root}) is not one: "
            "run the controller from a checkout, or install orch on the hosts yourself"
        )
    return root


def wheelhouse(work: Path) -> Path:
    """`work/wheels-<build>.tar`: orch and its dependencies as wheels; built once a build."""
    # The wheels in it are installed on every host: a link there is refused (core/safeopen.py).
    ensure_private_dir(work, no_links_inside=True)
    build = build_id()
    tar = work / f"wheels-{build}.tar"
    if tar.is_file():
        return tar
    folder = work / f"wheels-{build}"
    shutil.rmtree(folder, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(folder), str(source_root())]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = last_line(done.stderr) or "(nothing)"
        raise UsageError(f"could not build orch's wheels for --install: {said}")
    partial = tar.with_suffix(".partial")
    with tarfile.open(partial, "w") as out:
        for wheel in sorted(folder.glob("*.whl")):
            out.add(wheel, arcname=wheel.name)
    partial.replace(tar)
    shutil.rmtree(folder, ignore_errors=True)
    return tar


def orch_wheel(tar: Path) -> str:
    with tarfile.open(tar) as archive:
        names = [n for n in archive.getnames() if n.startswith("orch-") and n.endswith(".whl")]
    if len(names) != 1:
        raise UsageError(f"{tar} holds {len(names)} orch wheels, not one: remove it")
    return names[0]


def install_tasks(tar: Path) -> list[dict[str, Any]]:
    """The play: copy and unpack the wheels, make the venv, install, clean up. Per host:
    `orch_install[host]` = {"venv", "python", "wheels"} (a folder in the host's orch home)."""
    wheels, venv, python = (
        f"{{{{ orch_install[inventory_hostname].{key} }}}}" for key in ("wheels", "venv", "python")
    )
    pip = [f"{venv}/bin/pip", "install", "-q", "--disable-pip-version-check", "--no-index"]
    return [
        {
            "name": "wheels folder",
            "ansible.builtin.file": {"path": wheels, "state": "directory", "mode": "0700"},
        },
        {
            "name": "wheels",
            "ansible.builtin.unarchive": {"src": str(tar.resolve()), "dest": wheels},
        },
        {
            "name": "venv",
            "ansible.builtin.command": {
                "argv": [python, "-m", "venv", venv],
                "creates": f"{venv}/bin/python",
            },
        },
        {
            "name": "dependencies",
            "ansible.builtin.command": {"argv": [*pip, "--find-links", wheels, "orch"]},
        },
        {
            "name": "this build",  # the same version number may be another build: replace it
            "ansible.builtin.command": {
                "argv": [*pip, "--no-deps", "--force-reinstall", f"{wheels}/{orch_wheel(tar)}"],
            },
        },
        {"name": "done", "ansible.builtin.file": {"path": wheels, "state": "absent"}},
    ]
