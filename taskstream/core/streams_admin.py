"""Redis Streams operations of the sweeper and reconciler: pending lists, liveness, redelivery,
consumer clean-up, MINID trimming and backlog scans."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Final

from redis.exceptions import ResponseError

from taskstream.core.denials import commands, denied
from taskstream.core.protocol import GROUP, Keys, Priority, WorkEntry, encode
from taskstream.core.redis_errors import DRIVER_ERRORS
from taskstream.core.streams import Delivery, Redis, as_text, move


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of a consumer group's pending list."""

    stream: str
    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int


def shown_name(name: bytes | str) -> str:
    """A consumer name as text: bytes that are not UTF-8 (a name some other program gave a
    consumer of the group) as `\\x..` escapes, so one such name cannot fail a whole read."""
    return name.decode(errors="backslashreplace") if isinstance(name, bytes) else name


def missing(exc: ResponseError) -> bool:
    """The reply to a read of a stream's group says there is nothing to read (no such stream
    or group, a key of another type), as opposed to a denial or an outage (a BUSY or a
    MASTERDOWN server answers nothing about the stream: its caller waits it out)."""
    return not (denied(exc) or isinstance(exc, DRIVER_ERRORS))


@commands("XPENDING")
async def pending(
    redis: Redis,
    stream: str,
    *,
    count: int,
    consumer: str | None = None,
    after: str | None = None,
) -> list[Pending]:
    """The oldest `count` pending entries of the group on `stream` (those after the entry id
    `after`, when given), or of one `consumer` in it (none if it is missing). Reading them
    changes no delivery count or idle time. An outage (`DRIVER_ERRORS`) raises: an empty
    list would tell the executor's recheck and the sweeper that nothing is pending."""
    start = "-" if after is None else f"({after}"
    try:
        rows: list[dict[str, Any]] = await redis.xpending_range(
            stream, GROUP, start, "+", count, consumername=consumer
        )
    except ResponseError as exc:
        if not missing(exc):
            raise
        return []  # no such stream or group: nothing pending
    return [
        Pending(
            stream,
            as_text(r["message_id"]),
            shown_name(r["consumer"]),
            int(r["time_since_delivered"]),
            int(r["times_delivered"]),
        )
        for r in rows
    ]


@commands("XRANGE")
async def fetch(redis: Redis, stream: str, entry_ids: list[str]) -> dict[str, Delivery]:
    """The fields of the given entries; entries that no longer exist are absent."""
    async with redis.pipeline(transaction=False) as pipe:
        for entry_id in entry_ids:
            pipe.xrange(stream, entry_id, entry_id, count=1)
        replies: list[Any] = await pipe.execute()
    out: dict[str, Delivery] = {}
    for entry_id, reply in zip(entry_ids, replies, strict=True):
        if reply:
            out[entry_id] = Delivery(stream, entry_id, reply[0][1] or {})
    return out


async def read_own(redis: Redis, keys: Keys, consumer: str, *, count: int) -> list[Delivery]:
    """This consumer's own pending entries (delivered to it and not yet acknowledged), at most
    `count` per stream, oldest first; entries deleted meanwhile are left out.

    Read with XPENDING and XRANGE (`pending`, `fetch`), which leave delivery counts and idle
    times as they are: XREADGROUP from id 0 would count every entry, those of live runs too,
    as delivered once more, and push them towards the sweeper's poison limit at each Redis
    failure."""
    out: list[Delivery] = []
    for stream in keys.streams():
        ids = [p.entry_id for p in await pending(redis, stream, count=count, consumer=consumer)]
        found = await fetch(redis, stream, ids) if ids else {}
        out += [found[i] for i in ids if i in found and found[i].fields]
    return out


@commands("EXISTS")
async def alive(redis: Redis, keys: Keys, consumers: set[str]) -> dict[str, bool]:
    """Which consumers still have their liveness key."""
    names = sorted(consumers)
    found = await _exist(redis, [keys.alive(name) for name in names])
    return dict(zip(names, found, strict=True))


async def _exist(redis: Redis, keys: list[str] | list[bytes]) -> list[bool]:
    """Whether each of `keys` is there, in one round trip."""
    if not keys:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.exists(key)
        found: list[int] = await pipe.execute()
    return [bool(n) for n in found]


