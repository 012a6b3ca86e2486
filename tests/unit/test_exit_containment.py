"""The executor process's task factory: `SystemExit` and `KeyboardInterrupt` in any task reach
its awaiter as `ExitInTask`, and a task behaves as a plain one otherwise."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from taskstream.executor.exits import ExitInTask, contain_exits


async def _raises(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
async def test_an_exit_in_a_gathered_task_reaches_the_awaiter_as_an_error(
    exc: BaseException,
) -> None:
    loop = asyncio.get_running_loop()
    loop.set_task_factory(contain_exits)
    try:
        with pytest.raises(ExitInTask) as caught:
            await asyncio.gather(_raises(exc))
    finally:
        loop.set_task_factory(None)
    assert caught.value.__cause__ is exc


async def test_results_errors_and_cancellation_are_those_of_a_plain_task() -> None:
    loop = asyncio.get_running_loop()
    loop.set_task_factory(contain_exits)
    try:
        assert await asyncio.create_task(asyncio.sleep(0, "ok"), name="n") == "ok"
        with pytest.raises(ValueError, match="v"):
            await asyncio.create_task(_raises(ValueError("v")))
        waiting = asyncio.create_task(asyncio.Event().wait(), name="waiting")
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert waiting.get_name() == "waiting" and waiting.cancelled()
    finally:
        loop.set_task_factory(None)


async def test_a_task_cancelled_before_it_starts_leaves_no_warning() -> None:
    loop = asyncio.get_running_loop()
    loop.set_task_factory(contain_exits)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task = asyncio.create_task(asyncio.sleep(1))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            del task
            gc.collect()
    finally:
        loop.set_task_factory(None)
    assert [str(w.message) for w in caught] == []
