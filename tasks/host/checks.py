"""Preconditions about the host that any plan can use: ports, disk space, Python packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator import CheckResult, Precondition
from orchestrator.core.sizes import parse_size
from probes.procs import listeners


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


class PortParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535)
    host: str | None = Field(None, description="only listeners on this address (default any)")


class PortFree(Precondition[PortParams]):
    """Nothing listens on the TCP port (e.g. the old server released it)."""

    Params = PortParams

    def check(self) -> CheckResult:
        held = listeners(self.params.port, self.params.host)
        if not held:
            return CheckResult(True, f"port {self.params.port} is free")
        who = "; ".join(
            f"{h.address}:{h.port} by {h.process.label() if h.process else 'an unseen process'}"
            for h in held
        )
        return CheckResult(False, f"port {self.params.port} is held: {who}")


class DiskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    min_free: int = Field(description="e.g. 600GiB")

    _size = field_validator("min_free", mode="before")(parse_size)


class DiskFree(Precondition[DiskParams]):
    """The file system holding `path` has at least `min_free` bytes available."""

    Params = DiskParams

    def check(self) -> CheckResult:
        path = Path(self.params.path)
        probe = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
        free = shutil.disk_usage(probe).free
        ok = free >= self.params.min_free
        return CheckResult(
            ok,
            f"{probe} has {format_size(free)} free"
            + ("" if ok else f", needs {format_size(self.params.min_free)}"),
        )


class PackageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    package: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="distribution")
    version: str | None = Field(None, description="a version specifier, e.g. '>=0.5.23,<0.6'")
    python: str | None = Field(None, description="interpreter of the target environment")
    import_name: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")

    @field_validator("version")
    @classmethod
    def _valid_spec(cls, spec: str | None) -> str | None:
        if spec is not None:
            from packaging.specifiers import SpecifierSet

            SpecifierSet(spec)  # InvalidSpecifier is a ValueError: a plan error with its line
        return spec


# Run in the target interpreter: the version installed there, whether it imports and how long
# that took. sys.path[0] is the cwd under `-c`: a source checkout there must not pass for installed.
_PROBE = """
import importlib, importlib.metadata as md, json, sys, time
if sys.path and sys.path[0] == "":
    del sys.path[0]
name, mod = sys.argv[1], sys.argv[2]
try:
    version = md.version(name)
except md.PackageNotFoundError:
    print(json.dumps({"version": None})); raise SystemExit
started = time.perf_counter()
try:
    importlib.import_module(mod); error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"version": version, "import_error": error,
                  "seconds": time.perf_counter() - started}))
"""


@dataclass(frozen=True)
class PackageProbe:
    """What an interpreter says about one distribution."""

    version: str | None  # None: not installed
    import_error: str | None = None
    import_seconds: float = 0.0


def default_import_name(package: str) -> str:
    """The module a distribution is assumed to provide: `flash-attn` -> `flash_attn`."""
    return package.replace("-", "_").split("[")[0]


def probe_package(
    python: str, package: str, module: str, timeout: float = 120.0
) -> PackageProbe | None:
    """Ask `python` for `package`'s version and whether `module` imports; None: could not ask.

    The import runs with a temp folder of its own, removed after: importing vllm makes torch's
    inductor cache there, which would otherwise stay in the host's /tmp."""
    try:
        with tempfile.TemporaryDirectory(prefix="orch-probe-") as tmp:
            out = subprocess.run(
                [python, "-c", _PROBE, package, module],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "TMPDIR": tmp},
            )
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return PackageProbe(info["version"], info.get("import_error"), info.get("seconds", 0.0))


class PythonPackage(Precondition[PackageParams]):
    """A Python distribution is installed (in `python`'s environment), at a version, and imports."""

    Params = PackageParams
    code_params = frozenset({"package", "python", "import_name"})  # it imports the module

    def check(self) -> CheckResult:
        p = self.params
        python = p.python or sys.executable
        info = probe_package(python, p.package, p.import_name or default_import_name(p.package))
        if info is None:
            return CheckResult(False, f"cannot ask {python} about {p.package}")
        version = info.version
        if version is None:
            return CheckResult(False, f"{p.package} is not installed for {python}")
        if p.version is not None:
            from packaging.specifiers import SpecifierSet

            if not SpecifierSet(p.version).contains(version, prereleases=True):
                return CheckResult(False, f"{p.package} {version} does not satisfy {p.version}")
        if info.import_error:
            return CheckResult(
                False, f"{p.package} {version} fails to import: {info.import_error[:200]}"
            )
        return CheckResult(True, f"{p.package} {version} imports")
