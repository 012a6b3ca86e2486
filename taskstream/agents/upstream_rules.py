"""How one upstream call's result is judged (pure): the breaker outcome, the typed error for the
retry policy, the `Retry-After` wait, and the URL form that may be logged.

| Result                          | Breaker | Error                                      |
|---------------------------------|---------|--------------------------------------------|
| 2xx, 3xx                        | success | none                                       |
| 429, 5xx                        | failure | `UpstreamUnavailable` (retriable, Retry-After) |
| other 4xx, status >= 600        | ignore  | `UpstreamRejected` (fatal)                 |
| timeout, connection error       | failure | `UpstreamUnavailable` (retriable)          |
| request that cannot be sent     | ignore  | `UpstreamRejected` (fatal)                 |

A call that made no connection (refused, a connect timeout, a URL that cannot be sent) reached
no upstream: its window slot is given back (`failure_of`'s second answer).
"""

from __future__ import annotations

from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Final

import httpx

from taskstream.agents.errors import AgentError, UpstreamRejected, UpstreamUnavailable
from taskstream.core.store.urls import url_scheme
from taskstream.ratelimit.breaker import Outcome, classify_http

MAX_RETRY_AFTER_MS: Final = 3_600_000
"""Longest `Retry-After` wait honoured (ms); longer ones are cut to this."""


_UPSTREAM_FAULTS = (
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
    httpx.DecodingError,
)
"""Errors after which the upstream is to blame: no (usable) answer came back."""
_UNSENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)
"""Errors raised before any connection to the upstream carried the request: it saw none."""


def failure_of(
    exc: Exception, call: str, upstream: str | None, timeout_s: float
) -> tuple[UpstreamUnavailable | UpstreamRejected, bool]:
    """The typed error of a `call` (its `describe` text) that got no answer because of `exc`,
    and whether its request may have reached the upstream (False: no connection carried
    it). `timeout_s` is the call's total limit (seconds), for the message."""
    kind = type(exc).__name__
    error: UpstreamUnavailable | UpstreamRejected
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        error = UpstreamUnavailable(f"{call} timed out after {timeout_s} s", upstream=upstream)
    elif isinstance(exc, _UPSTREAM_FAULTS):
        error = UpstreamUnavailable(f"{call} failed: {kind}", upstream=upstream)
    else:
        error = UpstreamRejected(
            f"{call} could not be sent: {kind}", upstream=upstream, status=None
        )
    return error, not isinstance(exc, _UNSENT)


def outcome_of(status: int | None, *, timed_out: bool = False) -> Outcome:
    """The breaker outcome of a call: `status` None means no response arrived."""
    return classify_http(status, timed_out)


def is_unavailable(status: int) -> bool:
    """429 and 5xx: the upstream is overloaded or failing, and a later try may succeed."""
    return status == 429 or 500 <= status <= 599


def error_for_status(
    status: int, *, upstream: str | None, call: str, retry_after_ms: int | None = None
) -> AgentError | None:
    """The error a response with `status` raises, or None for 1xx-3xx. `call` is the safe
    description of the request (see `describe`)."""
    if status < 400:
        return None
    message = f"{call} answered HTTP {status}"
    if is_unavailable(status):
        return UpstreamUnavailable(
            message, upstream=upstream, status=status, retry_after_ms=retry_after_ms
        )
    return UpstreamRejected(message, upstream=upstream, status=status)


_MAX_DIGITS = 12
"""Delay-seconds longer than this are past `MAX_RETRY_AFTER_MS` (and not converted)."""


def retry_after_ms(value: str | None, now_ms: int) -> int | None:
    """The wait (ms, 0..`MAX_RETRY_AFTER_MS`) a `Retry-After` header asks for, as delay-seconds
    or an HTTP date compared with `now_ms` (UTC epoch ms); None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        # Past the cap whatever its digits: and Python refuses to convert 4,300 or more.
        digits = text.lstrip("0") or "0"
        wait_ms = int(digits) * 1000 if len(digits) <= _MAX_DIGITS else MAX_RETRY_AFTER_MS
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):  # a year past datetime's
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        wait_ms = round(when.timestamp() * 1000) - now_ms
    return min(MAX_RETRY_AFTER_MS, max(0, wait_ms))


def _scheme_of(url: str) -> str:
    """`scheme://` of `url` when it starts with one, else "" (the text before a lone `:` may
    be a user name)."""
    scheme = url_scheme(url)
    return f"{scheme.lower()}://" if scheme else ""


def safe_url(url: str) -> str:
    """`url` as httpx (which sends it) reads it, without user info, query or fragment: the form
    that may be logged and stored. Total, and never shows any part of the user info:
    `<scheme>://<unparseable URL>` when httpx cannot read `url`, `<scheme>://<ambiguous URL>`
    when an `@` follows the host (a password holding an unencoded `/`, `?` or `#` is read as
    host, port and path: `http://svc:123/Xk9@api/` goes to host `svc`)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return f"{_scheme_of(url)}<unparseable URL>"
    path, _, query = parsed.raw_path.partition(b"?")
    if b"@" in path or b"@" in query or "@" in parsed.fragment:
        return f"{_scheme_of(url)}<ambiguous URL>"
    host = parsed.netloc.decode("ascii", "replace")
    where = f"{parsed.scheme}://{host}" if parsed.scheme else ""
    return where + path.decode("ascii", "replace")


def describe(method: str, url: str, upstream: str | None) -> str:
    """A call as it appears in errors: `GET http://host/path (upstream 'api')`."""
    where = f" (upstream {upstream!r})" if upstream is not None else ""
    return f"{method.upper()} {safe_url(url)}{where}"
