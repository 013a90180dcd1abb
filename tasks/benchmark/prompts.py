"""The prompts of a benchmark: a JSONL dataset, or generated words; cut to an exact token length
by the server's own tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

from orchestrator import TaskError
from probes import http
from tasks.benchmark.params import BenchParams, Prompt, Target
from tasks.benchmark.words import WORDS


def load_prompts(p: BenchParams) -> list[Prompt]:
    """The dataset's prompts, or generated ones: `input_words` words each (seeded)."""
    if p.dataset is None:
        rnd = random.Random(p.seed)
        return [
            Prompt(" ".join(rnd.choice(WORDS) for _ in range(p.input_words)), p.output_tokens)
            for _ in range(max(p.requests, 1))
        ]
    path = Path(p.dataset)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TaskError(f"dataset {path}: {exc.strerror}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(
                Prompt(str(row["prompt"]), int(row.get("output_tokens", p.output_tokens)))
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskError(f'{path}:{number}: not a {{"prompt": ...}} line ({exc})') from None
    if not prompts:
        raise TaskError(f"dataset {path} has no prompts")
    return prompts


def exact_lengths(target: Target, prompts: list[Prompt], tokens: int) -> list[Prompt]:
    """Each prompt cut to exactly `tokens` tokens by the server's own tokenizer (its adapter's
    `tokenize`), then sent as token ids: input length fixed in the unit the server counts."""
    adapter = target.adapter
    out = []
    for prompt in prompts:
        try:
            ids = adapter.tokenize(target.url, target.model, prompt.text)
        except http.Unreachable as exc:
            raise TaskError(
                f"input_tokens needs the server's tokenizer: {exc}; use input_words or a dataset"
            ) from None
        if ids is None:
            raise TaskError(
                f"input_tokens needs a tokenizer endpoint, and {adapter.title} has none orch "
                "knows (tasks/serving/engines): use input_words or a dataset"
            )
        if len(ids) < tokens:
            raise TaskError(
                f"a generated prompt is only {len(ids)} tokens; raise input_words above {tokens}"
            )
        out.append(Prompt(prompt.text, prompt.output_tokens, ids[:tokens]))
    return out
