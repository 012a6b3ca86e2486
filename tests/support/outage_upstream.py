"""A loopback upstream that is down for a while, then recovers, and logs every arrival.

`OutageUpstream` serves on 127.0.0.1 with an ephemeral port (a `Loopback` underneath). It
answers 503 until `recovers_at_ms` and 200 from then on; the outage lasts from the server's
start until `start_outage(down_ms)` has run and `down_ms` more have passed (so requests that
come before the run starts fail too). Every request is logged as an `Arrival`: when it came
(UTC epoch ms on `clock`, the wall clock unless one is injected) and what it was answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from tests.support.loopback import Loopback, Reply, Seen

DOWN: int = 503
UP: int = 200


def wall_ms() -> int:
    """The wall clock, UTC epoch ms."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request: when it arrived (epoch ms on the server's clock), its target, and the
    status it was answered with."""

    at_ms: int
    target: str
    status: int


class OutageUpstream:
    """`async with OutageUpstream() as upstream:`; `upstream.url(path)` is where it listens."""

    def __init__(self, clock: Callable[[], int] = wall_ms) -> None:
        self._clock = clock
        self.recovers_at_ms: int | None = None
        """None until `start_outage`: down for as long as nobody has started the clock."""
        self.arrivals: list[Arrival] = []
        self._server = Loopback(self._reply)

    def start_outage(self, down_ms: int) -> int:
        """Stay down `down_ms` more from now; returns the instant (ms) it recovers."""
        self.recovers_at_ms = self._clock() + down_ms
        return self.recovers_at_ms

    def url(self, path: str = "/") -> str:
        return self._server.url(path)

    def _reply(self, seen: Seen) -> Reply:
        now_ms = self._clock()
        down = self.recovers_at_ms is None or now_ms < self.recovers_at_ms
        status = DOWN if down else UP
        self.arrivals.append(Arrival(now_ms, seen.target, status))
        if down:
            return Reply.json(DOWN, {"error": "down"})
        return Reply.json(UP, {"ok": True})

    async def __aenter__(self) -> OutageUpstream:
        await self._server.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._server.__aexit__(exc_type, exc, tb)
