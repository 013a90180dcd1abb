"""The todo board, redrawn in place on the terminal while `orch run` works.

A thread reads the store on its own connection (WAL: readers never block the run's writes)
a few times a second and redraws the board when it changed: the cursor goes back up over the
last drawing and the screen is cleared below it. The run's log lines go to events.jsonl only
(the caller silences the console), so nothing else writes between two drawings. Only on a
terminal, never with --quiet or --json, and not when TERM is dumb.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import TextIO

from orchestrator.core.errors import OrchError
from orchestrator.core.terminal import use_color
from orchestrator.store.db import Store
from orchestrator.views.board import render_board

REDRAW_EVERY = 0.3  # seconds


def wanted(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class LiveBoard:
    def __init__(self, store_path: Path, stream: TextIO = sys.stderr) -> None:
        self.path, self.stream = store_path, stream
        self.drawn_lines = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="orch-liveboard", daemon=True)

    def __enter__(self) -> LiveBoard:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self._erase()  # the caller prints the final board where this one was

    def _loop(self) -> None:
        shown = ""
        store: Store | None = None
        try:
            while not self.stop.wait(REDRAW_EVERY):
                if store is None:
                    if not self.path.exists():
                        continue
                    store = Store.open(self.path, create=False)
                text = self._board(store)
                if text and text != shown:
                    self._erase()
                    self.stream.write(text + "\n")
                    self.stream.flush()
                    self.drawn_lines = text.count("\n") + 1
                    shown = text
        except (OrchError, OSError):
            return  # the board is a view: a store it cannot read ends the view, not the run
        finally:
            if store is not None:
                store.close()

    def _board(self, store: Store) -> str:
        runs = store.runs(1)
        rows = store.todos()
        if not rows:
            return ""
        name = store.plan_name() or self.path.stem
        return render_board(
            name,
            str(self.path),
            rows,
            store.findings(),
            runs[0] if runs else None,
            color=use_color(self.stream),
        )

    def _erase(self) -> None:
        if self.drawn_lines:
            # Cursor to the start of the first drawn line, then clear to the end of the screen.
            self.stream.write(f"\x1b[{self.drawn_lines}F\x1b[J")
            self.stream.flush()
            self.drawn_lines = 0
