"""`python.install`: install a requirement into a virtual environment, idempotently.

Before installing, the target interpreter is asked what it has (one stdlib-only probe, no pip,
no network). Satisfied means: the distribution is installed at a version the specifier allows
(pre-releases included, as pip treats installed versions), and so is every direct requirement
of each requested extra, evaluated with the target's own markers. Extras are checked rather than
assumed: `sglang[all]` requested where plain `sglang` is installed must install, not report ok.
Only one level is checked (plus extras that name the project itself, like `sglang[all]` ->
`sglang[srt]`); deeper drift is `pip check`'s business. When satisfied, no installer runs.

Otherwise pip (or uv) installs without `--upgrade`: pip then changes only what the requirement
needs. Afterwards the same check runs again and the module is imported in the target
interpreter, so a resolver that quietly picked something else, or a broken build, fails here
rather than when the server starts. A satisfied install that fails to import fails too; it is
not reinstalled unasked (that would need the network, and rarely cures a missing libcuda).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from orchestrator import Context, Task, TaskError, TaskTimeout
from orchestrator.kinds.task import as_list
from tasks.host.checks import default_import_name, probe_package

PROBE_TIMEOUT = 600.0  # seconds for a probe when the task has no timeout (imports can be slow)


StrList = Annotated[list[str], BeforeValidator(as_list)]


class InstallParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requirement: str = Field(description="a PEP 508 requirement, e.g. 'sglang[all]==0.5.23'")
    venv: str = Field(
        description="the virtual environment to install into (a directory; a relative "
        "path starts at the plan's folder, where tasks run)"
    )
    create: bool = Field(True, description="create the venv with `python -m venv` if missing")
    python: str | None = Field(
        None, description="interpreter that creates the venv (default: orch's own)"
    )
    import_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$",
        description="module to import (default: from the project name, else the one top-level "
        "module the distribution installs)",
    )
    index_url: str | None = None
    extra_index_url: StrList = []
    find_links: StrList = []
    no_index: bool = False
    installer: Literal["auto", "pip", "uv"] = Field(
        "auto", description="auto: uv when it is on PATH, else the venv's pip"
    )

    @field_validator("requirement")
    @classmethod
    def _pep508(cls, value: str) -> str:
        try:
            req = Requirement(value)
        except InvalidRequirement as exc:  # its message draws a caret under the bad spot
            first = str(exc).splitlines()[0] if str(exc) else "invalid"
            raise ValueError(f"{value!r} is not a PEP 508 requirement: {first}") from None
        if req.url:
            raise ValueError(
                "a URL requirement cannot be checked for 'already satisfied'; "
                "put the file in `find_links` and pin its version"
            )
        if req.marker:
            raise ValueError("a marker makes no sense for one environment; use the task's `when`")
        return value


# Run in the target interpreter, stdlib only: every installed distribution's version, the
# target's requirements and top-level modules, and the marker environment (as packaging's
# default_environment computes it) so that extras' markers are evaluated for *that* Python.
_INVENTORY = r"""
import importlib.metadata as md, json, os, platform, re, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # the cwd is not part of the environment
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
target = norm(sys.argv[1])
versions, requires, top = {}, [], set()
for d in md.distributions():
    name = d.metadata["Name"]
    if not name or norm(name) in versions:
        continue  # the first on sys.path wins, as for imports
    versions[norm(name)] = d.version
    if norm(name) == target:
        requires = d.requires or []
        text = d.read_text("top_level.txt")
        if text:
            top = set(text.split())
        else:
            for f in d.files or []:
                head = f.parts[0]
                if head == ".." or head.endswith((".dist-info", ".data")) or head == "__pycache__":
                    continue
                top.add(head.split(".")[0] if len(f.parts) == 1 else head)
def ver(info):
    v = "%d.%d.%d" % (info.major, info.minor, info.micro)
    return v if info.releaselevel == "final" else v + info.releaselevel[0] + str(info.serial)
