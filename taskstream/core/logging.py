"""structlog configuration: JSON lines, one event name per line, ids bound by callers."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

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
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    """A logger with ids bound, e.g. `get_logger(role="executor", consumer=name)`."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger()
    return logger.bind(**bound)
