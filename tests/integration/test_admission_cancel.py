"""A run admitted as a half-open breaker's trial call and then cancelled (a stop past the
grace, a fence) gives its trial slot back: the call never went out, and the slot kept would
refuse every run on every executor until the trial timed out. A run whose agent has already
ended when the cancellation comes keeps its end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.memory import MemoryBreakers, MemoryLimiter
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.integration.harness import Harness, Running, until

TASKS = """
upstreams:
  llm: {limit: 100, window: 60s}
tasks:
  - {id: slowllm, agent: slow, upstreams: [llm], payload: {seconds: 30}}
  - {id: ask, agent: echo, upstreams: [llm], retry: {max_attempts: 3}}
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


class _SlowReports(UpstreamGate):
    """A gate whose breaker reports take `delay_s` (a slow Redis at shutdown); `reporting`
    is set when the first one starts, after the agent has returned."""

    delay_s = 2.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reporting = asyncio.Event()

    async def record_call(
        self, name: str, outcome: Outcome, *, probe_round: int | None
    ) -> int | None:
        self.reporting.set()
        await asyncio.sleep(self.delay_s)
        return await super().record_call(name, outcome, probe_round=probe_round)


async def test_a_run_whose_agent_ended_is_committed_though_the_stop_comes_first(
    h: Harness,
) -> None:
    """The agent has returned; its outcome is being reported to the breaker when the stop's
    grace (0.3 s) ends. The run is committed SUCCESS, not released to run again."""
    gate = _SlowReports(h.store, MemoryLimiter(h.clock), MemoryBreakers(h.clock))
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(TASKS, "ask", 1_000)
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20, grace_s=0.3)))
    await asyncio.wait_for(gate.reporting.wait(), timeout=20)
    await ex.close()
    got = await h.store.get_instance(row.id)
    assert got is not None
    history = [x.reason for x in await h.store.history(row.id)]
    assert (got.status, got.attempt) == (Status.SUCCESS, 1), history
    assert "released" not in history
