"""What orch reads from SGLang, as sample documents: the unit tests feed these to the parsers,
and tests/test_sglang.py checks that a real SGLang (the pinned build of
scripts/sglang_cpu/setup.sh) still answers with every key here, of the same type. A format
SGLang changes then fails that test here, not the flagship on a GPU host.

Sources at the pinned commit: `/generate`'s streamed chunks and their meta_info,
sglang/srt/managers/tokenizer_manager.py (`_calculate_spec_decoding_metrics` adds the spec_*
keys once a verify pass ran); `/server_info`, sglang/srt/entrypoints/http_server.py (the
server args, plus `version`).
"""

from __future__ import annotations

from typing import Any

# The last chunk of a streamed /generate to a speculative server (its running counts final).
GENERATE_FINAL_CHUNK: dict[str, Any] = {
    "text": "Hello there",
    "meta_info": {
        "id": "x",
        "finish_reason": {"type": "length", "length": 256},
        "prompt_tokens": 42,
        "completion_tokens": 256,
        "spec_verify_ct": 155,
        "spec_accept_length": 1.65,
        "spec_num_correct_drafts": 100,
        "spec_num_proposed_drafts": 465,
    },
}

# /server_info of a speculative server: the keys tasks/serving/launch.py engine_settings reads.
SERVER_INFO: dict[str, Any] = {
    "model_path": "/models/target",
    "version": "0.5.23",
    "max_running_requests": 48,
    "max_total_tokens": 16384,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "attention_backend": "fa3",
    "dtype": "auto",
    "device": "cuda",
    "tp_size": 8,
}


def missing(sample: dict[str, Any], real: dict[str, Any], where: str = "") -> list[str]:
    """What the sample has that the real document lacks, or holds as another type (an int
    where a float is expected is the same number in JSON, so it passes)."""
    out = []
    for key, value in sample.items():
        path = f"{where}{key}"
        if key not in real:
            out.append(f"{path}: absent")
        elif isinstance(value, dict):
            if isinstance(real[key], dict):
                out += missing(value, real[key], path + ".")
            else:
                out.append(f"{path}: {type(real[key]).__name__}, not an object")
        elif not (
            type(real[key]) is type(value) or (isinstance(value, float) and type(real[key]) is int)
        ):
            out.append(f"{path}: {type(real[key]).__name__}, not {type(value).__name__}")
    return out
