"""A failure that leaves the breaker open defers the run instead of spending an attempt.

The upstream-aware client over the executor's gate on real Redis, calling a real server on
127.0.0.1: the failure that trips the breaker, a failed half-open probe and a failure of a call
in flight when the breaker opened raise `UpstreamOutage` (an `UpstreamDeferred` due when the
cool-down ends, and still an `UpstreamUnavailable`); failures below the threshold stay plain
retriable failures. End to end, an `http` run whose call trips the breaker is deferred with its
attempt given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from taskstream.agents.errors import UpstreamDeferred, UpstreamOutage, UpstreamUnavailable
from taskstream.agents.registry import default_registry
from taskstream.agents.upstream import UpstreamClient
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.outcome import defer_jitter_max_ms
from taskstream.executor.retry import attempts_used
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import BreakerStatus
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.integration.harness import Harness, Running, until
from tests.ratelimit.rigs import RedisRig
from tests.support.databases import temp_database
from tests.support.loopback import Loopback, Reply

TRIP_AT_ONCE = BreakerConfig(failure_threshold=1, cooldown_ms=60_000)
SHORT = BreakerConfig(failure_threshold=1, cooldown_ms=300)


@pytest.fixture
async def db_url() -> AsyncIterator[str]:
    """The client tests need the store only for (absent) limits: SQLite is enough."""
    async with temp_database("sqlite") as url:
        yield url


def make_gate(
    store: SqlStore, redis: streams.Redis, keys: Keys, cfg: BreakerConfig
) -> UpstreamGate:
    return UpstreamGate(store, RedisLimiter(redis, keys), RedisBreakers(redis, keys), cfg)


async def status_of(redis: streams.Redis, keys: Keys) -> BreakerStatus:
    return (await RedisBreakers(redis, keys).state("api")).status


async def call(client: UpstreamClient, url: str, **kwargs: Any) -> Exception:
    """The error one call raises (the test fails if it returns)."""
    with pytest.raises(UpstreamUnavailable) as caught:
        await client.get(url, upstream="api", **kwargs)
    return caught.value


async def test_the_failure_that_opens_the_breaker_defers_for_the_cool_down(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(store, redis, keys, TRIP_AT_ONCE).bind(()))
    async with Loopback(Reply(503)) as server:
        error = await call(client, server.url())
        await client.aclose()
    assert isinstance(error, UpstreamOutage) and isinstance(error, UpstreamDeferred)
    assert (error.upstream, error.status, error.retry_after_ms) == ("api", 503, 60_000)
    assert "HTTP 503" in str(error) and "breaker open" in str(error)
    assert await status_of(redis, keys) is BreakerStatus.OPEN
    assert len(server.seen) == 1


async def test_failures_below_the_threshold_stay_retriable_failures(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    cfg = BreakerConfig(failure_threshold=3, cooldown_ms=60_000)
    client = UpstreamClient(make_gate(store, redis, keys, cfg).bind(()))
    async with Loopback(Reply(500)) as server:
        errors = [await call(client, server.url()) for _ in range(3)]
        await client.aclose()
    assert [isinstance(e, UpstreamDeferred) for e in errors] == [False, False, True]
    assert isinstance(errors[2], UpstreamOutage) and errors[2].retry_after_ms == 60_000


async def test_a_failed_probe_defers_for_a_new_cool_down(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(store, redis, keys, SHORT).bind(()))
    async with Loopback(Reply(503)) as server:
        await call(client, server.url())
        opened = await RedisBreakers(redis, keys).state("api")
        await RedisRig(redis, keys).wait_until_ms(opened.since_ms + SHORT.cooldown_ms)
        probe = await call(client, server.url())
        await client.aclose()
    reopened = await RedisBreakers(redis, keys).state("api")
    assert reopened.status is BreakerStatus.OPEN and reopened.since_ms > opened.since_ms
    assert isinstance(probe, UpstreamOutage) and probe.retry_after_ms == SHORT.cooldown_ms
    assert len(server.seen) == 2


async def test_a_call_in_flight_when_the_breaker_opened_defers_for_what_is_left(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A run's call is sent while the breaker is closed; while its upstream holds it, another
    call's failure opens the breaker; then the held call fails too. It is deferred for the
    cool-down left, as the outage is known."""
    gate = make_gate(store, redis, keys, TRIP_AT_ONCE)
    admitted = await gate.admit_run(["api"])  # admitted while closed
    assert not isinstance(admitted, int)
    in_flight = UpstreamClient(admitted)
    tripping = UpstreamClient(gate.bind(()))
    held = asyncio.Event()
    async with Loopback(Reply(503, hold=held)) as slow, Loopback(Reply(503)) as fast:
        late = asyncio.create_task(call(in_flight, slow.url()))
        await asyncio.wait_for(slow.arrived.wait(), timeout=10)
        await call(tripping, fast.url())
        held.set()
        error = await asyncio.wait_for(late, timeout=10)
        await tripping.aclose()
        await in_flight.aclose()
    assert isinstance(error, UpstreamOutage)
    assert 50_000 <= error.retry_after_ms <= TRIP_AT_ONCE.cooldown_ms
    assert (len(slow.seen), len(fast.seen)) == (1, 1)


