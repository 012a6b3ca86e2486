"""`SystemExit` and `KeyboardInterrupt` raised in any task of an executor process become an
ordinary error of that task.

asyncio lets these two out of the event loop from whichever task raises them, which stops
the process: every run in it is abandoned, and the exit code says nothing went wrong. The
runner turns those an agent's own coroutine raises into a failed attempt; an agent may also
raise them in a task of its own (`asyncio.gather`, `wait_for`), which only a task factory
sees. The executor's own code raises neither: its stop comes from the signal handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, TypeVar, cast

T = TypeVar("T")


class ExitInTask(Exception):
    """A task raised `SystemExit` or `KeyboardInterrupt` (the cause); its awaiter gets this."""


async def _contained(coro: Coroutine[Any, Any, T] | Generator[Any, None, T]) -> T:
    try:
        # A generator here is one asyncio takes for a coroutine (`types.coroutine`).
        return await cast(Awaitable[T], coro)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise ExitInTask(f"{type(exc).__name__}: {exc}") from exc


def contain_exits(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
    **kwargs: Any,
) -> asyncio.Task[T]:
    """A task factory (`loop.set_task_factory`): tasks as usual, with `ExitInTask` raised in
    place of `SystemExit` and `KeyboardInterrupt`."""
    task = asyncio.Task(_contained(coro), loop=loop, **kwargs)
    # A task cancelled before its first step never starts `coro`: closing it then keeps
    # Python from warning that it was never awaited, as it does not for a plain task.
    task.add_done_callback(lambda _: coro.close())
    return task