@commands("XINFO|GROUPS XINFO|CONSUMERS XLEN")
async def queue_stats(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Per-stream length, group pending/lag and consumers; the dead stream's length."""
    streams: dict[str, Any] = {}
    for priority in Priority:
        stream = keys.stream(priority)
        groups = await _groups(redis, stream)
        group = groups.get(GROUP, {})
        consumers = await _consumers(redis, stream) if group else []
        streams[priority.value] = {
            "key": stream,
            "length": int(await redis.xlen(stream)),
            "pending": int(group.get("pending", 0)),
            "lag": group.get("lag"),
            "consumers": consumers,
        }
    return {"streams": streams, "dead": int(await redis.xlen(keys.dead))}


async def _groups(redis: Redis, stream: str) -> dict[str, dict[str, Any]]:
    try:
        groups: list[dict[str, Any]] = await redis.xinfo_groups(stream)
    except ResponseError as exc:
        if not missing(exc):
            raise
        return {}
    return {as_text(g["name"]): g for g in groups}


async def _consumers(redis: Redis, stream: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = await redis.xinfo_consumers(stream, GROUP)
    return [
        {"name": shown_name(r["name"]), "pending": int(r["pending"]), "idle_ms": int(r["idle"])}
        for r in rows
    ]


async def queue_view(redis: Redis, keys: Keys) -> dict[str, Any]:
    """`queue_stats`, each consumer marked `alive` (its liveness key is there): a
    consumer that died stays in the group until the sweeper prunes it, and is no reader."""
    stats = await queue_stats(redis, keys)
    consumers = [c for st in stats["streams"].values() for c in st["consumers"]]
    found = await alive(redis, keys, {c["name"] for c in consumers})
    for consumer in consumers:
        consumer["alive"] = found[consumer["name"]]
    return stats


async def redeliver(redis: Redis, delivery: Delivery, entry: WorkEntry) -> str | None:
    """Publish `entry` (the delivery's, decoded, with its delivery count carried) as a new
    entry of the same stream in place of the pending one (`streams.move`): the new id, or
    None when the old entry had already been moved or acknowledged."""
    return await move(redis, delivery, delivery.stream, encode(entry))


_PRUNE_ONE: Final = """
for _, row in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #row, 2 do f[row[i]] = row[i + 1] end
  if f['name'] == ARGV[2] then
    if tonumber(f['pending']) == 0 and tonumber(f['idle']) > tonumber(ARGV[3])
        and redis.call('EXISTS', KEYS[2]) == 0 then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
"""
"""Delete consumer ARGV[2] of group ARGV[1] on stream KEYS[1] only if, at this moment, its
pending list is empty, it has been idle more than ARGV[3] ms and its liveness key KEYS[2] is
gone. Atomic, because DELCONSUMER drops the consumer's pending entries: one it read after a
separate check would be lost from the pending list."""


@commands("XINFO|CONSUMERS EVALSHA XGROUP|DELCONSUMER")
async def prune_consumers(redis: Redis, keys: Keys, stream: str, *, idle_ms: int) -> list[str]:
    """Delete consumers with empty pending lists, no liveness key and idle past `idle_ms`;
    each is checked again and deleted in one script, so a consumer that reads meanwhile
    stays. Names are handled as the bytes Redis holds, which need not be UTF-8; the deleted
    ones are returned as `shown_name`s."""
    try:
        rows: list[dict[str, Any]] = await redis.xinfo_consumers(stream, GROUP)
    except ResponseError as exc:
        if not missing(exc):
            raise
        return []
    idle = sorted(
        _raw(r["name"]) for r in rows if int(r["pending"]) == 0 and int(r["idle"]) > idle_ms
    )
    gone: list[str] = []
    prune_one = redis.register_script(_PRUNE_ONE)
    for name, live in zip(idle, await _exist(redis, [keys.alive_of(n) for n in idle]), strict=True):
        if not live and await prune_one(
            keys=[stream, keys.alive_of(name)], args=[GROUP, name, idle_ms]
        ):
            gone.append(shown_name(name))
    return gone


def _raw(name: bytes | str) -> bytes:
    return name if isinstance(name, bytes) else name.encode()


@commands("XINFO|GROUPS XPENDING XTRIM")
async def trim(redis: Redis, stream: str) -> int:
    """XTRIM MINID below both the oldest pending entry and the group's last delivered id, so
    only entries already acknowledged (and deleted) can go.

    The last delivered id is read first: an entry delivered after that read has a higher id,
    and one delivered before it and still pending is at or above the pending list's oldest,
    read after. (Read the other way round, entries delivered between the reads to a group
    with an empty pending list would lie below the floor.)"""
    try:
        groups: list[dict[str, Any]] = await redis.xinfo_groups(stream)
        summary: dict[str, Any] = await redis.xpending(stream, GROUP)
    except ResponseError as exc:
        if not missing(exc):
            raise
        return 0
    group = next((g for g in groups if as_text(g["name"]) == GROUP), None)
    if group is None:
        return 0
    bounds = [as_text(group["last-delivered-id"])]
    if summary.get("min"):
        bounds.append(as_text(summary["min"]))
    floor = min(bounds, key=lambda i: tuple(int(p) for p in i.split("-")))
    trimmed: int = await redis.xtrim(stream, minid=floor, approximate=False)
    return trimmed


@commands("XRANGE")
async def instance_ids(redis: Redis, keys: Keys, *, page: int = 1000) -> set[str]:
    """Instance ids of every entry still on a work stream (pending or not yet delivered). An
    id that is not UTF-8 (a poison entry from another writer) names no instance: skipped."""
    found: set[str] = set()
    for stream in keys.streams():
        start = "-"
        while True:
            rows: Any = await redis.xrange(stream, start, "+", count=page)
            for _, fields in rows:
                value = (fields or {}).get(b"instance_id")
                with contextlib.suppress(UnicodeDecodeError):
                    if value is not None:
                        found.add(as_text(value))
            if len(rows) < page:
                break
            start = "(" + as_text(rows[-1][0])
    return found
