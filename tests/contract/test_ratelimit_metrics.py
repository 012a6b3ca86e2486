"""The backends count limiter refusals and breaker transitions, and keep the state gauge, over
the in-memory twin and Redis. Each rig has its own registry (`rig.metrics`), so every value
read here was caused by the test reading it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

import taskstream.ratelimit.metrics as metrics_module
from taskstream.core.protocol import Keys
from taskstream.ratelimit.breaker import BreakerStatus, Outcome, Transition
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.metrics import METRICS, REGISTRY, STATE_VALUES
from taskstream.ratelimit.redis_backend import RedisLimiter
from tests.ratelimit.rigs import KINDS, RedisRig, Rig, open_rig

MINUTE_MS = 60_000
SHORT = BreakerConfig(failure_threshold=2, cooldown_ms=50, probe_timeout_ms=60_000)


@pytest.fixture(params=KINDS)
async def rig(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    async with open_rig(request.param, redis_url, namespace) as opened:
        yield opened


def _refusals(rig: Rig, upstream: str) -> float | None:
    return rig.metrics.registry.get_sample_value(
        "taskstream_limiter_refusals_total", {"upstream": upstream}
    )


def _transitions(rig: Rig, upstream: str, transition: Transition) -> float | None:
    return rig.metrics.registry.get_sample_value(
        "taskstream_breaker_transitions_total",
        {"upstream": upstream, "transition": transition.value},
    )


def _state(rig: Rig, upstream: str) -> float | None:
    return rig.metrics.registry.get_sample_value("taskstream_breaker_state", {"upstream": upstream})


async def test_limiter_refusals_are_counted_by_upstream(rig: Rig) -> None:
    for _ in range(5):
        await rig.limiter.acquire("api", 2, MINUTE_MS)
    await rig.limiter.acquire("other", 2, MINUTE_MS)
    assert _refusals(rig, "api") == 3
    assert _refusals(rig, "other") is None
    await rig.limiter.usage("api", MINUTE_MS)
    assert _refusals(rig, "api") == 3


async def test_every_breaker_transition_is_counted_and_the_gauge_follows(rig: Rig) -> None:
    await rig.breakers.record("api", Outcome.FAILURE, SHORT, probe_round=None)
    assert _state(rig, "api") == STATE_VALUES[BreakerStatus.CLOSED] == 0
    assert _transitions(rig, "api", Transition.OPENED) is None

    update = await rig.breakers.record("api", Outcome.FAILURE, SHORT, probe_round=None)
    assert update.transition is Transition.OPENED
    assert _transitions(rig, "api", Transition.OPENED) == 1
    assert _state(rig, "api") == STATE_VALUES[BreakerStatus.OPEN] == 2

    refused = await rig.breakers.admit("api", SHORT)
    assert not refused.allowed
    assert _transitions(rig, "api", Transition.OPENED) == 1

    await rig.wait_until_ms(update.state.since_ms + SHORT.cooldown_ms)
    probe = await rig.breakers.admit("api", SHORT)
    assert probe.transition is Transition.HALF_OPENED
    assert _transitions(rig, "api", Transition.HALF_OPENED) == 1
    assert _state(rig, "api") == STATE_VALUES[BreakerStatus.HALF_OPEN] == 1

    closed = await rig.breakers.record("api", Outcome.SUCCESS, SHORT, probe_round=probe.probe_round)
    assert closed.transition is Transition.CLOSED
    assert _transitions(rig, "api", Transition.CLOSED) == 1
    assert _state(rig, "api") == 0
    assert _transitions(rig, "other", Transition.OPENED) is None


async def test_state_reads_update_the_gauge(rig: Rig) -> None:
    for _ in range(2):
        await rig.breakers.record("api", Outcome.FAILURE, SHORT, probe_round=None)
    rig.metrics.state.clear()
    await rig.breakers.state("api")
    assert _state(rig, "api") == 2
    rig.metrics.state.clear()
    await rig.breakers.states(["api", "unused"])
    assert (_state(rig, "api"), _state(rig, "unused")) == (2, 0)


async def test_backends_count_into_the_process_registry_by_default(
    redis_url: str, namespace: str
) -> None:
    async with open_rig("redis", redis_url, namespace) as opened:
        assert isinstance(opened, RedisRig)
        limiter = RedisLimiter(opened.redis, Keys(prefix="tstest", namespace=namespace))
        assert metrics_module.METRICS is METRICS
        upstream = f"default-{namespace}"
        for _ in range(3):
            await limiter.acquire(upstream, 1, MINUTE_MS)
        sample = REGISTRY.get_sample_value(
            "taskstream_limiter_refusals_total", {"upstream": upstream}
        )
        assert sample == 2


def test_importing_the_module_again_registers_nothing_twice() -> None:
    spec = importlib.util.find_spec("taskstream.ratelimit.metrics")
    assert spec is not None and spec.loader is not None
    for copy in ("_metrics_copy_a", "_metrics_copy_b"):
        module = importlib.util.module_from_spec(spec)
        sys.modules[copy] = module
        try:
            spec.loader.exec_module(module)
            assert module.REGISTRY is not REGISTRY
        finally:
            del sys.modules[copy]


async def test_every_breaker_transition_is_a_log_event_naming_the_upstream(rig: Rig) -> None:
    with capture_logs() as logs:
        await rig.breakers.record("api", Outcome.FAILURE, SHORT, probe_round=None)
        opened = await rig.breakers.record("api", Outcome.FAILURE, SHORT, probe_round=None)
        await rig.breakers.admit("api", SHORT)  # refused while open: no change, no event
        await rig.wait_until_ms(opened.state.since_ms + SHORT.cooldown_ms)
        probe = await rig.breakers.admit("api", SHORT)
        await rig.breakers.record("api", Outcome.SUCCESS, SHORT, probe_round=probe.probe_round)
    events = [(e["event"], e["upstream"], e["log_level"]) for e in logs]
    assert events == [
        ("breaker.opened", "api", "warning"),
        ("breaker.half_open", "api", "info"),
        ("breaker.closed", "api", "info"),
    ]
