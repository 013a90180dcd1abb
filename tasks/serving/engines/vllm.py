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
from collections.abc import Mapping, Sequence
from typing import Any

from probes import http
from tasks.serving.engines.base import Counts, Engine, Launch, Measured, Stream

SPEC_METRICS = "vllm:spec_decode_"


class Vllm(Engine):
    name = "vllm"
    title = "vLLM"
    launcher = ("vllm", "serve")
    acceptance_source = "vLLM /metrics vllm:spec_decode_* counters, the level's windows' deltas"
    rate_definition = "strict"  # accepted / proposed, always

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

    def counters(self, url: str) -> Counts:
        try:
            text = http.request(url + "/metrics").decode()
        except http.Unreachable:
            return {}  # no /metrics: no acceptance figures, not a failed benchmark
        samples = http.metric_samples(text, SPEC_METRICS)
        names = {"drafts": "num_drafts", "proposed": "num_draft_tokens",
                 "accepted": "num_accepted_tokens"}  # fmt: skip
        out = {ours: http.total(samples, f"{SPEC_METRICS}{n}_total") for ours, n in names.items()}
        positions = {
            key.partition("position=")[2].split(",")[0].rstrip("}")
            for key in samples
            if key.startswith(f"{SPEC_METRICS}num_accepted_tokens_per_pos")
        }
        for pos in sorted(positions, key=int):
            out[f"pos{pos}"] = http.total(
                samples, f"{SPEC_METRICS}num_accepted_tokens_per_pos_total", position=pos
            )
        return out if any(samples) else {}

    def window_counts(
        self, before: Counts, after: Counts, streams: Sequence[Stream]
    ) -> Counts | None:
        if not before:
            return None
        delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
        return delta if delta.get("drafts", 0.0) > 0 else None

    def measure(self, counts: Counts, k: int | None) -> Measured | None:
        drafts = counts.get("drafts", 0.0)
        if drafts <= 0:
            return None
        figures: dict[str, Any] = {}
        positions = sorted(
            (key for key in counts if key.startswith("pos")), key=lambda x: int(x[3:])
        )
        if positions:
            figures["per_position"] = [round(counts[key] / drafts, 4) for key in positions]
        tau = 1 + counts.get("accepted", 0.0) / drafts
        return Measured(tau, counts.get("proposed", 0.0) / drafts, figures)

    def k_of(self, settings: Mapping[str, Any]) -> int | None:
        return None  # /version says no more; k is the plan's num_speculative_tokens

    def unmeasured(self, api: str, algorithm: str) -> str:
        return (
            f"not measured: the server speculates ({algorithm}) but reported no verify passes "
            "in its /metrics counters"
        )


ENGINE = Vllm()
