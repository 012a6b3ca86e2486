"""Agents used by the tests: failures of each class, side effects, and process crashes.

Loaded by executors started in tests through `TASKSTREAM_AGENT_MODULES=tests.agents`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from datetime import date
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.errors import FatalError, NeedsReview, RetriableError


class Params(BaseModel):
    """`fail_until`: attempts up to this one fail; `kind`: how they fail; `seconds`: sleep;
    `stall_until`: `flaky` attempts up to this one first sleep `seconds`; `effect`, `forget`:
    see `_effect`; `marker`, `marker_date`: see `_producer`."""

    model_config = ConfigDict(extra="allow")
    fail_until: int = 0
    stall_until: int = 0
    kind: str = "retriable"
    seconds: float = 0.0
    effect: str = ""
    forget: bool = False
    marker: str = "raw.ready"
    marker_date: str | None = None


class Abort(BaseException):
    """An error of some library's own that derives from `BaseException` alone (as gevent's
    `Timeout` or trio's `Cancelled` do): neither an `Exception` nor asyncio's."""


async def _flaky(ctx: AgentContext, p: Params) -> dict[str, Any]:
    if ctx.attempt <= p.stall_until:
        await asyncio.sleep(p.seconds)
    if ctx.attempt <= p.fail_until and p.kind == "cancelled":
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()  # work of its own, cancelled; nobody cancelled the run
        await inner
    if ctx.attempt <= p.fail_until and p.kind == "exit_in_task":  # in a task of its own
        await asyncio.gather(_exit())
    if ctx.attempt <= p.fail_until and p.kind == "busy":  # the upstream asked for 10 min
        raise RetriableError(f"attempt {ctx.attempt}: busy", retry_after_ms=600_000)
    if ctx.attempt <= p.fail_until:
        errors = {
            "retriable": RetriableError,
            "fatal": FatalError,
            "review": NeedsReview,
            "unexpected": ValueError,
            # Not `Exception`s: asyncio lets these two out of the event loop, the third is
            # kept as the task's error.
            "exit": SystemExit,
            "interrupt": KeyboardInterrupt,
            "generator_exit": GeneratorExit,
            "abort": Abort,
        }
        raise errors[p.kind](f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


async def _exit() -> None:
    raise SystemExit(3)


async def _effect(ctx: AgentContext, p: Params) -> dict[str, Any]:
    """Performs the effect `effect` once; attempts up to `fail_until` fail after `once`, and
    with `forget` say the effect did not happen."""
    performed = await ctx.once(p.effect or "send")
    await asyncio.sleep(p.seconds)
    if ctx.attempt <= p.fail_until:
        if p.forget:
            ctx.forget(p.effect or "send")
        raise RetriableError(f"attempt {ctx.attempt} fails")
    return {"performed": performed, "attempt": ctx.attempt}


async def _crash(ctx: AgentContext, p: Params) -> None:
    """Kills its own process, every time (a poison instance)."""
    os.kill(os.getpid(), signal.SIGKILL)


async def _slow(ctx: AgentContext, p: Params) -> dict[str, Any]:
    await asyncio.sleep(p.seconds)
    return {"slept": p.seconds, "attempt": ctx.attempt}


async def _stubborn(ctx: AgentContext, p: Params) -> dict[str, Any]:
    """Sleeps `seconds`, ignoring every cancellation meanwhile (a misbehaving agent)."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + p.seconds
    while loop.time() < ends:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
    return {"slept": p.seconds}


async def _hog(ctx: AgentContext, p: Params) -> dict[str, Any]:
    """Works `seconds` without yielding (CPU-bound work, a blocking call): it holds the
    executor's event loop all that time."""
    time.sleep(p.seconds)  # noqa: ASYNC251 - holding the loop is what this agent is for
    return {"held_s": p.seconds}


async def _producer(ctx: AgentContext, p: Params) -> dict[str, Any]:
    """Marks `marker` (`raw.ready`) for `marker_date` (its business date), as a
    data-collection agent would."""
    return {"marked": await ctx.mark_ready(p.marker, p.marker_date)}


class Mode(Enum):
    FAST = "fast"
    THOROUGH = "thorough"


class StrictParams(BaseModel):
    """Strict params (no coercion) whose fields JSON holds as strings or lists: a date, an
    enum and a tuple."""

    model_config = ConfigDict(strict=True, extra="forbid")
    when: date
    mode: Mode
    tags: tuple[str, ...] = ()


async def _dated(ctx: AgentContext, p: StrictParams) -> dict[str, Any]:
    return {"weekday": p.when.isoweekday(), "mode": p.mode.value, "tags": list(p.tags)}


AGENTS = (
    FunctionAgent(name="producer", params_model=Params, fn=_producer),
    FunctionAgent(name="flaky", params_model=Params, fn=_flaky),
    FunctionAgent(name="effect", params_model=Params, fn=_effect),
    FunctionAgent(name="crash", params_model=Params, fn=_crash),
    FunctionAgent(name="slow", params_model=Params, fn=_slow),
    FunctionAgent(name="stubborn", params_model=Params, fn=_stubborn),
    FunctionAgent(name="hog", params_model=Params, fn=_hog),
    FunctionAgent(name="dated", params_model=StrictParams, fn=_dated),
)
