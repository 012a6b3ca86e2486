"""The Redis commands each long-running role sends, and the start-up check that this server
lets the role's user run every one of them, on the keys and channel the role uses.

The check queues each command, with the role's own keys, in a transaction that it then
discards (MULTI ... DISCARD): the server checks a queued command's ACL permissions and whether
it knows the command at once, but runs nothing, so the check writes nothing. Commands that Lua
scripts run are checked the same way, with the keys their scripts get. Not checked: EXEC (it
would run the transaction), which the executor and sweeper need as well.

A role whose user lacks a command fails at start (`taskstream.cli.roles`) rather than later,
at the first poison entry or the first lease, when the command is first needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

from taskstream.core.denials import denied, refused
from taskstream.core.protocol import GROUP, Keys
from taskstream.core.streams import Redis

Call = tuple[str, ...]
"""A command and its arguments, as the role sends it."""
PROBE = "start-check"
"""The consumer, upstream and member names the checked calls use."""
SHA = "0" * 40
"""EVALSHA's permission does not depend on the script: any SHA1 does."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One command the server will not run for this user: its name and the reply."""

    command: str
    reply: str


def _streams(keys: Keys) -> list[Call]:
    """Every role makes the consumer group (XGROUP CREATE) on each work stream at start, and
    its client sends PING on a connection idle past the health-check interval (30 s) before
    the command it was taken for: a PING refused fails that command."""
    groups = [("XGROUP", "CREATE", s, GROUP, "0", "MKSTREAM") for s in keys.streams()]
    return [("PING",), *groups]


def _moves(keys: Keys) -> list[Call]:
    """The move script (`streams.move`): dead letters, and entries published again."""
    stream = keys.streams()[0]
    return [
        ("EVALSHA", SHA, "2", stream, keys.dead),
        ("SCRIPT", "LOAD", "return 1"),
        ("XACK", stream, GROUP, "0-1"),
        ("XADD", keys.dead, "*", "v", "1"),
        ("XADD", stream, "*", "v", "1"),
        ("XDEL", stream, "0-1"),
        ("XPENDING", stream, GROUP, "-", "+", "1", PROBE),
        ("XRANGE", stream, "-", "+", "COUNT", "1"),
        ("PUBLISH", keys.control, PROBE),
    ]


def _guards(keys: Keys) -> list[Call]:
    """The limiter and breaker scripts (`ratelimit.lua`) and calls, on one upstream's keys."""
    limit, breaker = keys.limiter(PROBE), keys.breaker(PROBE)
    zsets = ["ZADD", "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZREMRANGEBYSCORE", "ZSCORE"]
    args: dict[str, tuple[str, ...]] = {"ZADD": ("0", PROBE), "ZCOUNT": ("0", "1")}
    args |= {"ZRANGE": ("0", "1")}
    args |= {"ZRANGEBYSCORE": ("0", "1"), "ZREMRANGEBYSCORE": ("0", "1"), "ZSCORE": (PROBE,)}
    return [
        ("EVALSHA", SHA, "1", limit),
        ("EVALSHA", SHA, "1", breaker),
        ("TIME",),
        ("ZREM", limit, PROBE),
        ("PEXPIRE", limit, "1"),
        ("HGETALL", breaker),
        ("HSET", breaker, "status", "closed"),
        ("PEXPIRE", breaker, "1"),
        *((z, limit, *args.get(z, ())) for z in zsets),
    ]


def executor_calls(keys: Keys) -> list[Call]:
    """Read, claim, heartbeat, ack, dead-letter, release notes, limiter and breaker."""
    stream, alive = keys.streams()[0], keys.alive(PROBE)
    reads = ["STREAMS", *keys.streams(), *(">" for _ in keys.streams())]
    return [
        *_streams(keys),
        ("SET", alive, "1", "PX", "1000"),
        ("DEL", alive),
        ("XREADGROUP", "GROUP", GROUP, PROBE, "COUNT", "1", *reads),
        ("XCLAIM", stream, GROUP, PROBE, "0", "0-1", "JUSTID"),
        ("SET", keys.released(PROBE, 1), PROBE, "EX", "60"),
        *_moves(keys),
        *_guards(keys),
    ]


