"""`AgentContext.once` and `forget`: which side-effect keys a run commits."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from taskstream.agents.base import AgentContext, effect_key


def context(done: set[str] | None = None) -> AgentContext:
    committed = done or set()

    async def effect_done(key: str) -> bool:
        return key in committed

    return AgentContext(
        instance_id="i1",
        task_id="daily",
        attempt=1,
        idempotency_key="daily:2026-12-01",
        scheduled_for_ms=0,
        log=structlog.get_logger(),
        effect_done=effect_done,
    )


async def test_once_hands_out_an_effect_once_per_run() -> None:
    ctx = context()
    assert [await ctx.once("send"), await ctx.once("send")] == [True, False]
    assert ctx.side_effects == ["daily:2026-12-01:send"]


async def test_an_effect_committed_earlier_is_not_handed_out() -> None:
    ctx = context({"daily:2026-12-01:send"})
    assert await ctx.once("send") is False
    assert ctx.side_effects == []


async def test_a_forgotten_effect_is_not_committed_and_can_be_handed_out_again() -> None:
    ctx = context()
    assert await ctx.once("send") and await ctx.once("archive")
    ctx.forget("send")
    assert ctx.side_effects == ["daily:2026-12-01:archive"]
    assert await ctx.once("send") is True


async def test_forgetting_an_effect_not_handed_out_changes_nothing() -> None:
    ctx = context()
    await ctx.once("archive")
    ctx.forget("send")
    assert ctx.side_effects == ["daily:2026-12-01:archive"]


async def test_a_long_key_is_forgotten_by_its_stored_form() -> None:
    ctx = context()
    name = "n" * 300
    assert await ctx.once(name)
    assert ctx.side_effects == [effect_key("daily:2026-12-01", name)]
    ctx.forget(name)
    assert ctx.side_effects == []


async def test_concurrent_calls_of_one_run_for_one_key_hand_it_out_once() -> None:
    """An agent fanning out (`gather` over URLs, two with one fingerprint) asked `once` twice
    before the store answered either: both were told to perform the effect."""
    answered = asyncio.Event()

    async def effect_done(key: str) -> bool:
        await answered.wait()  # a store round trip
        return False

    ctx = context()
    ctx.effect_done = effect_done
    calls = asyncio.gather(ctx.once("send"), ctx.once("send"), ctx.once("other"))
    await asyncio.sleep(0)
    answered.set()
    assert list(await calls) == [True, False, True]
    assert ctx.side_effects == ["daily:2026-12-01:send", "daily:2026-12-01:other"]


async def test_an_effect_whose_check_failed_is_not_kept() -> None:
    async def effect_done(key: str) -> bool:
        raise ConnectionError("store down")

    ctx = context()
    ctx.effect_done = effect_done
    with pytest.raises(ConnectionError):
        await ctx.once("send")
    assert ctx.side_effects == []


@pytest.mark.parametrize("done", [False, True])
async def test_a_forget_while_another_call_asks_the_store_changes_nothing(done: bool) -> None:
    """A call told False forgets the key (a shared error path) while the first call of the
    run still waits for the store: the first call's answer stands, and a key it hands out is
    committed."""
    answered = asyncio.Event()

    async def effect_done(key: str) -> bool:
        await answered.wait()
        return done

    ctx = context()
    ctx.effect_done = effect_done
    first = asyncio.ensure_future(ctx.once("send"))
    await asyncio.sleep(0)
    assert await ctx.once("send") is False
    ctx.forget("send")
    answered.set()
    assert await first is not done
    assert ctx.side_effects == ([] if done else ["daily:2026-12-01:send"])
