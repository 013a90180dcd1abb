"""Terminal facts shared by the board and the run log."""

from __future__ import annotations

import os
from typing import TextIO


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, never when NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