env = {
    "implementation_name": sys.implementation.name,
    "implementation_version": ver(sys.implementation.version),
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(), "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}
print(json.dumps({"versions": versions, "requires": requires, "top": sorted(top), "env": env}))
"""


@dataclass(frozen=True)
class Inventory:
    """What the target environment holds, as far as one requirement is concerned."""

    versions: dict[str, str]  # canonical name -> version
    requires: list[str]  # the target distribution's Requires-Dist
    top: list[str]  # the target distribution's top-level modules
    env: dict[str, str]  # marker environment of the target interpreter

    def unmet(self, req: Requirement) -> str | None:
        """Why `req` is not satisfied here, or None when it is."""
        name = canonicalize_name(req.name)
        if (why := self._version_unmet(req)) is not None:
            return why
        todo, seen = sorted(req.extras), set()
        while todo:
            extra = todo.pop()
            if extra in seen:
                continue
            seen.add(extra)
            for dep in self._extra_requires(extra):
                if canonicalize_name(dep.name) == name:
                    todo += sorted(dep.extras)  # `sglang[all]` -> `sglang[srt]`: same dist
                elif (why := self._version_unmet(dep)) is not None:
                    return f"extra [{extra}] needs {dep.name}{dep.specifier}: {why}"
        return None

    def _version_unmet(self, req: Requirement) -> str | None:
        version = self.versions.get(canonicalize_name(req.name))
        if version is None:
            return f"{req.name} is not installed"
        if not req.specifier.contains(version, prereleases=True):
            return f"{req.name} {version} does not satisfy {req.specifier}"
        return None

    def _extra_requires(self, extra: str) -> list[Requirement]:
        """Requirements that hold with `extra` requested but not without it."""
        found = []
        for line in self.requires:
            try:
                dep = Requirement(line)
            except InvalidRequirement:
                continue  # broken metadata is pip's to report, not a reason to reinstall
            if (
                dep.marker is not None
                and dep.marker.evaluate({**self.env, "extra": extra})
                and not dep.marker.evaluate({**self.env, "extra": ""})
            ):
                found.append(dep)
        return found


class PythonInstall(Task[InstallParams]):
    """Install a requirement into a venv (created if missing); ok without network if satisfied.

    Findings: `version`, `changed` (note: "already satisfied" or what was there before),
    `installer` (when one ran), `import_seconds` (note: the module imported).
    """

    Params = InstallParams
    # What gets installed, from where, into which interpreter, and the module it imports.
    code_params = frozenset(
        {"requirement", "venv", "python", "import_name", "index_url", "extra_index_url",
         "find_links"}
    )  # fmt: skip
    path_params = frozenset({"venv", "python"})  # installs into; runs

    def run(self, ctx: Context) -> None:
        p = self.params
        req = Requirement(p.requirement)
        python = _environment(ctx, p)
        before = _inventory(ctx, python, req.name)
        why = before.unmet(req)
        if why is None:
            ctx.log(f"# {req} is already satisfied in {p.venv}; nothing installed")
            self._verify(ctx, python, req, before, None, note="already satisfied")
            return
        ctx.log(f"# {why}: installing {req}")
        installer, argv = _installer_argv(p, python)
        ctx.run([*argv, str(req)])
        after = _inventory(ctx, python, req.name)
        if (why_after := after.unmet(req)) is not None:
            raise TaskError(f"{installer} finished, but {why_after}")
        self._verify(ctx, python, req, after, installer, note=why)

    def _verify(
        self,
        ctx: Context,
        python: str,
        req: Requirement,
        inv: Inventory,
        installer: str | None,
        note: str,
    ) -> None:
        """Import the module in the target interpreter; record the findings."""
        module = self.params.import_name or _module_for(req.name, inv.top)
        ctx.progress(f"importing {module} in {python}")  # torch-sized imports take a while
        info = probe_package(python, req.name, module, _probe_timeout(ctx))
        if info is None:
            raise TaskError(f"cannot ask {python} whether {module} imports")
        if info.version is None:  # the inventory just saw it: something else is changing the venv
            raise TaskError(f"{req.name} vanished from {python}'s environment")
        if info.import_error:
            hint = (
                ""
                if self.params.import_name or module in inv.top or not inv.top
                else f" (set import_name; it installs: {', '.join(inv.top)})"
            )
            raise TaskError(
                f"{req.name} {info.version} is installed but `import {module}` fails: "
                f"{info.import_error[:300]}{hint}"
            )
        ctx.finding("version", info.version)
        ctx.finding("changed", installer is not None, note=note)
        if installer is not None:
            ctx.finding("installer", installer)
        ctx.finding("import_seconds", round(info.import_seconds, 3), "s", f"import {module}")


def _environment(ctx: Context, p: InstallParams) -> str:
    """The venv's interpreter; the venv is created first when missing (and `create`)."""
    venv = Path(p.venv).expanduser().absolute()
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    existed = venv.exists()
    if existed and (not venv.is_dir() or any(venv.iterdir())):
        # Never write into a directory that holds something else (or a venv whose base Python
        # is gone: its bin/python link is dangling).
        raise TaskError(
            f"{venv} exists but is not a working virtual environment "
            f"(no {python.relative_to(venv)})"
        )
    if not p.create:
        raise TaskError(f"no virtual environment at {venv} (create: false)")
    try:
        ctx.run([p.python or sys.executable, "-m", "venv", str(venv)])
    except BaseException:
        # Half a venv (no pip yet) would pass for one next time; Ctrl-C and timeouts land here.
        if existed:
            for child in venv.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            shutil.rmtree(venv, ignore_errors=True)
        raise
    return str(python)


def _installer_argv(p: InstallParams, python: str) -> tuple[str, list[str]]:
    """The installer's name and its argv up to the requirement (options as --opt=value: a value
    starting with '-' can never be taken for another option)."""
    uv = shutil.which("uv") if p.installer != "pip" else None
    if p.installer == "uv" and uv is None:
        raise TaskError("installer: uv, but there is no uv on PATH")
    if uv is not None:
        name, argv = "uv", [uv, "pip", "install", f"--python={python}"]
    else:
        # No version check (a network call), no prompts, no progress bar redrawn into the log.
        name, argv = (
            "pip",
            [
                python,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--progress-bar=off",
            ],
        )
    if p.no_index:
        argv.append("--no-index")
    if p.index_url:
        argv.append(f"--index-url={p.index_url}")
    argv += [f"--extra-index-url={url}" for url in p.extra_index_url]
    argv += [f"--find-links={link}" for link in p.find_links]
    return name, argv


def _inventory(ctx: Context, python: str, project: str) -> Inventory:
    try:
        out = subprocess.run(
            [python, "-c", _INVENTORY, project],
            capture_output=True,
            text=True,
            timeout=_probe_timeout(ctx),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise TaskTimeout(f"{python} did not list its packages in time") from None
    except OSError as exc:
        raise TaskError(f"cannot run {python}: {exc}") from None
    try:
        data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise TaskError(f"cannot list the packages of {python}: {said[:300]}") from None
    return Inventory(data["versions"], data["requires"], data["top"], data["env"])


def _module_for(project: str, top: list[str]) -> str:
    """The project name as a module if the distribution installs it (or we cannot tell), else
    its only public top-level module: PyYAML -> yaml, Pillow -> PIL."""
    derived = default_import_name(project)
    public = [t for t in top if not t.startswith("_") and t.isidentifier()]
    return public[0] if derived not in top and len(public) == 1 else derived


def _probe_timeout(ctx: Context) -> float:
    remaining = ctx.remaining()
    if remaining is not None and remaining <= 0:
        raise TaskTimeout("timed out")
    return PROBE_TIMEOUT if remaining is None else remaining
