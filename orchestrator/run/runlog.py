"""structlog for the run: readable lines on the terminal, JSON lines in a file per run."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import structlog

from orchestrator.core.redact import mask_value
from orchestrator.core.safeopen import open_for_append
from orchestrator.core.terminal import clean, use_color

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,  # nothing orch logs: the live board shows the run
}
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}  # as structlog's add_log_level
# One encoder for every line: json.dumps(default=...) builds a new one per call (~3 us).
_to_json = json.JSONEncoder(default=str).encode


def configure(events_path: Path | None, console_level: str = "info") -> TextIO | None:
    """Route structlog events to the run's JSON-lines file and, above a level, to stderr.

    Returns the open events file (the caller closes it at the end of the run).
    """
    sink = open_for_append(events_path, buffering=1) if events_path else None
    threshold = LEVELS[console_level]

    # One processor for what every event needs (two per task): level, local ISO time, masking,
    # its JSON line; what only the terminal needs happens after the drop. As structlog's
    # add_log_level, TimeStamper(fmt="iso", utc=False) and a masking step would, in one call.
    def record(
        logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event["level"] = _LEVEL_NAMES.get(method, method)
        event["timestamp"] = datetime.now().isoformat()
        # Before both sinks: a secret reaches neither events.jsonl nor the terminal.
        event = mask_value(event)
        if sink is not None:
            sink.write(_to_json(event) + "\n")
        if LEVELS.get(method, logging.INFO) < threshold:
            raise structlog.DropEvent
        event.pop("run", None)  # the terminal knows which run it is watching
        event["timestamp"] = str(event.get("timestamp", ""))[11:19]  # HH:MM:SS of the ISO time
        # The file above keeps exact values (JSON escapes them); the terminal gets no escapes.
        return {k: clean(v, multiline=False) if isinstance(v, str) else v for k, v in event.items()}

    structlog.configure(
        processors=[
            record,
            structlog.dev.ConsoleRenderer(
                colors=use_color(sys.stderr), pad_event_to=18, sort_keys=False
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    return sink
