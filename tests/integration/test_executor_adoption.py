"""Claims an executor won while the store failed around them: a stop still hands them back,
and a claim adopted after its reply was lost keeps its lease."""

from __future__ import annotations

import asyncio
from random import Random
from typing import Any

import pytest

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import to_records
from taskstream.core.errors import StoreUnavailable
from taskstream.core.protocol import Keys
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.sql import SqlStore
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from tests.agents import Params
from tests.integration.executor_cases import harness
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import lease_end


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


HELD = """
tasks:
  - id: first
    agent: held
    lease: 60s
    timeout: 1h
  - id: second
    agent: held
    lease: 60s
    timeout: 1h
"""


def _held_executor(h: Harness, started: list[str], release: asyncio.Event) -> Executor:
    async def held(ctx: AgentContext, p: Params) -> dict[str, Any]:
        started.append(ctx.task_id)
        await release.wait()
        return {}

    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="held", params_model=Params, fn=held))
    deps = ExecutorDeps(h.store, h.redis, h.keys, registry, h.clock, Random(7))
    return Executor(deps, ExecutorConfig(consumer="c1", block_ms=20))


async def test_a_claim_adopted_after_an_outage_has_its_lease_extended_at_once(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c1 runs `first`. Its claim of `second` commits but the reply is lost, and the store
    stays away 55 s of the 60 s lease. When it answers, the heartbeat extends `first`, then
    the admission adopts `second`, whose lease has 5 s left: it is extended at the next
    beat, not a third of a lease after `first`'s, when the sweeper would already have timed
    out a run whose executor is alive."""
    h = outage
    started: list[str] = []
    release = asyncio.Event()
    executor = _held_executor(h, started, release)
    taskfile = parse_task_file_text(HELD, "held.yaml", known_agents={"held"})
    await h.store.upsert_definitions(to_records(taskfile))
    t0 = h.clock.now_ms()
    first = await h.trigger(HELD, "first")
    ex = Running(executor)
    try:
        await until(lambda: _true(started == ["first"]))
        first_lease = await lease_end(h, first.id)
        state = {"lost_reply": False, "outage": False}
        claim_many = h.store.claim_many

        async def flaky_claims(*args: Any, **kwargs: Any) -> Any:
            if state["outage"]:
                raise StoreUnavailable("store: gone")
            won = await claim_many(*args, **kwargs)
            if won and not state["lost_reply"]:
                state["lost_reply"] = state["outage"] = True  # committed; the reply is lost
                raise StoreUnavailable("store: connection lost")
            return won

        monkeypatch.setattr(h.store, "claim_many", flaky_claims)
        second = await h.trigger(HELD, "second", fire_ms=t0 + 60_000)
        await until(lambda: _true(state["lost_reply"]))
        second_lease = await lease_end(h, second.id)
        h.clock.set(t0 + 55_000)  # 55 s of outage, on the executor's clock
        await until(lambda: _changed(h, first.id, first_lease))
        state["outage"] = False  # the store answers the admission too: `second` is adopted
        await until(lambda: _true(started == ["first", "second"]))
        await until(lambda: _changed(h, second.id, second_lease))
    finally:
        release.set()
        await ex.close()


async def _true(value: bool) -> bool:
    return value


async def _changed(h: Harness, instance_id: str, before: int) -> bool:
    return await lease_end(h, instance_id) != before
