"""Work-stream keys that hold another type of value (see `errors.WrongType`): which reply
says so, and which key it is. Redis's WRONGTYPE reply does not name the key; a command on
several streams (a blocking read, a pipeline) has its keys' types asked (TYPE)."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from taskstream.core.errors import WrongType

STREAM_OR_NONE = ("stream", "none")
"""Types a work-stream key may have: a stream, or no key yet (XGROUP CREATE MKSTREAM)."""


def wrong_type(exc: BaseException) -> bool:
    """The reply says a key holds another type of value (looked for anywhere in the
    message: redis-py puts a pipeline's command before it)."""
    return isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc)


async def named(
    redis: aioredis.Redis, command: str, keys: Sequence[str], exc: ResponseError
) -> WrongType | ResponseError:
    """The `WrongType` of `command` naming the first of `keys` that is no stream, else `exc`
    as it is (the key was mended or deleted meanwhile)."""
    for key in keys:
        kind = await redis.type(key)
        text = kind.decode() if isinstance(kind, bytes) else str(kind)
        if text not in STREAM_OR_NONE:
            return WrongType(command, key, text)
    return exc
