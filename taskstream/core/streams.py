"""Thin Redis Streams shell over the wire format of `protocol`: publish, read, ack, dead-letter.

Invariants: entries are acknowledged and deleted together (XACK + XDEL in one MULTI) so that
`XLEN` is the real backlog; an entry moved (dead-lettered, or published again by the sweeper)
is copied and removed from its work stream in one script, so it is never lost and never read
again, and only while it is still pending, so movers that race move it once (`move`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from taskstream.core.denials import commands, denied, refused
from taskstream.core.errors import WrongType
from taskstream.core.protocol import (
    GROUP,
    PRIORITY_ORDER,
    Keys,
    Priority,
    RawFields,
    WorkEntry,
    dead_fields,
    encode,
)
from taskstream.core.redis_errors import (
    DRIVER_ERRORS,
    NoReplicasError,
    PersistenceError,
    ScriptBusyError,
    ServerRefusal,
    group_missing,
    outage_text,
    role_changed,
)
from taskstream.core.wrong_types import named, wrong_type

Redis = aioredis.Redis

__all__ = [
    "DRIVER_ERRORS",
    "Delivery",
    "NoReplicasError",
    "PersistenceError",
    "Redis",
    "ScriptBusyError",
    "ServerRefusal",
    "ack",
    "ack_many",
    "as_text",
    "connect",
    "dead_letter",
    "ensure_groups",
    "group_missing",
    "mark_alive",
    "move",
    "outage_text",
    "publish",
    "publish_many",
    "read",
    "role_changed",
    "touch",
]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One entry handed to this consumer: where it came from and its raw fields."""

    stream: str
    entry_id: str
    fields: RawFields


SOCKET_TIMEOUT_S = 5.0
"""How long a client waits for a connection or a reply (s) unless the URL says otherwise: a
frozen server fails the call, an outage to the roles, instead of holding it for ever (redis-py
before 8.0 waited without limit). Blocking reads end well within it (`read_block_ms`)."""


def connect(url: str) -> Redis:
    """A client for `url`. Connections are made lazily; errors surface on first use. The URL's
    own `socket_timeout` and `socket_connect_timeout` win over `SOCKET_TIMEOUT_S`."""
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        health_check_interval=30,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
    )


@commands("XGROUP|CREATE")
async def ensure_groups(redis: Redis, keys: Keys) -> None:
    """Create the consumer group on every work stream (idempotent, creates the streams). A
    key of another type does not keep the others' groups from being made: `WrongType`
    naming it is raised after them."""
    wrong: WrongType | ResponseError | None = None
    for stream in keys.streams():
        try:
            await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if wrong_type(exc):
                wrong = wrong or await named(redis, "XGROUP|CREATE", [stream], exc)
            elif "BUSYGROUP" not in str(exc):
                raise
    if wrong is not None:
        raise wrong


@commands("XADD")
async def publish(redis: Redis, keys: Keys, priority: Priority, entry: WorkEntry) -> str:
    """XADD one entry to its priority stream; returns the entry id."""
    entry_id = await redis.xadd(keys.stream(priority), encode(entry))  # type: ignore[arg-type]
    return as_text(entry_id)


@commands("XADD")
async def publish_many(
    redis: Redis, keys: Keys, entries: Sequence[tuple[Priority, WorkEntry]]
) -> list[str]:
    """XADD many entries in one pipeline (no MULTI: each XADD stands alone); their ids in
    order. An error may leave some added: the outbox's reconciler covers that case."""
    if not entries:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for priority, entry in entries:
            pipe.xadd(keys.stream(priority), encode(entry))  # type: ignore[arg-type]
        ids = await pipe.execute()
    return [as_text(i) for i in ids]


@commands("SET XREADGROUP")
async def read(
    redis: Redis,
    keys: Keys,
    consumer: str,
    *,
    count: int,
    block_ms: int,
    order: tuple[Priority, ...] = PRIORITY_ORDER,
    alive_ttl_ms: int | None = None,
) -> list[Delivery]:
    """Read up to `count` new entries, walking the streams in `order` (see `read_order`).

    With `alive_ttl_ms`, the consumer's liveness key is set (that TTL) in the first read's
    round trip: a consumer holding an entry always has its key, even right after Redis lost
    it (FLUSHDB, a restart empty), when a sweeper would otherwise take the consumer for dead.

    Non-blocking reads walk the priorities in order; only when all are empty does one blocking
    read wait on every stream (COUNT 1 each). That read can return one entry per stream, more
    than `count` when `count` is below the number of streams (Valkey and Redis 7.2+ answer a
    wake-up with every stream that has entries by then): those beyond `count` are delivered
    to `consumer` all the same, and the caller must put them back (`move`) or run them.
    A stream whose read Redis denies after others delivered entries ends the walk with them,
    as does a key of another type (`WrongType` when nothing was delivered before it). Only the
    streams of `order` are read.
    """
    out: list[Delivery] = []
    alive = None if alive_ttl_ms is None else (keys.alive(consumer), alive_ttl_ms)
    for stream in keys.streams(order):
        if len(out) >= count:
            return out
        try:
            out += await _xreadgroup(redis, {stream: ">"}, consumer, count - len(out), None, alive)
        except ResponseError as exc:
            if out and (denied(exc) or wrong_type(exc)):
                return out  # delivered, so they must run; a read starting here meets it again
            if wrong_type(exc):
                raise await named(redis, "XREADGROUP", [stream], exc) from exc
            raise
        alive = None
    if out:
        return out
    every = keys.streams(order)
    try:
        return await _xreadgroup(redis, dict.fromkeys(every, ">"), consumer, 1, block_ms)
    except ResponseError as exc:
        if wrong_type(exc):  # the type changed since the walk above
            raise await named(redis, "XREADGROUP", every, exc) from exc
        raise


