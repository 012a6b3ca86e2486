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


class OffsetClock:
    """The host clock corrected by an offset (ms) measured against the database clock, so
    times that other processes compare (retry due times, deadlines) agree across hosts whose
    clocks are skewed. `offset_ms` = database now - host now, refreshed by the owner."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms
        self._host = SystemClock()

    def now_ms(self) -> int:
        return self._host.now_ms() + self.offset_ms

    def sync(self, db_now_ms: int, host_before_ms: int, host_after_ms: int) -> None:
        """Set the offset from one database read bracketed by two host readings."""
        self.offset_ms = db_now_ms - (host_before_ms + host_after_ms) // 2
