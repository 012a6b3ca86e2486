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
    """The database clock as this host keeps it: the host's monotonic clock plus an offset
    (ms) measured against the database clock, so times that other processes compare (retry
    due times, deadlines, lease checks, fire times) agree across hosts whose clocks are
    skewed. A step of the host's wall clock (NTP, `date -s`) does not move it: between two
    syncs it only drifts at the rate of the monotonic clock. Before its first sync it reads
    the host's wall clock. `offset_ms` = database now - `host_ms()`, refreshed by the owner."""

    def __init__(self) -> None:
        self._wall_at_sync = _wall_minus_host()
        self.offset_ms = self._wall_at_sync

    @staticmethod
    def host_ms() -> int:
        """The host reading the offset is added to (monotonic ms, no fixed origin)."""
        return time.monotonic_ns() // 1_000_000

    def now_ms(self) -> int:
        return self.host_ms() + self.offset_ms

    def sync(
        self, db_now_ms: int, host_before_ms: int, host_after_ms: int, wall_at: int | None = None
    ) -> None:
        """Set the offset from one database read bracketed by two `host_ms()` readings.
        `wall_at` is `wall_baseline()` taken before the read, so that a wall step during a
        slow read is still seen as one afterwards (None: now)."""
        self.offset_ms = db_now_ms - (host_before_ms + host_after_ms) // 2
        self._wall_at_sync = _wall_minus_host() if wall_at is None else wall_at

    @staticmethod
    def wall_baseline() -> int:
        """The reading `wall_step_ms` measures steps from (wall minus monotonic, ms)."""
        return _wall_minus_host()

    def rebase_wall(self) -> None:
        """Take the wall clock as it is now as the one steps are measured from, without a
        sync (the database could not be asked)."""
        self._wall_at_sync = _wall_minus_host()

    def wall_step_ms(self) -> int:
        """How far (ms, either way) the host's wall clock has stepped against its monotonic
        clock since the last sync. Where the database runs on this host (SQLite, or a server
        beside the role) that step moved the database clock too, so the owner syncs again."""
        return abs(_wall_minus_host() - self._wall_at_sync)


def _wall_minus_host() -> int:
    """Wall clock minus monotonic clock, ms: constant but for steps of the wall clock (a
    slew changes the rate of both)."""
    return SystemClock().now_ms() - OffsetClock.host_ms()
