"""The upstream-aware HTTP client agents call APIs with (DESIGN.md §8, §9).

Each call through `UpstreamClient.request` with an `upstream` name:

1. asks the run's `UpstreamAccess` for admission (the shared limiter and circuit breaker of
   that name); a refusal raises `UpstreamDeferred` before anything is sent, and the executor
   defers the run without spending an attempt (the access and its `CallTicket`:
   `upstream_access`);
2. sends the request under a total timeout (seconds) and reads at most `max_body_bytes`;
3. records the outcome in the breaker and raises the typed error the retry policy reads (see
   `upstream_rules` for the table). A failure that leaves the breaker open (it tripped it, a
   half-open probe failed, or the call was in flight when it opened) raises `UpstreamOutage`
   instead: an `UpstreamDeferred` (the run waits out the cool-down without spending an
   attempt) that is also an `UpstreamUnavailable`.

Calls without an upstream name, or through a client without access, skip steps 1 and 3 but
are classified the same way. A call interrupted by cancellation is not recorded here: the
owner of the access settles it (the executor records the run's outcome for it). When the
limiter or breaker cannot be reached (`QueueUnavailable`), the call is deferred.

Headers, query strings and bodies are never logged or put in errors: requests may carry
credentials.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Final

import httpx
import structlog

from taskstream.agents.content_coding import request_headers
from taskstream.agents.errors import (
    UpstreamDeferred,
    UpstreamOutage,
    UpstreamUnavailable,
)
from taskstream.agents.upstream_access import (
    CallTicket,
    StaleAdmission,
    UpstreamAccess,
    on_headers_out,
)
from taskstream.agents.upstream_response import UpstreamResponse, read_capped
from taskstream.agents.upstream_rules import (
    describe,
    error_for_status,
    failure_of,
    outcome_of,
    retry_after_ms,
    safe_url,
)
from taskstream.core.clock import Clock, SystemClock
from taskstream.core.errors import QueueUnavailable
from taskstream.core.logging import get_logger
from taskstream.ratelimit.breaker import Outcome

DEFAULT_TIMEOUT_S: Final = 30.0
"""Total time one call may take, connect to last body byte (seconds)."""
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
"""Body bytes read per response; the rest is dropped and `truncated` set."""
GUARD_DOWN_WAIT_MS: Final = 5_000
"""Deferral (ms) of a call whose limiter or breaker could not be reached."""
STALE_WAIT_MS: Final = 1_000
"""Deferral (ms) of a call whose admission went stale before its request was sent."""


@dataclass(frozen=True, slots=True)
class _Call:
    """One call as it may be logged (no headers, no query), with its admission, if any."""

    upstream: str | None
    method: str
    url: str
    ticket: CallTicket | None = None

    @property
    def text(self) -> str:
        return describe(self.method, self.url, self.upstream)

    def fields(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "method": self.method.upper(), "url": safe_url(self.url)}


class UpstreamClient:
    """An async HTTP client (httpx) that applies limiter, breaker and timeout per call.

    `http` is a shared `httpx.AsyncClient` to use (left open by `aclose`); without one, a
    private client is made at the first call and closed by `aclose`.
    """

    def __init__(
        self,
        access: UpstreamAccess | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        clock: Clock | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self._access = access
        self._shared = http
        self._own: httpx.AsyncClient | None = None
        self._log = log or get_logger()
        self._clock = clock or SystemClock()
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes

    async def request(
        self,
        method: str,
        url: str,
        *,
        upstream: str | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        json: Any = None,
        content: bytes | str | None = None,
        timeout_s: float | None = None,
        max_body_bytes: int | None = None,
        check: bool = True,
    ) -> UpstreamResponse:
        """One call to `url` as `upstream` (None: no admission, nothing recorded).

        Raises `UpstreamDeferred` when admission is refused, `UpstreamUnavailable` (retriable)
        on a timeout, a connection error, 429 or 5xx (`UpstreamOutage`, deferred, when that
        failure leaves the breaker open), and `UpstreamRejected` (fatal) on other 4xx or a
        request that cannot be sent. With `check=False` every response is returned
        (its outcome is still recorded). `timeout_s` and `max_body_bytes` default to the client's.
        """
        limit_s = self.timeout_s if timeout_s is None else timeout_s
        cap = self.max_body_bytes if max_body_bytes is None else max_body_bytes
        call = _Call(upstream, method, url, await self._admit(upstream))
        started = time.monotonic()
        try:
            response = await self._send(
                method,
                url,
                call.ticket,
                (limit_s, cap),
                headers=request_headers(headers),
                params=params,
                json=json,
                content=content,
            )
        except StaleAdmission:
            # Not sent: nothing to record; the run is deferred and admitted anew.
            self._log.info("upstream.admission_stale", **call.fields())
            raise UpstreamDeferred(upstream or "", STALE_WAIT_MS) from None
        except Exception as exc:  # every failure to get an answer is classified
            raise await self._failed(call, exc, limit_s) from None
        elapsed_ms = round((time.monotonic() - started) * 1000)
        return await self._answered(call, response, elapsed_ms, check)

    async def get(self, url: str, **kwargs: Any) -> UpstreamResponse:
        """`request("GET", url, ...)`."""
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> UpstreamResponse:
        """`request("POST", url, ...)`."""
        return await self.request("POST", url, **kwargs)

    async def aclose(self) -> None:
        """Close the private httpx client, if one was made."""
        if self._own is not None:
            own, self._own = self._own, None
            await own.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._shared is not None:
            return self._shared
        if self._own is None:
            self._own = httpx.AsyncClient(follow_redirects=False)
        return self._own

    async def _admit(self, upstream: str | None) -> CallTicket | None:
        """The call's ticket (None: no upstream or no access, nothing to admit); raises
        `UpstreamDeferred` when the call may not go now."""
        if upstream is None or self._access is None:
            return None
        try:
            admitted = await self._access.acquire(upstream)
        except QueueUnavailable as exc:
            self._log.warning("upstream.guard_unavailable", upstream=upstream, error=str(exc)[:300])
            admitted = GUARD_DOWN_WAIT_MS
        if isinstance(admitted, CallTicket):
            return admitted
        self._log.info("upstream.call_deferred", upstream=upstream, retry_after_ms=admitted)
        raise UpstreamDeferred(upstream, admitted)

    async def _record(
        self, ticket: CallTicket | None, outcome: Outcome, *, sent: bool = True
    ) -> int | None:
        """Report to the breaker (`sent`: the request went out, see `UpstreamAccess.record`);
        returns the cool-down left (ms) when a failure left it open. The call has happened:
        an unreachable breaker store costs one observation, never the call's result."""
        if ticket is None or self._access is None:
            return None
        try:
            return await self._access.record(ticket, outcome, sent=sent)
        except QueueUnavailable as exc:
            self._log.warning(
                "upstream.record_lost", upstream=ticket.upstream, error=str(exc)[:300]
            )
            return None

    def _outage(self, error: Exception, open_ms: int | None) -> Exception:
        """`error`, or an `UpstreamOutage` in its place when it is an upstream failure that
        left the breaker open for `open_ms` more (the run defers without an attempt; a longer
        `Retry-After` from the upstream is honoured)."""
        if open_ms is None or not isinstance(error, UpstreamUnavailable) or not error.upstream:
            return error
        wait_ms = max(open_ms, error.retry_after_ms or 0)
        self._log.info("upstream.outage_deferred", upstream=error.upstream, retry_after_ms=wait_ms)
        return UpstreamOutage(
            str(error), upstream=error.upstream, status=error.status, retry_after_ms=wait_ms
        )

    async def _send(
        self,
        method: str,
        url: str,
        ticket: CallTicket | None,
        limits: tuple[float, int],
        **kwargs: Any,
    ) -> UpstreamResponse:
        """Send the request; with a `ticket`, tell the run's access when its headers go out
        (`on_headers_out`). `limits`: (total timeout in s, body bytes read)."""
        timeout_s, max_body_bytes = limits
        client = self._client()
        request = client.build_request(method, url, timeout=httpx.Timeout(timeout_s), **kwargs)
        if ticket is not None and self._access is not None:
            request.extensions["trace"] = on_headers_out(self._access, ticket)
        async with asyncio.timeout(timeout_s):
            response = await client.send(request, stream=True)
            try:
                body, truncated = await read_capped(response, max_body_bytes)
            finally:
                await response.aclose()
        return UpstreamResponse(
            status=response.status_code,
            headers=response.headers,
            content=body,
            encoding=response.charset_encoding or "utf-8",
            truncated=truncated,
        )

    async def _answered(
        self, call: _Call, response: UpstreamResponse, elapsed_ms: int, check: bool
    ) -> UpstreamResponse:
        outcome = outcome_of(response.status)
        open_ms = await self._record(call.ticket, outcome)
        self._log.info(
            "upstream.call",
            **call.fields(),
            status=response.status,
            outcome=outcome.value,
            elapsed_ms=elapsed_ms,
        )
        if not check:
            return response
        wait_ms = retry_after_ms(response.headers.get("retry-after"), self._clock.now_ms())
        error = error_for_status(
            response.status, upstream=call.upstream, call=call.text, retry_after_ms=wait_ms
        )
        if error is not None:
            raise self._outage(error, open_ms)
        return response

    async def _failed(self, call: _Call, exc: Exception, timeout_s: float) -> Exception:
        """Record a call that got no answer and return the typed error for it."""
        error, sent = failure_of(exc, call.text, call.upstream, timeout_s)
        outcome = Outcome.FAILURE if isinstance(error, UpstreamUnavailable) else Outcome.IGNORE
        open_ms = await self._record(call.ticket, outcome, sent=sent)
        self._log.warning(
            "upstream.call_failed",
            **call.fields(),
            error_type=type(exc).__name__,
            outcome=outcome.value,
        )
        return self._outage(error, open_ms)
