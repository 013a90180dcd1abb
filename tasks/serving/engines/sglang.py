"""SGLang, as orch knows it.

- Launch: `python3 -m sglang.launch_server --model-path MODEL` (sglang/launch_server.py, flags
  in sglang/srt/server_args.py): `--speculative-algorithm`, `--speculative-draft-model-path`,
  and for chain drafting all three of `--speculative-num-steps` (k), `--speculative-eagle-topk`
  (1), `--speculative-num-draft-tokens` (k + 1): it asserts on a partial set.
  `--max-running-requests` caps running requests; in speculative mode SGLang resets it to 48
  unless it is set (server_args.py), a known cause of capped peaks. `--enable-metrics`.
- What it is: `/server_info` (`/get_server_info` before it, deprecated since;
  sglang/srt/entrypoints/http_server.py): its server args as it resolved them (the
  speculative ones, the KV budget, the attention backend) and its version. The CUDA-graph max
  decode batch moved from `cuda_graph_max_bs` into `cuda_graph_config.decode.max_bs`.
- Streams: the OpenAI API, and its native `/generate` (`text` is the whole text so far,
  `meta_info` the running counts).
- Acceptance: per request, on `/generate` only, in `meta_info`
  (sglang/srt/managers/tokenizer_manager.py, `_calculate_spec_decoding_metrics`):
  `spec_verify_ct` (verify passes), `spec_num_correct_drafts`, `spec_num_proposed_drafts`
  (= spec_verify_ct x (speculative_num_draft_tokens - 1)); present once a verify pass ran.
  tau = 1 + correct drafts / verify passes and k = proposed / verify passes, as vLLM's
  counters give them. SGLang's own accept length (output tokens / verify passes) also counts
  each answer's first token, made by the prefill: kept beside as `engine_accept_length`. Its
  logged acceptance rate changed meaning at PR #23530 (from tau/(k+1) to the strict
  (tau-1)/k): a result must say which (`rate_definition` None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from probes import http
from tasks.serving.engines.base import Counts, Engine, Launch, Measured, Request, Stream, summed

NATIVE = "sglang"  # the API name of /generate in plans (bench.serve's `api`)
SPECULATIVE_CAP = 48  # max_running_requests SGLang sets for speculative decoding
# What /server_info says that a result needs.
SETTINGS = (
    "version",
    "max_running_requests",
    "max_total_tokens",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "attention_backend",
    "dtype",
    "device",
    "tp_size",
)
META_COUNTS = {  # meta_info's per-request counters, by orch's names for them
    "verify_passes": "spec_verify_ct",
    "correct_drafts": "spec_num_correct_drafts",
    "proposed_drafts": "spec_num_proposed_drafts",
}


class Sglang(Engine):
    name = "sglang"
    title = "SGLang"
    launcher = ("python3", "-m", "sglang.launch_server")
    api = NATIVE
    acceptance_api = NATIVE
    acceptance_source = (
        "SGLang /generate meta_info per request (spec_verify_ct, spec_num_correct_drafts, "
        "spec_num_proposed_drafts), summed over the level's windows"
    )
    rate_definition = None

    def command(self, p: Launch) -> list[str]:
        assert p.model is not None
        argv = [*(p.launcher or self.launcher), "--model-path", p.model, *p.common_flags()]
        argv += ["--tp-size", str(p.tensor_parallel), "--enable-metrics"]
        if p.max_running_requests:
            argv += ["--max-running-requests", str(p.max_running_requests)]
        if spec := p.speculative:
            argv += ["--speculative-algorithm", spec.algorithm]
            if spec.draft_model:
                argv += ["--speculative-draft-model-path", spec.draft_model]
            if spec.draft_tokens:  # all three or none: SGLang asserts on a partial set
                argv += [
                    "--speculative-num-steps",
                    str(spec.draft_tokens),
                    "--speculative-eagle-topk",
                    str(spec.topk),
                    "--speculative-num-draft-tokens",
                    str(spec.verify_tokens),
                ]
        return [*argv, *p.extra_args]

    def launch_note(self, p: Launch) -> str | None:
        if p.speculative and p.max_running_requests is None:
            return (
                f"SGLang caps running requests at {SPECULATIVE_CAP} in speculative mode unless "
                "max_running_requests is set"
            )
        return None

    def settings(self, url: str) -> dict[str, Any] | None:
        for path in ("/server_info", "/get_server_info"):
            with contextlib.suppress(http.Unreachable):
                info = http.request_json(url + path)
                if isinstance(info, dict) and "model_path" in info:
                    found = {k: info[k] for k in SETTINGS if info.get(k) is not None}
                    if (graphs := decode_graph_max_bs(info)) is not None:
                        found["cuda_graph_max_bs"] = graphs
                    return found
        return None

    def finding_note(self, key: str, value: Any, p: Launch) -> str | None:
        if key == "max_running_requests" and value == SPECULATIVE_CAP and p.speculative:
            return "SGLang's speculative default: peak throughput will be capped"
        return None

    def request(self, api: str, r: Request) -> tuple[str, dict[str, Any]]:
        if api != NATIVE:
            return super().request(api, r)
        source = {"text": r.text} if r.ids is None else {"input_ids": r.ids}
        return "/generate", {
            **source,
            "stream": True,
            "sampling_params": {
                "max_new_tokens": r.output_tokens,
                "temperature": r.temperature,
                "ignore_eos": r.ignore_eos,
            },
        }

    def read_chunk(self, api: str, data: Mapping[str, Any], out: Stream) -> bool:
        if api != NATIVE:
            return super().read_chunk(api, data, out)
        text: str = data.get("text", "")
        seen, out.seen = out.seen, len(text)
        meta = data.get("meta_info") or {}
        out.output_tokens = int(meta.get("completion_tokens", out.output_tokens))
        out.prompt_tokens = int(meta.get("prompt_tokens", out.prompt_tokens))
        for ours, theirs in META_COUNTS.items():
            if theirs in meta:
                out.counts[ours] = int(meta[theirs])
        return len(text) > seen

    def window_counts(
        self, before: Counts, after: Counts, streams: Sequence[Stream]
    ) -> Counts | None:
        counts = summed([{k: float(v) for k, v in s.counts.items()} for s in streams])
        if counts.get("verify_passes", 0.0) <= 0:
            return None
        return {**counts, "output_tokens": float(sum(s.output_tokens for s in streams))}

    def measure(self, counts: Counts, k: int | None) -> Measured | None:
        verify, tokens = counts.get("verify_passes", 0.0), counts.get("output_tokens", 0.0)
        proposed, correct = counts.get("proposed_drafts", 0.0), counts.get("correct_drafts", 0.0)
        if verify <= 0 or not k:
            return None
        if proposed <= 0:  # an older SGLang: no draft counts; its accept length is tau
            return Measured(tokens / verify, k)
        own = {
            "engine_accept_length": round(tokens / verify, 4),
            "engine_accept_rate": round(correct / proposed, 4),
        }
        return Measured(1 + correct / verify, proposed / verify, own)

    def k_of(self, settings: Mapping[str, Any]) -> int | None:
        """Draft tokens a verify pass checks, the way SGLang counts proposed drafts."""
        if isinstance(tokens := settings.get("speculative_num_draft_tokens"), int) and tokens > 1:
            return tokens - 1
        steps = settings.get("speculative_num_steps")
        return steps if isinstance(steps, int) and steps > 0 else None

    def unmeasured(self, api: str, algorithm: str) -> str:
        if api != NATIVE:
            return (
                f"not measured: SGLang ({algorithm}) reports acceptance per request on its "
                "native /generate only; this benchmark used /v1/completions (api: openai)"
            )
        return (
            f"not measured: the server speculates ({algorithm}) but reported no verify passes "
            "in /generate's meta_info"
        )

    def cap_advice(self, concurrency: int) -> str | None:
        return (
            f"SGLang resets max_running_requests to {SPECULATIVE_CAP} for speculative decoding "
            "unless --max-running-requests is set: re-run with "
            f"--max-running-requests {concurrency} and check --cuda-graph-max-bs before "
            "concluding (0.2)"
        )


def decode_graph_max_bs(info: Mapping[str, Any]) -> int | None:
    """The largest decode batch SGLang captured a CUDA graph for; None where it runs none (a
    CPU or other device, or graphs disabled): a batch above it decodes eagerly, a known cause
    of speculative slow-downs at high concurrency."""
    if info.get("device", "cuda") != "cuda" or info.get("disable_cuda_graph"):
        return None
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    for value in (
        info.get("cuda_graph_max_bs_decode"),
        decode.get("max_bs") if isinstance(decode, dict) else None,
        info.get("cuda_graph_max_bs"),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


ENGINE = Sglang()
