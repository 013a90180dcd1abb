"""llama.cpp's server (`llama-server`), as orch knows it. Sources: llama.cpp's tools/server/
(server.cpp routes, server-context.cpp /props, server-task.cpp /metrics) and common/arg.cpp
(flags), as vendored by llama-cpp-python 0.3.36 (scripts/llamacpp/setup.sh builds it).

- Launch: `llama-server -m MODEL.gguf --host --port --alias NAME` (`--alias`: the served name;
  without one orch passes the model's path, which /v1/models then lists). `--parallel N`: the
  slots, requests served at once (orch's max_running_requests). `--metrics` turns /metrics on.
  Speculative decoding: `--spec-type` (the algorithm: draft-simple with a draft model,
  ngram-simple, ngram-mod, ... none), `--spec-draft-model DRAFT.gguf`, `--spec-draft-n-max k`
  (at most k drafts a step; fewer where the draft is unsure: k is measured, proposed / steps).
  No tensor parallelism: one process, its GPUs by `--split-mode` in extra_args.
- What it is: `GET /props`: `build_info` (its version, `b<N>-<commit>`), `total_slots`,
  `model_path`; /v1/models lists the alias, owned by "llamacpp".
- Streams: the OpenAI API (/v1/completions, `stream_options.include_usage` for counts).
- Acceptance: counters on /metrics named after vLLM's (server-task.cpp):
  `llamacpp:spec_decode_num_drafts_total` (verification steps), `..._num_draft_tokens_total`
  (drafted), `..._num_accepted_tokens_total` (accepted), and
  `..._num_accepted_tokens_per_pos_total{position}`; its log's "draft acceptance" is accepted /
  drafted, the strict definition, and its "mean len" 1 + accepted / steps, orch's tau.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator import TaskError
from probes import http
from tasks.serving.engines.base import Launch, SpecDecodeCounters


class LlamaCpp(SpecDecodeCounters):
    name = "llamacpp"
    title = "llama.cpp"
    launcher = ("llama-server",)
    metrics_prefix = "llamacpp:spec_decode_"  # its counters are named after vLLM's
    acceptance_source = (
        "llama.cpp /metrics llamacpp:spec_decode_* counters, the level's windows' deltas"
    )
    # It answers `Keep-Alive: timeout=5, max=100` but closes the connection after a streamed
    # answer: the next request on it fails to be written (aiohttp: "Can not write request
    # body"), measured here against llama-server b1-0c1e570.
    keep_alive = False

    def command(self, p: Launch) -> list[str]:
        assert p.model is not None
        if p.tensor_parallel > 1:
            raise TaskError(
                "llama.cpp has no tensor_parallel: leave it 1 and split across GPUs with "
                "extra_args [--split-mode, row] (or layer)"
            )
        # Its flags are vLLM's but for the served name: --alias.
        flags = ["--alias" if f == "--served-model-name" else f for f in p.common_flags()]
        if "--alias" not in flags:
            flags += ["--alias", p.model]  # what /v1/models lists, and orch waits for
        argv = [*(p.launcher or self.launcher), "-m", p.model, *flags, "--metrics"]
        if p.max_running_requests:
            argv += ["--parallel", str(p.max_running_requests)]
        if spec := p.speculative:
            argv += ["--spec-type", spec.algorithm]
            if spec.draft_model:
                argv += ["--spec-draft-model", spec.draft_model]
            if spec.draft_tokens:
                argv += ["--spec-draft-n-max", str(spec.draft_tokens)]
        return [*argv, *p.extra_args]

    def settings(self, url: str) -> dict[str, Any] | None:
        try:
            props = http.request_json(url + "/props")
        except http.Unreachable:
            return None
        if not isinstance(props, dict) or "build_info" not in props:
            return None
        found = {
            "version": props.get("build_info"),
            "max_running_requests": props.get("total_slots"),
        }
        params = (props.get("default_generation_settings") or {}).get("params") or {}
        if isinstance(types := params.get("speculative.types"), str) and types != "none":
            found["speculative_algorithm"] = types
        return {k: v for k, v in found.items() if v is not None}

    def tokenize(self, url: str, model: str, text: str) -> list[int] | None:
        """POST /tokenize (server.cpp): {"content", "add_special"} -> {"tokens": [...]}."""
        body = {"content": text, "add_special": False}
        return [int(t) for t in http.request_json(url + "/tokenize", body).get("tokens") or []]

    def k_of(self, settings: Mapping[str, Any]) -> int | None:
        return None  # /props does not say n_max: k is measured, drafted / steps

    def unmeasured(self, api: str, algorithm: str) -> str:
        return (
            f"not measured: the server speculates ({algorithm}) but its /metrics counted no "
            "verification step (llama-server needs --metrics)"
        )

    def cap_advice(self, concurrency: int) -> str | None:
        return (
            "llama-server serves at most --parallel requests at once (its slots): re-run with "
            f"max_running_requests {concurrency}"
        )


ENGINE = LlamaCpp()
