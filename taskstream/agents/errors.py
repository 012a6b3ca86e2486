"""The typed errors an agent raises to say how its run failed (no I/O, safe for pure code).

The upstream errors are raised by `UpstreamClient` (see `agents.upstream`); their messages name
the upstream, the method, the URL without query or credentials, and the status, never a
header or a body, so they are safe to store and log.
"""

from __future__ import annotations

from taskstream.core.errors import TaskstreamError


class AgentError(TaskstreamError):
    """Base of the errors an agent raises to say how its run failed."""


class RetriableError(AgentError):
    """A transient failure: the run may succeed if tried again.

    `retry_after_ms`, when set, is the least wait before the next attempt that whoever failed
    asked for (e.g. an upstream's `Retry-After`); the retry policy's backoff still applies when
    it is longer.
    """

    def __init__(self, *args: object, retry_after_ms: int | None = None) -> None:
        super().__init__(*args)
        self.retry_after_ms = retry_after_ms


class FatalError(AgentError):
    """A permanent failure: trying again cannot help."""


class NeedsReview(AgentError):
    """The run needs a human decision before anything else happens."""


class UpstreamDeferred(AgentError):
    """The upstream's limiter or open breaker refused a call before it was made.

    The executor defers the run (RETRYING, due in `retry_after_ms` >= 1) without spending an
    attempt. An agent should let it propagate.
    """

    def __init__(self, upstream: str, retry_after_ms: int) -> None:
        self.upstream = upstream
        self.retry_after_ms = max(1, retry_after_ms)
        super().__init__(f"upstream {upstream!r} refused the call; retry in {retry_after_ms} ms")


class UpstreamUnavailable(RetriableError):
    """A call an upstream did not answer usefully: a timeout, a connection error, HTTP 429 or
    5xx. `status` is None when there was no response."""

    def __init__(
        self,
        message: str,
        *,
        upstream: str | None,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message, retry_after_ms=retry_after_ms)
        self.upstream = upstream
        self.status = status


class UpstreamRejected(FatalError):
    """A call the upstream refused for good: HTTP 4xx other than 429 (or a request that could
    not be sent at all, such as an invalid URL; `status` is then None)."""

    def __init__(self, message: str, *, upstream: str | None, status: int | None) -> None:
        super().__init__(message)
        self.upstream = upstream
        self.status = status


# The bases type `upstream` and `retry_after_ms` differently (str / int vs optional); an
# outage always has both, so it satisfies each base's reading.
class UpstreamOutage(UpstreamDeferred, UpstreamUnavailable):  # type: ignore[misc]
    """A call that failed (timeout, connection error, HTTP 429 or 5xx) and left its upstream's
    circuit breaker open: this failure tripped it, a half-open probe failed, or the call was in
    flight when it opened.

    The outage is known now, so the executor defers the run (RETRYING, due in `retry_after_ms`
    >= 1, the cool-down left) without spending an attempt, as for a refused admission. It is
    also an `UpstreamUnavailable` (`status` None when there was no response), so code that
    handles those keeps working.
    """

    def __init__(
        self, message: str, *, upstream: str, status: int | None, retry_after_ms: int
    ) -> None:
        wait_ms = max(1, retry_after_ms)
        AgentError.__init__(self, f"{message}; breaker open, retry in {wait_ms} ms")
        self.upstream = upstream
        self.status = status
        self.retry_after_ms = wait_ms
