"""Work-stream keys that hold another type of value (see `errors.WrongType`): which reply
says so, and which key it is. Redis's WRONGTYPE reply does not name the key; a command on
several streams (a blocking read, a pipeline) has its keys' types asked (TYPE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from taskstream.core.denials import commands
from taskstream.core.errors import WrongType
from taskstream.core.protocol import Keys, Priority, WorkEntry, encode

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


@commands("XADD")
async def publish_each(
    redis: aioredis.Redis, keys: Keys, entries: Sequence[tuple[Priority, WorkEntry]]
) -> list[str | WrongType]:
    """XADD each entry in one pipeline (no MULTI: each XADD stands alone): its id in order,
    or the `WrongType` of its stream when that key holds another type, so the entries of the
    other streams are added all the same. Any other error raises (the first one)."""
    if not entries:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for priority, entry in entries:
            pipe.xadd(keys.stream(priority), encode(entry))  # type: ignore[arg-type]
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    out: list[str | WrongType] = []
    for (priority, _), reply in zip(entries, replies, strict=True):
        if isinstance(reply, Exception) and not wrong_type(reply):
            raise reply
        if isinstance(reply, ResponseError):
            found = await named(redis, "XADD", [keys.stream(priority)], reply)
            if not isinstance(found, WrongType):
                raise found
            out.append(found)
        else:
            out.append(reply.decode() if isinstance(reply, bytes) else str(reply))
    return out
