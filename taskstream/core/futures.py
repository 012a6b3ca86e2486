"""Small helpers for futures that group commits resolve for their callers."""

from __future__ import annotations

import asyncio
from typing import Any


def mark_retrieved(done: asyncio.Future[Any]) -> None:
    """A done-callback: mark a future's error as seen. Group commits resolve futures whose
    callers may have been cancelled meanwhile; the batch's failure is logged by its writer,
    so asyncio must not report it again as "never retrieved"."""
    if not done.cancelled():
        done.exception()
