"""A run admitted as a half-open breaker's trial call and then cancelled (a stop past the
grace, a fence) gives its trial slot back: the call never went out, and the slot kept would
refuse every run on every executor until the trial timed out."""

from __future__ import annotations

import asyncio

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import BreakerConfig, BreakerStatus, Outcome
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.integration.harness import Harness, Running, until

TASKS = """
upstreams:
  llm: {limit: 100, window: 60s}
tasks:
  - {id: slowllm, agent: slow, upstreams: [llm], payload: {seconds: 30}}
"""
CFG = BreakerConfig(failure_threshold=1, cooldown_ms=1, probes=1, probe_timeout_ms=60_000)


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    await store.upsert_upstreams({"llm": {"limit": 100, "window": 60.0, "burst": None}})
    return harness


async def test_the_trial_slot_of_a_cancelled_run_is_given_back(h: Harness) -> None:
    breakers = RedisBreakers(h.redis, h.keys)
    await breakers.record("llm", Outcome.FAILURE, CFG, probe_round=None)  # opens
    assert (await breakers.state("llm")).status is BreakerStatus.OPEN
    await asyncio.sleep(0.01)  # waits out the 1 ms cool-down: the next admission is a trial

    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), breakers, CFG)
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(TASKS, "slowllm", 1_000)
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20, grace_s=0.2)))

    async def running() -> bool:
        got = await h.store.get_instance(row.id)
        return got is not None and got.status is Status.RUNNING

    await until(running)
    state = await breakers.state("llm")
    assert state.status is BreakerStatus.HALF_OPEN and state.probes_admitted == 1
    await ex.close()  # grace 0.2 s < 30 s agent: the run is cancelled and released
    got = await h.store.get_instance(row.id)
    assert got is not None and got.status is Status.RETRYING

    decision = await breakers.admit("llm", CFG)
    assert decision.allowed, f"trial slot kept: runs refused for {decision.retry_after_ms} ms"
