"""vLLM, as orch knows it.

- Launch: `vllm serve MODEL` (vllm/entrypoints/cli/serve.py); speculative decoding is one
  JSON flag, `--speculative-config {"method", "model", "num_speculative_tokens", ...}`
  (vllm/config/speculative.py); k is `num_speculative_tokens`; `--max-num-seqs` caps running
  requests.
- What it is: `/version` (vllm/entrypoints/openai/api_server.py) answers `{"version"}`; it
  reports no resolved settings, so the cap orch knows is the one the launch set.
- Streams: the OpenAI API only (/v1/completions, `stream_options.include_usage` for counts);
  `POST /tokenize` cuts a prompt with the server's own tokenizer.
- Acceptance: counters on `/metrics`, not per request (vllm/v1/spec_decode/metrics.py):
  `vllm:spec_decode_num_drafts_total` (verify steps), `..._num_draft_tokens_total` (proposed),
  `..._num_accepted_tokens_total` (accepted), `..._num_accepted_tokens_per_pos_total{position}`.
  Read before and after each window; tau = 1 + accepted / drafts, k = proposed / drafts. Its
  own rate, accepted / proposed, is the strict definition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from probes import http
from tasks.serving.engines.base import Launch, SpecDecodeCounters


class Vllm(SpecDecodeCounters):
    name = "vllm"
    title = "vLLM"
    launcher = ("vllm", "serve")
    metrics_prefix = "vllm:spec_decode_"
    acceptance_source = "vLLM /metrics vllm:spec_decode_* counters, the level's windows' deltas"

    def command(self, p: Launch) -> list[str]:
        assert p.model is not None
        argv = [*(p.launcher or self.launcher), p.model, *p.common_flags()]
        argv += ["--tensor-parallel-size", str(p.tensor_parallel)]
        if p.max_running_requests:
            argv += ["--max-num-seqs", str(p.max_running_requests)]
        if spec := p.speculative:
            config: dict[str, Any] = {"method": spec.algorithm}
            if spec.draft_model:
                config["model"] = spec.draft_model
            if spec.draft_tokens:
                config["num_speculative_tokens"] = spec.draft_tokens
            argv += ["--speculative-config", json.dumps({**config, **spec.config})]
        return [*argv, *p.extra_args]

    def settings(self, url: str) -> dict[str, Any] | None:
        try:
            answer = http.request_json(url + "/version")
        except http.Unreachable:
            return None
        version = answer.get("version") if isinstance(answer, dict) else None
        return {"version": version} if version else None

    def configured(self, p: Launch) -> dict[str, Any]:
        return {"max_running_requests": p.max_running_requests}

    def tokenize(self, url: str, model: str, text: str) -> list[int] | None:
        """POST /tokenize (vllm/entrypoints/openai/api_server.py): {"tokens": [...]}."""
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in http.request_json(url + "/tokenize", body).get("tokens") or []]

    def k_of(self, settings: Mapping[str, Any]) -> int | None:
        return None  # /version says no more; k is the plan's num_speculative_tokens

    def unmeasured(self, api: str, algorithm: str) -> str:
        return (
            f"not measured: the server speculates ({algorithm}) but reported no verify passes "
            "in its /metrics counters"
        )


ENGINE = Vllm()
