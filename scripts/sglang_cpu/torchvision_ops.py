"""Lets the registry's torchvision import beside CPU torch: `import torchvision_ops` first.

The registry has CUDA builds of torchvision only, whose ops library cannot load beside CPU
torch. SGLang imports torchvision at start (decode_jpeg, sglang/srt/utils/common.py), and so
does transformers for its image utilities; torchvision's own import then registers fakes for
two of its ops without checking that they loaded (torchvision/_meta_registrations.py: nms,
qnms) and fails. Declaring those two schemas first lets torchvision import with its ops absent
(`torchvision.extension._has_ops()` False), which a text model never needs.
"""

import torch

for _op in ("nms", "qnms"):
    torch.library.define(
        f"torchvision::{_op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
    )
