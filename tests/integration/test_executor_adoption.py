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
from taskstream.core.reasons import RELEASED
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from tests.agents import Params
from tests.integration.executor_cases import TASKS, harness, reach
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import lease_end


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def test_a_claim_won_before_the_store_failed_is_handed_back_at_a_stop_in_the_outage(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission's claim commits and answers, then the store fails (the history read for
    the retry's budget). The executor admits the batch again while the store is still down
    (that claim fails too), and is stopped. The claim won first is this process's and never
    ran: it is handed back (RETRYING, released, not counted), not left RUNNING for the
    sweeper to time out, which would fail this one-attempt task as poison unrun."""
    row = await h.trigger(TASKS, "slow-once")
    first = Running(h.executor(grace_s=0.05))  # a released first attempt, so that the retry
    await reach(h, row.id, Status.RUNNING)  # reads its history when it is claimed
    await first.close()
    await h.scheduler().run_pass()

    down = asyncio.Event()
    claim_tried_in_outage = asyncio.Event()
    histories, claim_many = h.store.histories, h.store.claim_many

    async def failing_histories(*args: Any, **kwargs: Any) -> Any:
        down.set()  # the store goes away right after the claim's commit
        raise StoreUnavailable("store: gone")

    async def claim_while_down(*args: Any, **kwargs: Any) -> Any:
        if down.is_set():
            claim_tried_in_outage.set()
            raise StoreUnavailable("store: gone")
        return await claim_many(*args, **kwargs)

    monkeypatch.setattr(h.store, "histories", failing_histories)
    monkeypatch.setattr(h.store, "claim_many", claim_while_down)
    ex = Running(h.executor(grace_s=5))
    await asyncio.wait_for(claim_tried_in_outage.wait(), timeout=20)
    monkeypatch.setattr(h.store, "histories", histories)  # the store answers again
    monkeypatch.setattr(h.store, "claim_many", claim_many)
    await ex.close()

    after = await h.store.get_instance(row.id)
    assert after is not None
    last = (await h.store.history(row.id))[-1]
    assert (after.status, last.reason) == (Status.RETRYING, RELEASED), (after.status, last)


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


async def test_a_claim_whose_reply_was_lost_in_an_outage_is_noted_at_a_stop(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission's claim commits, but its reply is lost as the store goes away, and the
    executor is stopped before the store answers again. The executor cannot know its claim
    landed, so it notes it (`handover`) as a release: once the store is back, the sweeper
    hands the run back (RETRYING, released, not counted) instead of timing it out as
    `owner_lost`, which would fail this one-attempt task as poison unrun."""
    row = await h.trigger(TASKS, "slow-once")
    lost = asyncio.Event()
    claim_many = h.store.claim_many

    async def reply_lost(*args: Any, **kwargs: Any) -> Any:
        if lost.is_set():
            raise StoreUnavailable("store: gone")
        await claim_many(*args, **kwargs)
        lost.set()  # committed; the reply and the store go away
        raise StoreUnavailable("store: connection lost")

    monkeypatch.setattr(h.store, "claim_many", reply_lost)
    ex = Running(h.executor(grace_s=5))
    await asyncio.wait_for(lost.wait(), timeout=20)
    await ex.close()
    monkeypatch.setattr(h.store, "claim_many", claim_many)  # the store answers again

    claimed = await h.store.get_instance(row.id)
    assert claimed is not None and claimed.status is Status.RUNNING
    await h.sweeper().sweep_once()
    after = await h.store.get_instance(row.id)
    assert after is not None
    last = (await h.store.history(row.id))[-1]
    assert (after.status, last.reason, last.attempt) == (Status.RETRYING, RELEASED, 1), (
        after.status,
        last,
    )
