"""structlog configuration: JSON lines, one event name per line, ids bound by callers."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO, cast

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog for a process. Call once at the edge (CLI entry)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, Unfailing(stream or sys.stderr))),
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    """A logger with ids bound, e.g. `get_logger(role="executor", consumer=name)`."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger()
    return logger.bind(**bound)


class Unfailing:
    """The stream log lines are written to, whose failures never reach the code that logs.
    Its reader may be gone while the process lives on: `taskstream up 2>&1 | tee up.log`
    stopped with Ctrl-C ends `tee` at once, while the roles stop cleanly (a write then fails
    with EPIPE; a closed terminal gives EIO). A failed line would otherwise end an executor's
    stop before it released its runs, and `up` with an error. Once a write fails, the
    stream's file descriptor is pointed at the null device: the lines after it, what is still
    buffered, and the interpreter's last flush at exit (else exit 120) go nowhere."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._lost()

    def _lost(self) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError):  # no descriptor (an in-memory stream): lines are dropped
            return
