"""Wake-up hints for the scheduler over Redis pub/sub.

Whoever changes something the scheduler reacts to (definitions applied, paused or resumed, a
readiness marker set, a run set to retry) publishes a hint on `Keys.control`; the scheduler
sleeps until its next due moment or a hint, whichever comes first. Hints carry no data and may
be lost (pub/sub is fire-and-forget): the scheduler still wakes at least every
`SAFETY_WAKE_S`, and everything it acts on is read from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core.denials import denied, log_denied, refused
from taskstream.core.errors import CommandDenied
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys

SAFETY_WAKE_S = 60.0


async def hint(redis: streams.Redis, keys: Keys, what: str) -> None:
    """Publish a wake-up hint; a Redis error is swallowed (the hint is only an optimisation),
    and a PUBLISH that Redis denies is logged (`redis.denied`, a warning: the scheduler still
    wakes within `SAFETY_WAKE_S`)."""
    try:
        await redis.publish(keys.control, what)
    except streams.DRIVER_ERRORS:
        pass
    except ResponseError as exc:
        if not denied(exc):
            raise
        found = refused(exc, "PUBLISH")
        get_logger(role="notify").warning(
            "redis.denied", command=found.command, reply=found.reply, hint=what
        )


class Wakeups:
    """A subscription to the control channel."""

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        self._pubsub: Any = redis.pubsub(ignore_subscribe_messages=True)
        self._channel = keys.control
        self._subscribed = False
        self._told = False
        """The denial of the subscription is logged already (once until it is allowed)."""

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a hint; True when one arrived. Drains queued hints.
        With Redis down it still waits (up to 1 s), so a caller's pause is not cut short;
        with the subscription denied (the channel or SUBSCRIBE, by the ACL) it waits the
        whole `timeout_s`, as if no hint came, and subscribes again the next time."""
        try:
            if not self._subscribed:
                await self._pubsub.subscribe(self._channel)
                self._subscribed = True
            message = await self._pubsub.get_message(timeout=max(0.0, timeout_s))
        except streams.DRIVER_ERRORS:
            self._subscribed = False
            await asyncio.sleep(min(timeout_s, 1.0))
            return False
        except ResponseError as exc:
            if not denied(exc):
                raise
            self._subscribed = False
            self._refused(refused(exc, "SUBSCRIBE", (self._channel,)))
            await asyncio.sleep(max(0.0, timeout_s))
            return False
        self._told = False
        got = message is not None
        while got and await self._pubsub.get_message(timeout=0.0) is not None:
            pass
        return got

    def _refused(self, exc: CommandDenied) -> None:
        if not self._told:
            log_denied(get_logger(role="scheduler"), exc, channel=self._channel)
            self._told = True

    async def close(self) -> None:
        with contextlib.suppress(*streams.DRIVER_ERRORS, ResponseError):
            await self._pubsub.aclose()