async def _xreadgroup(
    redis: Redis,
    streams: dict[str, str],
    consumer: str,
    count: int,
    block_ms: int | None,
    alive: tuple[str, int] | None = None,
) -> list[Delivery]:
    reply: Any
    if alive is None:
        reply = await redis.xreadgroup(GROUP, consumer, streams, count=count, block=block_ms)  # type: ignore[arg-type]
    else:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(alive[0], b"1", px=alive[1])
            pipe.xreadgroup(GROUP, consumer, streams, count=count, block=block_ms)  # type: ignore[arg-type]
            _, reply = await pipe.execute()
    out: list[Delivery] = []
    for stream, entries in reply or []:
        for entry_id, fields in entries:
            out.append(Delivery(as_text(stream), as_text(entry_id), fields or {}))
    return out


@commands("MULTI XACK XDEL EXEC")
async def ack(redis: Redis, stream: str, entry_id: str) -> None:
    """XACK and XDEL together: the entry leaves the pending list and the stream."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xack(stream, GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        await pipe.execute()


@commands("MULTI XACK XDEL EXEC")
async def ack_many(redis: Redis, deliveries: list[Delivery]) -> None:
    """`ack` for many entries in one MULTI: one XACK and one XDEL per stream."""
    by_stream: dict[str, list[str]] = {}
    for d in deliveries:
        by_stream.setdefault(d.stream, []).append(d.entry_id)
    if not by_stream:
        return
    async with redis.pipeline(transaction=True) as pipe:
        for stream, ids in by_stream.items():
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
        await pipe.execute()


@commands("XCLAIM")
async def touch(redis: Redis, consumer: str, deliveries: list[Delivery]) -> list[Delivery]:
    """Reset the idle time of our own pending entries (XCLAIM to self, JUSTID, min-idle 0),
    which does not raise their delivery count. Returns those of `deliveries` still pending
    (an acknowledged or deleted entry is not claimed back)."""
    by_stream: dict[str, list[str]] = {}
    for d in deliveries:
        by_stream.setdefault(d.stream, []).append(d.entry_id)
    if not by_stream:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for stream, ids in by_stream.items():
            pipe.xclaim(stream, GROUP, consumer, 0, ids, justid=True)  # type: ignore[arg-type]
        replies: list[Any] = await pipe.execute()
    pending = {
        (stream, as_text(entry_id))
        for stream, ids in zip(by_stream, replies, strict=True)
        for entry_id in ids
    }
    return [d for d in deliveries if (d.stream, d.entry_id) in pending]


@commands("SET")
async def mark_alive(redis: Redis, keys: Keys, consumer: str, ttl_ms: int) -> None:
    """Set this consumer's liveness key with a TTL; it vanishes when the process stops."""
    await redis.set(keys.alive(consumer), b"1", px=ttl_ms)


_MOVE = """
if redis.acl_check_cmd then
  for _, call in ipairs({{'XACK', KEYS[1], ARGV[1], ARGV[2]},
                         {'XADD', KEYS[2], '*', unpack(ARGV, 3)},
                         {'XDEL', KEYS[1], ARGV[2]}}) do
    local known, allowed = pcall(redis.acl_check_cmd, unpack(call))
    if not known then
      return redis.error_reply("ERR unknown command '" .. call[1] .. "' (called from a script)")
    elseif not allowed then
      return redis.error_reply("NOPERM this user has no permissions to run the '" ..
        string.lower(call[1]) .. "' command on " .. call[2])
    end
  end
end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return false
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XDEL', KEYS[1], ARGV[2])
return id
"""


async def move(
    redis: Redis, delivery: Delivery, target: str, fields: Mapping[Any, str | bytes]
) -> str | None:
    """Replace the pending entry `delivery` by a new entry of `fields` on stream `target`, in
    one script: XACK it, and only if that acknowledged it (it was still pending), XADD the new
    entry and XDEL the old one. Returns the new entry's id, or None when the entry was no
    longer pending: another mover (a second sweeper, the entry's executor) took it first, so
    of movers that race, exactly one moves it. Both keys share the namespace's hash tag.

    Before its first write the script asks the server whether this user may run each of its
    three commands (`redis.acl_check_cmd`, Redis 7+): a script stops at a denied command but
    keeps what it wrote before, and an XACK kept without its XADD would lose the entry. So a
    denied or unknown command leaves the entry pending, as a `CommandDenied`."""
    args: list[str | bytes] = [GROUP, delivery.entry_id]
    for name, value in fields.items():
        args += [name, value]
    script: Any = redis.register_script(_MOVE)
    try:
        moved = await script(keys=[delivery.stream, target], args=args)
    except ResponseError as exc:
        if denied(exc):
            raise refused(exc, "EVALSHA", (delivery.stream, target)) from exc
        raise
    return None if moved is None else as_text(moved)


async def dead_letter(
    redis: Redis, keys: Keys, delivery: Delivery, reason: str, detail: str
) -> str | None:
    """Move a pending entry to the dead-letter stream with a reason (`move`): the letter's id,
    or None when the entry had already been moved or acknowledged."""
    fields = dead_fields(
        delivery.fields,
        reason=reason,
        detail=detail,
        stream=delivery.stream,
        entry_id=delivery.entry_id,
    )
    return await move(redis, delivery, keys.dead, fields)


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
