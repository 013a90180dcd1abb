"""One adapter per serving engine (engines/base.py says what an adapter says). Adding an engine
is one module here and its line in ENGINES; nothing else of orch names an engine.

The order is the order a server of unknown kind is asked what it is (`identify`): SGLang's
/server_info names its model path, an unmistakable answer; vLLM's /version is asked after.
"""

from __future__ import annotations

from typing import Any

from tasks.serving.engines import llamacpp, sglang, vllm
from tasks.serving.engines.base import OPENAI, Engine

__all__ = ["ENGINES", "GENERIC", "OPENAI", "Engine", "apis", "engine", "identify"]

ENGINES: dict[str, Engine] = {e.name: e for e in (sglang.ENGINE, vllm.ENGINE, llamacpp.ENGINE)}
GENERIC = Engine()  # any other OpenAI-compatible server


def engine(name: str | None) -> Engine:
    """The adapter of `name`; the generic one for None or a name no adapter has."""
    return ENGINES.get(name or "", GENERIC)


def identify(url: str, name: str | None = None) -> dict[str, Any]:
    """What a running server says of itself, as {"flavour": ..., settings}: asked as `name`,
    or as each engine in turn; {} when none recognises it."""
    for candidate in [ENGINES[name]] if name in ENGINES else list(ENGINES.values()):
        if (settings := candidate.settings(url)) is not None:
            return {"flavour": candidate.name, **settings}
    return {}


def apis() -> list[str]:
    """The APIs bench.serve can speak: OpenAI's and each engine's own."""
    return [OPENAI, *sorted({e.api for e in ENGINES.values()} - {OPENAI})]
