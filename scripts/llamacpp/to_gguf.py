"""A tiny model of scripts/vllm_cpu/make_tiny_models.py as GGUF, through llama.cpp's converter.

    python to_gguf.py LLAMA_CPP_SOURCE MODEL_DIR --outfile MODEL.gguf --outtype f32

Run with the vllm-cpu venv's Python (torch, transformers). The tiny models' tokenizer is a
byte-level BPE (ByteLevel pre-tokenizer, no prefix space): GPT-2's, but its vocabulary is not one
the converter has a fingerprint for, so it is told so instead of refusing it.
"""

import sys

sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]  # the converter and its gguf package

import convert_hf_to_gguf  # noqa: E402
from conversion import base  # noqa: E402

for model_class in vars(base).values():
    if isinstance(model_class, type) and "get_vocab_base_pre" in vars(model_class):
        model_class.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
