"""`python.install` with real pip, real venvs and hand-made wheels, through the real `orch` CLI.

No network: every install is `--no-index` from a local `find_links` folder. One venv (created
by the task itself, in a module fixture) is shared by the tests, since creating one costs ~7 s
here; each test first puts the venv into the state it starts from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import PlanDir, run_orch

TIMEOUT = 180  # seconds for one `orch run` (pip on a loaded 2-core machine is slow)


def _wheel(
    folder: Path, name: str, version: str, modules: dict[str, str], metadata: str = ""
) -> Path:
    """A minimal valid pure-Python wheel: the modules, METADATA, WHEEL and a hashed RECORD."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        **modules,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: orch-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    _wheel(folder, "orchdemo", "1.0", {"orchdemo/__init__.py": "VERSION = '1.0'\n"})
    _wheel(
        folder,
        "orchdemo",
        "2.0",
        {"orchdemo/__init__.py": "VERSION = '2.0'\n"},
        "Provides-Extra: fast\nRequires-Dist: orchfast>=1; extra == 'fast'\n",
    )
    _wheel(folder, "orchfast", "1.0", {"orchfast.py": ""})
    _wheel(
        folder,
        "orchbroken",
        "1.0",
        {"orchbroken/__init__.py": "raise ImportError('libcuda.so.1: cannot open')\n"},
    )
    _wheel(folder, "OrchShim", "1.0", {"oshim/__init__.py": ""})  # imports as oshim
    _wheel(folder, "orchuv", "1.0", {"orchuv.py": ""})
    return folder


def _plan(pdir: PlanDir, venv: Path, wheels: Path, requirement: str, extra: str = "") -> Path:
    return pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: python.install
            params:
              requirement: "{requirement}"
              venv: {venv}
              find_links: {wheels}
              no_index: true
              {extra or "installer: pip"}
    """)


def _run(plan: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return run_orch("run", plan, *args, timeout=TIMEOUT, env=env)


def _findings(plan: Path) -> dict[str, dict[str, Any]]:
    (task,) = json.loads(run_orch("status", "--json", plan).stdout)["tasks"]
    return {f["key"]: f for f in task["findings"]}


def _log(plan: Path) -> str:
    return run_orch("logs", plan, "a").stdout


def _in_venv(venv: Path, code: str) -> str:
    return subprocess.run(
        [venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> tuple[Path, Any]:
    """The task creates a venv and installs orchdemo 1.0 into it: (plan, run result)."""
    root = tmp_path_factory.mktemp("first")
    plan = _plan(PlanDir(root), root / "venv", wheels, "orchdemo==1.0")
    return plan, _run(plan)


@pytest.fixture
def venv(first: tuple[Path, Any]) -> Path:
    plan, result = first
    assert result.returncode == 0, result.stdout + result.stderr
    return plan.parent / "venv"


def test_creates_the_venv_and_installs(first: tuple[Path, Any], venv: Path) -> None:
    """A missing venv is created with pip; the pinned version is installed and imports."""
    plan, _ = first
    found = _findings(plan)
    assert found["version"]["value"] == "1.0" and found["version"]["unit"] is None
    assert found["changed"]["value"] is True
    assert found["changed"]["note"] == "orchdemo is not installed"
    assert found["installer"]["value"] == "pip"
    assert found["import_seconds"]["unit"] == "s"
    assert found["import_seconds"]["note"] == "import orchdemo"
    assert (venv / "pyvenv.cfg").exists()
    assert _in_venv(venv, "import orchdemo; print(orchdemo.VERSION)") == "1.0"
    log = _log(plan)
    assert "-m venv" in log and "-m pip install" in log and "orchdemo==1.0" in log


def test_rerun_when_satisfied_runs_no_installer(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """Re-running a satisfied install is `ok`, changed=false, and starts no process at all."""
    plan = _plan(pdir, venv, wheels, "orchdemo==1.0")
    assert _run(plan).returncode == 0
    r = _run(plan, "--rerun", "a")
    assert r.returncode == 0, r.stderr
    found = _findings(plan)
    assert found["changed"]["value"] is False
    assert found["changed"]["note"] == "already satisfied"
    assert found["version"]["value"] == "1.0"
    assert "installer" not in found
    log = _log(plan)
    assert "orchdemo==1.0 is already satisfied" in log
    # Every process Context.run starts is logged as `$ argv`: none ran, so no pip, no network.
    assert not [line for line in log.splitlines() if line.startswith("$ ")], log


def test_upgrade_to_another_pin(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """Changing the pin to 2.0 (and --rerun) installs 2.0 over 1.0."""
    assert _run(_plan(pdir, venv, wheels, "orchdemo==1.0")).returncode == 0
    plan = _plan(pdir, venv, wheels, "orchdemo==2.0")
    r = _run(plan, "--rerun", "a")
    assert r.returncode == 0, r.stderr
    found = _findings(plan)
    assert found["version"]["value"] == "2.0"
    assert found["changed"]["value"] is True
    assert found["changed"]["note"] == "orchdemo 1.0 does not satisfy ==2.0"
    assert _in_venv(venv, "import orchdemo; print(orchdemo.VERSION)") == "2.0"


def test_missing_extra_is_not_satisfied(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """orchdemo 2.0 installed without its extra: `orchdemo[fast]==2.0` installs orchfast."""
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "uninstall", "-yq", "orchfast"],
        check=True,
        capture_output=True,
    )
    assert _run(_plan(pdir, venv, wheels, "orchdemo==2.0")).returncode == 0
    plan = _plan(pdir, venv, wheels, "orchdemo[fast]==2.0")
    r = _run(plan, "--rerun", "a")
    assert r.returncode == 0, r.stderr
    found = _findings(plan)
    assert found["changed"]["value"] is True
    assert found["changed"]["note"] == ("extra [fast] needs orchfast>=1: orchfast is not installed")
    assert _in_venv(venv, "import importlib.metadata as m; print(m.version('orchfast'))") == "1.0"
    assert _run(plan, "--rerun", "a").returncode == 0
    assert _findings(plan)["changed"]["note"] == "already satisfied"


def test_unsatisfiable_fails_with_pips_message(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """No wheel for the pin: the task fails with pip's own last line."""
    r = _run(_plan(pdir, venv, wheels, "orchdemo==3.0"))
    assert r.returncode == 1
    todo = pdir.todo("a")
    assert todo["status"] == "failed"
    assert "No matching distribution found for orchdemo==3.0" in todo["last_error"]


