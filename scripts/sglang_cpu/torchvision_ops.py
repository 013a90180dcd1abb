"""Lets the registry's torchvision import beside CPU torch, in SGLang's fixture venv.

The registry has CUDA builds of torchvision only, whose ops library cannot load beside CPU
torch. SGLang imports torchvision at start (decode_jpeg, sglang/srt/utils/common.py), and so
does transformers for its image utilities; torchvision's own import then registers fakes for
two of its ops without checking that they loaded (torchvision/_meta_registrations.py: nms,
qnms) and fails. Declaring those two schemas first lets torchvision import with its ops absent
(`torchvision.extension._has_ops()` False), which a text model never needs.

setup.sh puts this module and a .pth file that calls `install()` into the venv's
site-packages: every interpreter of that venv (SGLang's server and its spawned processes, an
`import sglang` check, the model builder) then declares the schemas just before torchvision is
first imported, and nothing else is imported early.
"""

import importlib.abc
import sys


class _DeclareOpsFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            for op in ("nms", "qnms"):
                torch.library.define(
                    f"torchvision::{op}",
                    "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                )
        return None  # the import itself goes on as usual


def install() -> None:
    if not any(isinstance(f, _DeclareOpsFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeclareOpsFirst())
