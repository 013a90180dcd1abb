"""structlog for the run: readable lines on the terminal, JSON lines in a file per run."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog

from .redact import mask_value
from .terminal import clean, use_color

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,  # nothing orch logs: the live board shows the run
}


def _masked(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return {k: mask_value(v) for k, v in event.items()}


def configure(events_path: Path | None, console_level: str = "info") -> TextIO | None:
    """Route structlog events to the run's JSON-lines file and, above a level, to stderr.

    Returns the open events file (the caller closes it at the end of the run).
    """
    sink = events_path.open("a", encoding="utf-8", buffering=1) if events_path else None
    threshold = LEVELS[console_level]

    def tee(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if sink is not None:
            sink.write(json.dumps(event, default=str) + "\n")
        if LEVELS.get(method, logging.INFO) < threshold:
            raise structlog.DropEvent
        event.pop("run", None)  # the terminal knows which run it is watching
        event["timestamp"] = str(event.get("timestamp", ""))[11:19]  # HH:MM:SS of the ISO time
        # The file above keeps exact values (JSON escapes them); the terminal gets no escapes.
        return {k: clean(v, multiline=False) if isinstance(v, str) else v for k, v in event.items()}

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            _masked,  # before both sinks: a secret reaches neither events.jsonl nor the terminal
            tee,
            structlog.dev.ConsoleRenderer(
                colors=use_color(sys.stderr), pad_event_to=18, sort_keys=False
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    return sink
