"""Small helpers for futures: those that group commits resolve for their callers, and a
role's loop step that a stop must not wait for."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def mark_retrieved(done: asyncio.Future[Any]) -> None:
    """A done-callback: mark a future's error as seen. Group commits resolve futures whose
    callers may have been cancelled meanwhile; the batch's failure is logged by its writer,
    so asyncio must not report it again as "never retrieved"."""
    if not done.cancelled():
        done.exception()


_DETACHED: set[asyncio.Future[Any]] = set()
"""Detached futures still going (kept referenced until done: one may outlive its awaiter)."""


def detached(work: Coroutine[Any, Any, T], within_s: float) -> asyncio.Future[T]:
    """`work` within `within_s`, as a future that goes on by itself when its awaiter is
    cancelled (await it through `asyncio.shield`): kept referenced until done, its failure
    read (the awaiter, if still there, reports it). For clean-up a cancellation must not cut
    short: settling or giving back what a run's admission took."""
    future = asyncio.ensure_future(asyncio.wait_for(work, within_s))
    _DETACHED.add(future)
    future.add_done_callback(_DETACHED.discard)
    future.add_done_callback(mark_retrieved)
    return future


STEP_END_S = 1.0
"""How long a step under way when a stop comes gets to end by itself (s): a blocking read of
the default `block_ms`, or a claim, ends within it when the servers answer."""
CANCEL_WAIT_S = 1.0
"""How long a step cancelled by a stop gets to end (s) before it is left behind."""


async def unless_stopped(
    step: Coroutine[Any, Any, T], stop: asyncio.Event | asyncio.Future[Any]
) -> T | None:
    """`step`'s result; None when `stop` is set and the step has not ended `STEP_END_S`
    later. A role's loop checks `stop` only between steps, and a step waiting on a server
    that stopped answering (frozen, or cut off without a reset) may not end before its read
    timeout: a stop must not wait for it. Such a step is cancelled, as a crash would end it,
    and given `CANCEL_WAIT_S` to end (its clean-up may wait on the same server); after that
    it is left to the process's exit. `stop` may be the future of the loop's own
    `stop.wait()`, made once: a loop that steps often then makes one task a step, not two."""
    task = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait()) if isinstance(stop, asyncio.Event) else stop
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=STEP_END_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        if stopping is not stop:
            stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(mark_retrieved)
    await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
    return None
