"""How long a run is deferred when its failed call finds the breaker open (pure), and the
error that carries it: an `UpstreamOutage` is both a deferral and an upstream failure."""

from __future__ import annotations

import pytest

from taskstream.agents.errors import (
    RetriableError,
    UpstreamDeferred,
    UpstreamOutage,
    UpstreamUnavailable,
)
from taskstream.executor.admission import open_left_ms
from taskstream.executor.outcome import failed
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus
from taskstream.ratelimit.breaker_config import BreakerConfig

CFG = BreakerConfig(cooldown_ms=30_000)
OPENED = 1_000_000


@pytest.mark.parametrize(
    ("status", "now_ms", "left_ms"),
    [
        pytest.param(BreakerStatus.OPEN, OPENED, 30_000, id="just-opened"),
        pytest.param(BreakerStatus.OPEN, OPENED + 12_345, 17_655, id="part-way"),
        pytest.param(BreakerStatus.OPEN, OPENED + 29_999, 1, id="last-ms"),
        pytest.param(BreakerStatus.OPEN, OPENED + 30_000, 1, id="cool-down-over"),
        pytest.param(BreakerStatus.OPEN, OPENED + 90_000, 1, id="long-over"),
        pytest.param(BreakerStatus.HALF_OPEN, OPENED + 100, 1, id="half-open"),
        pytest.param(BreakerStatus.CLOSED, OPENED + 100, 1, id="closed"),
    ],
)
def test_open_left_is_the_cool_down_left_and_at_least_1_ms(
    status: BreakerStatus, now_ms: int, left_ms: int
) -> None:
    state = BreakerState(status=status, since_ms=OPENED, window_start_ms=OPENED)
    assert open_left_ms(state, now_ms, CFG) == left_ms


def test_an_outage_is_a_deferral_and_an_upstream_failure() -> None:
    error = UpstreamOutage(
        "GET api http://x/ got HTTP 503", upstream="api", status=503, retry_after_ms=0
    )
    assert isinstance(error, UpstreamDeferred)
    assert isinstance(error, UpstreamUnavailable) and isinstance(error, RetriableError)
    assert (error.upstream, error.status, error.retry_after_ms) == ("api", 503, 1)
    assert str(error) == "GET api http://x/ got HTTP 503; breaker open, retry in 1 ms"


def test_an_outage_caught_as_a_failure_is_still_retriable() -> None:
    """An agent that catches it and re-raises something else is judged by what it raised; one
    that lets it reach the policy as an error (not through the executor's deferral) retries."""
    end = failed(UpstreamOutage("x", upstream="api", status=None, retry_after_ms=5_000))
    assert (end.reason, end.retry_after_ms) == ("retriable_error", 5_000)
