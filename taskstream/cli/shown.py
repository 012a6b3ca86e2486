"""What the CLI prints reaches the operator's terminal as text, never as terminal commands.

Much of it was written by others: agents' errors and results, task files, entries other
programs put in the streams. A control character in such text (ESC starting a sequence that
retitles or clears the terminal, hides lines or sets the clipboard; a carriage return that
overwrites a line) is shown as `\\xNN` instead. Newline and tab stay as they are.
"""

from __future__ import annotations

import re
import sys
from typing import IO, Literal

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL, but not tab (09) and newline (0a)."""


def shown(text: str) -> str:
    """`text` with each control character but newline and tab written as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def err_line(text: str) -> None:
    """Write `text` and a newline to the current `sys.stderr`, through `shown`."""
    sys.stderr.write(shown(text) + "\n")


class ShownStream:
    """A text stream writing to the process's current `sys.stdout` or `sys.stderr` (looked up
    at each write, so a replaced stream is followed) through `shown`. For a rich console that
    emits no styling of its own (`color_system=None`): every escape would be shown too."""

    def __init__(self, name: Literal["stdout", "stderr"]) -> None:
        self._name = name

    @property
    def _stream(self) -> IO[str]:
        stream: IO[str] = getattr(sys, self._name)
        return stream

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        return self._stream.write(shown(text))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()
