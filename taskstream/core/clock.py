"""The one place processes read wall-clock time. Decisions take `now_ms` as an argument;
services get a `Clock` so tests can pass a fixed or stepped one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """UTC epoch milliseconds."""
        ...


class SystemClock:
    """The host's clock. Leases never use it: they use the database clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FixedClock:
    """A clock that only moves when told to."""

    def __init__(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms
