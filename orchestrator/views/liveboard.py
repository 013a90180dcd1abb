"""The todo board, redrawn in place on the terminal while `orch run` works.

A thread reads the store on its own connection (WAL: readers never block the run's writes)
when the run's events say something changed, and redraws the board when it did: the cursor
goes back up over the last drawing and the screen is cleared below it. The run's log lines
go to events.jsonl only (the caller silences the console), so nothing else writes between
two drawings. Only on a terminal, never with --quiet or --json, and not when TERM is dumb.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from orchestrator.core.errors import OrchError
from orchestrator.core.terminal import use_color
from orchestrator.store.db import Store
from orchestrator.views.board import render_board
from orchestrator.views.snapshot import read

REDRAW_EVERY = 0.3  # seconds


def wanted(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class LiveBoard:
    """Fed by the run's events (Runbook.run's `on_event`): the first one starts the drawing
    thread (a run that has nothing to do draws nothing), each one asks for a redraw, and the
    board is redrawn at least every second for its clocks. `close` erases it: the caller
    prints the final board where it was."""

    def __init__(self, store_path: Callable[[], Path], stream: TextIO = sys.stderr) -> None:
        self.where, self.stream = store_path, stream
        self.drawn_lines = 0
        self.changed, self.stop = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None
        self.path = Path()  # the store's, once the first event says the run has begun

    def event(self, _: object) -> None:
        if self.thread is None:
            self.path = self.where()  # known by now: the run has loaded the plan
            self.thread = threading.Thread(target=self._loop, name="orch-liveboard", daemon=True)
            self.thread.start()
        self.changed.set()

    def close(self) -> None:
        if self.thread is None:
            return
        self.stop.set()
        self.changed.set()
        self.thread.join(timeout=5)
        self._erase()

    def _loop(self) -> None:
        shown = ""
        store: Store | None = None
        try:
            while not self.stop.is_set():
                self.changed.wait(timeout=1.0)
                self.changed.clear()
                if self.stop.is_set():
                    return
                store = store or Store.open(self.path, create=False)
                text = self._board(store)
                if text and text != shown:
                    self._erase()
                    self.stream.write(text + "\n")
                    self.stream.flush()
                    self.drawn_lines = text.count("\n") + 1
                    shown = text
                self.stop.wait(REDRAW_EVERY)  # at most a few drawings a second
        except (OrchError, OSError):
            return  # the board is a view: a store it cannot read ends the view, not the run
        finally:
            if store is not None:
                store.close()

    def _board(self, store: Store) -> str:
        snap = read(store, self.path, self.path.stem)
        return render_board(snap, color=use_color(self.stream)) if snap.rows else ""

    def _erase(self) -> None:
        if self.drawn_lines:
            # Cursor to the start of the first drawn line, then clear to the end of the screen.
            self.stream.write(f"\x1b[{self.drawn_lines}F\x1b[J")
            self.stream.flush()
            self.drawn_lines = 0
