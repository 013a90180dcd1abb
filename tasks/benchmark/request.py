"""One streaming request, timed at the client: the body and the chunks are the engine adapter's
(tasks/serving/engines), the clock is ours."""

from __future__ import annotations

import json
import time
from typing import Any

from tasks.benchmark.params import BenchParams, Outcome, Prompt, Target
from tasks.serving.engines.base import Request, Stream


async def one_request(session: Any, target: Target, prompt: Prompt, p: BenchParams) -> Outcome:
    import aiohttp

    adapter = target.adapter
    asked = Request(target.model, prompt.text, prompt.ids, prompt.output_tokens,
                    p.temperature, p.ignore_eos)  # fmt: skip
    path, body = adapter.request(target.api, asked)
    out = Outcome(ok=False, asked=prompt.output_tokens)
    stream = Stream()
    sent = time.perf_counter()
    last = sent
    try:
        async with session.post(target.url + path, json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            buffer = b""
            async for data in resp.content.iter_any():  # whatever arrived: fewer wake-ups
                buffer = (buffer + data).replace(b"\r\n", b"\n")  # either SSE line end
                *events, buffer = buffer.split(b"\n\n")
                now = time.perf_counter()
                for event in events:
                    payload = event.strip().removeprefix(b"data:").strip()
                    if not payload or payload == b"[DONE]" or payload.startswith(b":"):
                        continue
                    if adapter.read_chunk(target.api, json.loads(payload), stream):
                        if out.ttft == 0.0:
                            out.ttft = now - sent
                        else:
                            out.itl.append(now - last)
                        last = now
        out.latency = last - sent
        out.ok = out.ttft > 0.0
        if not out.ok:
            out.error = "no token came back"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.output_tokens, out.prompt_tokens = stream.output_tokens, stream.prompt_tokens
    out.counts = stream.counts
    return out
