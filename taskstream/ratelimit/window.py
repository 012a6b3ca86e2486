"""Sliding-window admission, as a pure function of (now, recent hits, limit, window, burst).

A *hit* is the time (UTC epoch ms) of one admitted call. A hit at `t` is *in the window* at
`now` when `now - window_ms < t`, and *in the horizon* when `now - 2 * window_ms < t`.

Two caps hold for every admitted call, over every span of time:

- at most `limit + burst` hits in any `window_ms` span (the short cap);
- at most `2 * limit` hits in any `2 * window_ms` span (the long cap).

So `burst` is headroom above `limit` that is paid back: a window may take up to
`limit + burst` calls when the window before it was under-used by at least as much, and over
any two consecutive windows the rate stays at `limit` per window. With `burst = 0` the long
cap is implied by the short one and this is a plain sliding log of `limit` per `window_ms`.
A `burst` above `limit` is never fully usable: the long cap allows `2 * limit` per window.

Rejected calls are not hits. `retry_after_ms` of a rejection is exact: the first moment at which
the same call would be admitted if nothing else were admitted meanwhile, which is when the
oldest hit that keeps a cap full leaves its span.

Guard band: the limiter admits a call on the Redis server's clock, but an upstream counts calls
as they *arrive*, and the time from admission to arrival differs from call to call (process
scheduling, connection setup, the network). Two calls admitted exactly one window apart can
then arrive less than a window apart, and the upstream sees `limit + 1` in one of its windows.
So executors widen every stored window by `guarded`: each hit counts for window + guard, where
the guard is `GUARD_PERCENT` of the window (at least 1 ms). Arrivals then respect the declared
limit as long as the spread of admission-to-arrival delays stays under the guard; the price is
about the same fraction of the upstream's throughput.

Re-stamping: a call is admitted before it is sent, sometimes long before (a run is admitted to
its declared upstreams before its agent starts, and a fresh process's first calls are slow).
So when the request's headers go out, the client moves the call's hit to that moment
(`Limiter.restamp`, on the same clock). That is sound while the hit is still in its window:
every admission since it was recorded counted it, so moving it later only counts it longer.
A hit already out of its window is stale: its slot may have been given again, so the call is
not sent (the run is deferred and admitted anew), and the hit is dropped, so a call never sent
does not hold a slot of the long cap either. What is left for the guard is the spread from
headers out to arrival.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from taskstream.core.errors import ConfigError
from taskstream.core.spec_upstreams import UpstreamLimit

GUARD_PERCENT: Final = 2
"""The guard band in percent of the declared window (see the module doc): 200 ms of a 10 s
window. Measured on a loaded 2-core host (8 processes x 4 callers at 50 calls / 10 s), the
admission-to-arrival delays of calls spread by up to ~200 ms, nearly all of it before sending
in a fresh process's first calls; with re-stamping the send-to-arrival part spread by 3-17 ms
(the tightest 51 arrivals spanned 10.194-10.197 s)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The limiter's answer for one call.

    `retry_after_ms` is 0 when allowed and >= 1 otherwise. `in_window` is the number of hits in
    the window after the decision, this call included when it was allowed. `member` names the
    recorded hit (None when refused, or from the pure decision), for `Limiter.restamp`.
    """

    allowed: bool
    retry_after_ms: int
    in_window: int
    member: str | None = None


class Limits(NamedTuple):
    """`limit` calls per `window_ms` (>= 1 each), plus `burst` (>= 0); see the module doc."""

    limit: int
    window_ms: int
    burst: int = 0


def check_limits(limit: int, window_ms: int, burst: int) -> Limits:
    """The arguments as `Limits`; raises `ConfigError` listing every value out of range."""
    problems = [
        f"{name} must be >= {low}, got {value}"
        for name, value, low in (
            ("limit", limit, 1),
            ("window_ms", window_ms, 1),
            ("burst", burst, 0),
        )
        if value < low
    ]
    if problems:
        raise ConfigError(problems)
    return Limits(limit, window_ms, burst)


def limits_from_spec(spec: UpstreamLimit) -> Limits | None:
    """A task spec's upstream limit (window in float seconds) in whole milliseconds (>= 1);
    None for an upstream without a rate limit (a breaker only)."""
    if spec.limit is None or spec.window is None:
        return None
    window_ms = max(1, round(spec.window * 1000))
    return check_limits(spec.limit, window_ms, spec.burst or 0)


def restamped(at_ms: int, now_ms: int, window_ms: int) -> int | None:
    """Where a hit recorded at `at_ms` goes when its call is sent at `now_ms` (see
    "Re-stamping" in the module doc): to `now_ms` (never earlier than it is) while it is in
    the `window_ms` window ending now; None when it is stale and the call must not be sent."""
    if at_ms <= now_ms - window_ms:
        return None
    return max(at_ms, now_ms)


def guard_ms(window_ms: int) -> int:
    """The guard band (ms) of a `window_ms` window: `GUARD_PERCENT` of it rounded up, >= 1."""
    return max(1, -(-window_ms * GUARD_PERCENT // 100))


def guarded(limits: Limits) -> Limits:
    """`limits` as the executors apply them: the window widened by its guard band, so a hit
    counts for `window_ms + guard_ms(window_ms)`; `limit` and `burst` are unchanged. If every
    call arrives at the upstream within `guard_ms` of the same delay after its admission, no
    span of the declared `window_ms` of arrivals holds more than `limit + burst` calls."""
    return limits._replace(window_ms=limits.window_ms + guard_ms(limits.window_ms))


def horizon_ms(window_ms: int) -> int:
    """How far back hits matter: the long cap's span. Older hits may be discarded."""
    return 2 * window_ms


def _wait_ms(now_ms: int, span_hits: list[int], cap: int, span_ms: int) -> int:
    """Time until fewer than `cap` of `span_hits` (sorted, all within the span) remain in it."""
    if len(span_hits) < cap:
        return 0
    blocker = span_hits[len(span_hits) - cap]
    return max(1, blocker + span_ms - now_ms)


def decide(now_ms: int, hits: Iterable[int], limit: int, window_ms: int, burst: int) -> Admission:
    """Admit one call at `now_ms` given earlier `hits` (any order; ones outside the horizon are
    ignored). The caller records `now_ms` as a new hit exactly when the answer is allowed."""
    check_limits(limit, window_ms, burst)
    recent = sorted(t for t in hits if t > now_ms - horizon_ms(window_ms))
    in_window = [t for t in recent if t > now_ms - window_ms]
    wait = max(
        _wait_ms(now_ms, in_window, limit + burst, window_ms),
        _wait_ms(now_ms, recent, 2 * limit, horizon_ms(window_ms)),
    )
    if wait:
        return Admission(allowed=False, retry_after_ms=wait, in_window=len(in_window))
    return Admission(allowed=True, retry_after_ms=0, in_window=len(in_window) + 1)
