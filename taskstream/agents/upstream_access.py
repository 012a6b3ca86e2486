"""What a run's HTTP client asks of the executor for each call to a named upstream
(DESIGN.md §8): `UpstreamAccess` admits the call and hands out its `CallTicket`, is told when
the call's request goes out, and takes the call's outcome with the same ticket.

`on_headers_out` is the httpcore trace hook that tells the access when a call is sending."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from taskstream.ratelimit.breaker import Outcome

HEADERS_OUT: Final = ("http11.send_request_headers.started", "http2.send_request_headers.started")
"""httpcore trace events: the request's first bytes are about to go out."""


@dataclass(frozen=True, slots=True, eq=False)
class CallTicket:
    """One call `UpstreamAccess.acquire` admitted, handed back with its `sending` and its
    `record`: so the report made for a call is that call's own, even when a run has several
    calls to one upstream in flight (a half-open probe among them). Compared by identity.

    `probe_round`: the round of the half-open probe the call was admitted as, if it was;
    `hit`: its member in the upstream's sliding window, if the upstream has a limit."""

    upstream: str
    probe_round: int | None = None
    hit: str | None = None


class UpstreamAccess(Protocol):
    """Admission to named upstreams for one run: the executor binds its gate as this."""

    async def acquire(self, name: str) -> CallTicket | int:
        """Take one call to upstream `name`: its ticket when it may go now, else the wait
        (ms)."""
        ...

    async def record(
        self, ticket: CallTicket, outcome: Outcome, *, sent: bool = True
    ) -> int | None:
        """Report the outcome of the call `ticket` admitted. For a failure that leaves the
        breaker open: the cool-down left (ms, >= 1), by which the run is deferred; else None.
        `sent` False: the call's request never went out (no connection was made), so the
        upstream counted no request: its window slot is given back."""
        ...

    async def sending(self, ticket: CallTicket) -> bool:
        """The call `ticket` admitted is sending its request now (its hit in the limiter's
        window moves to now). False when its admission went stale: it must not be sent."""
        ...


class StaleAdmission(Exception):
    """Raised from the trace hook to stop a request whose admission went stale before it was
    sent; `UpstreamClient.request` turns it into `UpstreamDeferred`."""


def on_headers_out(
    access: UpstreamAccess, ticket: CallTicket
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore trace hook: when the request's headers are about to go out (after any
    connection setup), tell `access` the call is sending, and stop it if its admission went
    stale."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in HEADERS_OUT and not await access.sending(ticket):
            raise StaleAdmission(ticket.upstream)

    return trace
