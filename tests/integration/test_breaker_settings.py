"""Each upstream's stored `breaker:` settings, on real Redis and a real store: the executors'
gate opens the breaker after the configured number of failures and defers by the configured
cool-down, and the scheduler holds ticks back for that cool-down, while an upstream without
settings keeps the defaults (5 failures, 30 s)."""

from __future__ import annotations

from functools import partial

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.definitions import UpstreamCache, upstream_configs
from taskstream.core.protocol import Keys
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.outcome import defer_jitter_max_ms
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.runtime.upstream_holds import BreakerHolds
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from taskstream.scheduler.trail import decision_trail
from tests.integration.harness import Harness, Running, until

TASKS = """
upstreams:
  llm: {limit: 100, window: 1m, breaker: {failures: 2, cooldown: 5s}}
  web: {limit: 100, window: 1m}
  hook: {breaker: {failures: 1, cooldown: 500ms}}
tasks:
  - {id: ask, agent: echo, upstreams: [llm], retry: {max_attempts: 1}}
  - {id: flaky, agent: flaky, upstreams: [llm], retry: {max_attempts: 1},
     payload: {fail_until: 99}}
  - {id: ping, agent: echo, upstreams: [hook], schedule: {every: 1h}, window: 10m}
"""
COOLDOWN_MS = 5_000
SLACK_MS = 3_000
"""How much of a cool-down the test itself may use up between the breaker opening and the
moment the cool-down left is read (Redis server clock)."""
H0 = 1_780_002_000_000


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys, FixedClock(H0 - 1))
    await harness.apply(TASKS)
    await store.upsert_upstreams(upstream_configs(parse_task_file_text(TASKS, "t.yaml")))
    return harness


def gate(h: Harness) -> UpstreamGate:
    """The gate as `taskstream executor` builds it: no breaker config of its own."""
    return UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), RedisBreakers(h.redis, h.keys))


async def fail_once(g: UpstreamGate, name: str) -> int | None:
    wait_ms, _, probe_round = await g.admit_call(name)
    assert wait_ms is None
    return await g.record_call(name, Outcome.FAILURE, probe_round=probe_round)


async def test_the_gate_opens_after_the_configured_failures_for_the_configured_cool_down(
    h: Harness,
) -> None:
    g = gate(h)
    breakers = RedisBreakers(h.redis, h.keys)
    assert await fail_once(g, "llm") is None
    assert (await breakers.state("llm")).status is BreakerStatus.CLOSED
    assert await fail_once(g, "llm") == COOLDOWN_MS  # opened by the 2nd failure: all of it left
    assert (await breakers.state("llm")).status is BreakerStatus.OPEN
    wait_ms = (await g.admit_call("llm"))[0]
    assert wait_ms is not None and COOLDOWN_MS - SLACK_MS < wait_ms <= COOLDOWN_MS
    # An upstream stored without settings keeps the defaults: 2 failures leave it closed.
    for _ in range(2):
        assert await fail_once(g, "web") is None
    assert (await breakers.state("web")).status is BreakerStatus.CLOSED
    assert g.config("web") == BreakerConfig()
    assert g.config("llm") == BreakerConfig(failure_threshold=2, cooldown_ms=COOLDOWN_MS)


async def has_status(h: Harness, instance_id: str, status: Status) -> bool:
    row = await h.store.get_instance(instance_id)
    return row is not None and row.status is status


async def test_runs_behind_the_configured_breaker_are_deferred_by_its_cool_down(
    h: Harness,
) -> None:
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate(h)
    )
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:
        # One at a time, so each failure is recorded before the next run. The first fails
        # (max_attempts 1); the second opens the breaker and is deferred instead.
        for n, ends_as in enumerate((Status.FAILED, Status.RETRYING)):
            failing = await h.trigger(TASKS, "flaky", 1_000 + n)
            await until(partial(has_status, h, failing.id, ends_as))
        assert (await RedisBreakers(h.redis, h.keys).state("llm")).status is BreakerStatus.OPEN
        later = await h.trigger(TASKS, "ask", 2_000)
        await until(partial(has_status, h, later.id, Status.RETRYING))
    finally:
        await ex.close()
    row = await h.store.get_instance(later.id)
    assert row is not None and row.next_attempt_at_ms is not None
    due_in_ms = row.next_attempt_at_ms - h.clock.now_ms()
    assert COOLDOWN_MS - SLACK_MS < due_in_ms <= COOLDOWN_MS + defer_jitter_max_ms(COOLDOWN_MS)


def held_by_stored_settings(h: Harness) -> Scheduler:
    """The scheduler as `taskstream scheduler` builds it, reading stored settings every pass."""
    holds = BreakerHolds(
        RedisBreakers(h.redis, h.keys), BreakerConfig(), UpstreamCache(h.store, min_interval_s=0)
    )
    return Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), holds=holds)


async def test_the_scheduler_holds_ticks_for_the_configured_cool_down(h: Harness) -> None:
    s = held_by_stored_settings(h)
    await s.run_pass()
    breakers = RedisBreakers(h.redis, h.keys)
    update = await breakers.record(
        "hook", Outcome.FAILURE, BreakerConfig(failure_threshold=1), probe_round=None
    )
    assert update.state.status is BreakerStatus.OPEN
    h.clock.set(H0)
    await s.run_pass()
    [held] = await decision_trail(h.store, "ping", H0)
    assert held.decision == "deferred"
    until_ms = held.details["held_by"]["hook"]
    assert H0 < until_ms <= H0 + 500  # the stored 500 ms, not the default 30 s
    assert await h.store.list_instances(task_id="ping") == []

    async def cooled_down() -> bool:  # on the Redis server's clock, which the breaker uses
        return (await breakers.states(["hook"])).at_ms >= update.state.since_ms + 500

    await until(cooled_down, timeout_s=10)
    h.clock.advance(1_000)
    await s.run_pass()
    [row] = await h.store.list_instances(task_id="ping")
    assert (row.scheduled_for_ms, row.status) == (H0, Status.DISPATCHED)
