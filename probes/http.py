"""Small synchronous HTTP reads of an inference server: health, models, server info, metrics.

The stdlib's urllib: a readiness poll or a metrics scrape is a handful of requests, not worth
an event loop (the load generator, which is, uses aiohttp). Every failure is one exception,
`Unreachable`, whose text says what happened ("connection refused", "HTTP 503").
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any


class Unreachable(Exception):
    """The request got no usable answer; the text says why."""


def request(url: str, body: Mapping[str, Any] | None = None, timeout: float = 5.0) -> bytes:
    """GET `url` (or POST `body` as JSON); the body of a 2xx answer, else Unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            content: bytes = resp.read()
            return content
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode("utf-8", "replace").strip()
        raise Unreachable(f"HTTP {exc.code}{': ' + detail if detail else ''}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        raise Unreachable(text.lower() if isinstance(text, str) else str(text)) from None
    except (TimeoutError, ConnectionError, OSError) as exc:
        raise Unreachable(
            f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {timeout:g}s"
        ) from None


def request_json(url: str, body: Mapping[str, Any] | None = None, timeout: float = 5.0) -> Any:
    raw = request(url, body, timeout)
    try:
        return json.loads(raw)
    except ValueError:
        raise Unreachable(f"not JSON: {raw[:100]!r}") from None


def metric_samples(text: str, prefix: str) -> dict[str, float]:
    """Prometheus text exposition -> {"name{label=value,...}": value} for samples whose name
    starts with `prefix`, parsed by prometheus-client's own parser. Labels are kept so that a
    per-position counter stays apart; sum over labels with `total`."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def total(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    want = [f"{k}={v}" for k, v in labels.items()]
    found = 0.0
    for key, value in samples.items():
        sample_name, _, rest = key.partition("{")
        if sample_name == name and all(w in rest.rstrip("}").split(",") for w in want):
            found += value
    return found