def sweeper_calls(keys: Keys) -> list[Call]:
    """Pending lists, liveness, moves, consumer clean-up, trimming, the reconciler, the
    release notes of stopped executors."""
    stream = keys.streams()[0]
    return [
        *_streams(keys),
        *_moves(keys),
        ("EXISTS", keys.alive(PROBE)),
        ("XINFO", "CONSUMERS", stream, GROUP),
        ("XINFO", "GROUPS", stream),
        ("EVALSHA", SHA, "2", stream, keys.alive(PROBE)),
        ("XGROUP", "DELCONSUMER", stream, GROUP, PROBE),
        ("XTRIM", stream, "MINID", "0-1"),
        ("GET", keys.released(PROBE, 1)),
        ("DEL", keys.released(PROBE, 1)),
    ]


def scheduler_calls(keys: Keys) -> list[Call]:
    """The leader lease script, publishing, hints and their subscription, and the breakers
    that hold back ticks."""
    lease, epoch = keys.leader, keys.leader_epoch
    return [
        *_streams(keys),
        ("EVALSHA", SHA, "2", lease, epoch),
        ("EVALSHA", SHA, "1", lease),
        ("SCRIPT", "LOAD", "return 1"),
        ("GET", lease),
        ("INCR", epoch),
        ("SET", epoch, "1"),
        ("SET", lease, PROBE, "PX", "1000"),
        ("PEXPIRE", lease, "1000"),
        ("PTTL", lease),
        ("DEL", lease),
        *(("XADD", s, "*", "v", "1") for s in keys.streams()),
        ("PUBLISH", keys.control, PROBE),
        ("SUBSCRIBE", keys.control),
        ("TIME",),
        ("HGETALL", keys.breaker(PROBE)),
    ]


async def refusals(redis: Redis, calls: Sequence[Call]) -> list[Refusal]:
    """The calls of `calls` this server refuses to this user, queued in a transaction that is
    discarded (nothing runs). Any other error (an outage) raises, and the connection, left
    inside the transaction, is closed, never reused: a command sent on it again after a
    reconnection would run. A refused MULTI, or a refused SELECT of the URL's database when
    the connection is made, is the one refusal found: nothing can be checked without it. A
    refused DISCARD leaves the transaction open: that connection is closed too."""
    pool = redis.connection_pool
    try:
        conn: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
    except ResponseError as exc:  # the SELECT of the URL's database, sent on each connect
        if not denied(exc):
            raise
        select = refused(exc, "SELECT")
        return [Refusal(select.command, select.reply)]
    found: list[Refusal] = []
    clean = False
    try:
        if (multi := await _queue(conn, ("MULTI",))) is not None:
            return [multi]
        for call in calls:
            if (refusal := await _queue(conn, call)) is not None:
                found.append(refusal)
        if (discard := await _queue(conn, ("DISCARD",))) is not None:
            return [*found, discard]  # still inside the transaction: closed, not reused
        clean = True
    finally:
        if not clean:
            await conn.disconnect()
        await pool.release(conn)
    return list(dict.fromkeys(found))


async def _queue(conn: AbstractConnection, call: Call) -> Refusal | None:
    """Send one command on `conn` and read its reply: the refusal, if refused. Other errors
    at queueing (a wrong argument count) say nothing of permissions and are ignored. No
    health check: its PING would be queued too, and its reply taken for a broken link."""
    try:
        await conn.send_command(*call, check_health=False)
        await conn.read_response()
    except ResponseError as exc:
        if denied(exc):
            found = refused(exc, _name(call), tuple(a for a in call if "{" in a))
            return Refusal(found.command, found.reply)
    return None


def _name(call: Call) -> str:
    """`XADD`; `XGROUP|CREATE` for a command with subcommands, as ACL rules name it."""
    if call[0] in ("XGROUP", "XINFO", "SCRIPT"):
        return f"{call[0]}|{call[1]}"
    return call[0]