def test_import_failure_fails_the_install(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """Installed but failing to import is a failure, with the import error."""
    r = _run(_plan(pdir, venv, wheels, "orchbroken"))
    assert r.returncode == 1
    assert pdir.todo("a")["last_error"] == (
        "orchbroken 1.0 is installed but `import orchbroken` fails: "
        "ImportError: libcuda.so.1: cannot open"
    )


def test_import_name_from_the_distribution(pdir: PlanDir, venv: Path, wheels: Path) -> None:
    """A project whose module has another name (PyYAML -> yaml) is imported by that name."""
    plan = _plan(pdir, venv, wheels, "OrchShim>=1")
    r = _run(plan)
    assert r.returncode == 0, r.stderr
    assert _findings(plan)["import_seconds"]["note"] == "import oshim"


def test_uv_when_on_path(pdir: PlanDir, venv: Path, wheels: Path, tmp_path: Path) -> None:
    """installer auto picks uv from PATH and calls `uv pip install --python VENV ...`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "uv-argv"
    uv = bin_dir / "uv"
    # A stand-in for uv: records its argv, then does the install with the venv's pip.
    uv.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        printf '%s\\n' "$@" > {argv_file}
        shift 2
        py=${{1#--python=}}; shift
        exec "$py" -m pip install --disable-pip-version-check "$@"
    """)
    )
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    plan = _plan(pdir, venv, wheels, "orchuv==1.0", extra="installer: auto")
    r = _run(plan, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert _findings(plan)["installer"]["value"] == "uv"
    assert argv_file.read_text().splitlines() == [
        "pip",
        "install",
        f"--python={venv}/bin/python",
        "--no-index",
        f"--find-links={wheels}",
        "orchuv==1.0",
    ]


def test_never_writes_into_a_foreign_directory(pdir: PlanDir, tmp_path: Path, wheels: Path) -> None:
    """create: false with no venv fails; a non-empty non-venv directory is left untouched."""
    missing = tmp_path / "nope"
    r = _run(_plan(pdir, missing, wheels, "orchdemo", extra="create: false"))
    assert r.returncode == 1
    assert pdir.todo("a")["last_error"] == f"no virtual environment at {missing} (create: false)"
    assert not missing.exists()
    other = tmp_path / "data"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    r = _run(_plan(pdir, other, wheels, "orchdemo"), "--rerun", "a")
    assert r.returncode == 1
    assert "exists but is not a working virtual environment" in pdir.todo("a")["last_error"]
    assert [p.name for p in other.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("orchdemo===", "is not a PEP 508 requirement: Expected"),
        ("orchdemo @ file:///w/orchdemo-1.0-py3-none-any.whl", "put the file in `find_links`"),
        ("orchdemo; sys_platform == 'linux'", "use the task's `when`"),
    ],
)
def test_bad_requirement_is_a_plan_error(pdir: PlanDir, requirement: str, says: str) -> None:
    """An invalid, URL or marker requirement is refused when the plan loads, with its line."""
    plan = pdir.write(f"""
        name: t
        tasks:
          - id: a
            kind: python.install
            params:
              venv: /nonexistent/venv
              requirement: "{requirement}"
    """)
    r = run_orch("validate", plan)
    assert r.returncode == 2
    assert f"{plan}:8: " in r.stderr and "requirement" in r.stderr and says in r.stderr, r.stderr