async def test_a_timeout_that_opens_the_breaker_defers_too(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(store, redis, keys, TRIP_AT_ONCE).bind(()), timeout_s=0.2)
    async with Loopback(Reply(200, hold=asyncio.Event())) as server:
        error = await call(client, server.url("/slow"))
        await client.aclose()
    assert isinstance(error, UpstreamOutage) and error.status is None
    assert "timed out" in str(error)


async def test_a_longer_retry_after_is_honoured(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=1_000)
    client = UpstreamClient(make_gate(store, redis, keys, cfg).bind(()))
    async with Loopback(Reply(429, headers={"Retry-After": "120"})) as server:
        error = await call(client, server.url())
        await client.aclose()
    assert isinstance(error, UpstreamOutage) and error.retry_after_ms == 120_000


async def test_check_false_returns_the_response_that_opened_the_breaker(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(store, redis, keys, TRIP_AT_ONCE).bind(()))
    async with Loopback(Reply(503, b"down")) as server:
        response = await client.get(server.url(), upstream="api", check=False)
        await client.aclose()
    assert (response.status, response.text) == (503, "down")
    assert await status_of(redis, keys) is BreakerStatus.OPEN


async def test_a_run_whose_call_opens_the_breaker_keeps_its_attempt(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    async with Loopback(Reply(503)) as server:
        text = f"""
tasks:
  - id: ping
    agent: http
    upstreams: [api]
    retry: {{max_attempts: 1}}
    payload: {{url: "{server.url("/ping")}"}}
"""
        await h.apply(text)
        instance = await h.trigger(text, "ping")
        gate = make_gate(store, redis, keys, TRIP_AT_ONCE)
        deps = ExecutorDeps(store, redis, keys, default_registry(()), h.clock, gate=gate)
        ex = Running(Executor(deps, ExecutorConfig(consumer="o1", block_ms=20)))
        try:

            async def ran() -> bool:
                row = await store.get_instance(instance.id)
                return row is not None and row.status not in (Status.DISPATCHED, Status.RUNNING)

            await until(ran)
        finally:
            await ex.close()
    row = await store.get_instance(instance.id)
    assert row is not None and row.status is Status.RETRYING  # max_attempts 1, yet not FAILED
    history = await store.history(instance.id)
    assert history[-1].reason == "deferred"
    assert attempts_used(row.attempt, [(x.reason, x.attempt) for x in history]) == 0
    assert row.next_attempt_at_ms is not None
    assert (
        59_000 <= row.next_attempt_at_ms - h.clock.now_ms() <= 61_000 + defer_jitter_max_ms(60_000)
    )
    assert len(server.seen) == 1
