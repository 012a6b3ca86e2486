"""A role's loop step, and a stop that must not wait for a step stuck on a server."""

from __future__ import annotations

import asyncio

import pytest

from taskstream.core import futures
from taskstream.core.futures import unless_stopped


async def test_a_step_that_ends_gives_its_result() -> None:
    async def step() -> int:
        return 7

    assert await unless_stopped(step(), asyncio.Event()) == 7


async def test_a_step_that_fails_raises() -> None:
    async def step() -> int:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await unless_stopped(step(), asyncio.Event())


async def test_a_step_under_way_when_the_stop_comes_may_still_end() -> None:
    stop, go_on = asyncio.Event(), asyncio.Event()

    async def step() -> int:
        stop.set()
        await go_on.wait()
        return 7

    async def later() -> None:
        await stop.wait()
        go_on.set()

    helper = asyncio.create_task(later())
    assert await unless_stopped(step(), stop) == 7
    await helper


async def test_a_step_that_does_not_end_after_the_stop_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(futures, "STEP_END_S", 0.01)
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def step() -> int:
        stop.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 7

    assert await unless_stopped(step(), stop) is None
    assert cancelled.is_set()


async def test_a_step_that_ignores_its_cancellation_is_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(futures, "STEP_END_S", 0.01)
    monkeypatch.setattr(futures, "CANCEL_WAIT_S", 0.01)
    stop, release = asyncio.Event(), asyncio.Event()

    async def step() -> int:
        stop.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue
        return 7

    assert await unless_stopped(step(), stop) is None
    release.set()


async def test_a_loops_own_stop_waiter_serves_every_step_and_is_left_running() -> None:
    stop = asyncio.Event()
    stopping = asyncio.ensure_future(stop.wait())

    async def step() -> int:
        return 7

    assert [await unless_stopped(step(), stopping) for _ in range(3)] == [7, 7, 7]
    assert not stopping.done()
    stop.set()
    await stopping
