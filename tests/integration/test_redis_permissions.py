"""The Redis permissions of the scheduler, and the start-up check of every role's: a denied
lease script or hint subscription pauses the scheduler (it neither ends nor spins), and the
check names each command a user lacks without writing anything. Each test makes an ACL user
of its own on the real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from structlog.testing import capture_logs

from taskstream.core import redis_needs, streams
from taskstream.core.errors import CommandDenied, QueueUnavailable
from taskstream.core.notify import Wakeups
from taskstream.core.outbox import Outbox
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import Harness, until
from tests.support.acl import acl, acl_user, as_user, namespace_rules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROLES = [redis_needs.executor_calls, redis_needs.sweeper_calls, redis_needs.scheduler_calls]


async def test_a_denied_lease_pauses_the_scheduler_until_it_is_allowed(
    outage: Harness, redis_url: str
) -> None:
    h = outage
    rules = [*namespace_rules(h.keys), "-evalsha"]
    async with acl_user(h.redis, redis_url, rules) as (user, client):
        lease = LeaderLease(client, h.keys, "s1", lease_ms=3000)
        scheduler = Scheduler(
            h.store, Outbox(h.store, client, h.keys), h.clock, SchedulerConfig(), leader=lease
        )
        stop = asyncio.Event()
        with capture_logs() as logs:
            running = asyncio.create_task(scheduler.run(stop))
            try:

                async def told() -> bool:
                    return any(e["event"] == "redis.denied" for e in logs) or running.done()

                await until(told)
                assert not running.done(), running.exception()
                denied = next(e for e in logs if e["event"] == "redis.denied")
                assert (denied["command"], denied["log_level"]) == ("EVALSHA", "error")
                await acl(h.redis, "SETUSER", user, "+evalsha")

                async def leading() -> bool:
                    return await lease.holder() is not None or running.done()

                await until(leading)
                assert not running.done(), running.exception()
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 20)


async def test_a_denied_subscription_waits_as_if_no_hint_came(
    outage: Harness, redis_url: str
) -> None:
    """Without the control channel the scheduler's sleep must still be a sleep: a wait that
    failed at once would make it pass after pass with no pause."""
    h = outage
    rules = [f"~{h.keys.base}:*", "resetchannels", "+@all"]
    async with acl_user(h.redis, redis_url, rules) as (_user, client):
        wakeups = Wakeups(client, h.keys)
        with capture_logs() as logs:
            assert await wakeups.wait(0.05) is False
            assert await wakeups.wait(0.05) is False
        await wakeups.close()
    [denied] = [e for e in logs if e["event"] == "redis.denied"]  # once, not at every wait
    assert denied["command"] == "SUBSCRIBE" and h.keys.control in denied["reply"]


async def test_the_start_check_passes_for_a_user_of_the_namespace_and_writes_nothing(
    outage: Harness, redis_url: str
) -> None:
    h = outage
    before = await _namespace_keys(h)
    async with acl_user(h.redis, redis_url, namespace_rules(h.keys)) as (_user, client):
        for calls in ROLES:
            assert await redis_needs.refusals(client, calls(h.keys)) == []
        assert await client.ping()
    assert await _namespace_keys(h) == before


@pytest.mark.parametrize(
    ("taken", "named"),
    [
        (["-xadd"], {"XADD"}),
        (["-script|load"], {"SCRIPT|LOAD"}),
        (["-xgroup|create"], {"XGROUP|CREATE"}),
    ],
)
async def test_the_start_check_names_each_denied_command(
    outage: Harness, redis_url: str, taken: list[str], named: set[str]
) -> None:
    h = outage
    before = await _namespace_keys(h)
    async with acl_user(h.redis, redis_url, [*namespace_rules(h.keys), *taken]) as (_u, client):
        for calls in ROLES:
            refused = await redis_needs.refusals(client, calls(h.keys))
            assert {r.command for r in refused} == named
            assert all(r.reply.startswith("NOPERM ") for r in refused)
    assert await _namespace_keys(h) == before


async def test_the_start_check_names_the_keys_and_channel_a_role_lacks(
    outage: Harness, redis_url: str
) -> None:
    h = outage
    rules = [f"~{h.keys.base}:stream:*", "resetchannels", "+@all"]
    async with acl_user(h.redis, redis_url, rules) as (_user, client):
        refused = await redis_needs.refusals(client, redis_needs.sweeper_calls(h.keys))
    replies = " ".join(r.reply for r in refused)
    assert h.keys.dead in replies and h.keys.control in replies
    assert h.keys.alive(redis_needs.PROBE) in replies


async def test_a_denied_limiter_is_waited_out_by_its_callers(
    outage: Harness, redis_url: str
) -> None:
    """Admission defers a run, and the scheduler holds nothing back, while the limiter or
    breaker cannot be used (`QueueUnavailable`): a denial is one, naming the command."""
    h = outage
    async with acl_user(h.redis, redis_url, [*namespace_rules(h.keys), "-evalsha"]) as (_, c):
        with pytest.raises(QueueUnavailable) as caught:
            await RedisLimiter(c, h.keys).acquire("api", 5, 1000)
    assert isinstance(caught.value, CommandDenied) and caught.value.command == "EVALSHA"


async def test_a_key_denial_of_the_limiter_and_breaker_reads_names_their_commands(
    outage: Harness, redis_url: str
) -> None:
    """A reply that denies a key names no command: the call's own (ZREM, HGETALL) is named,
    not the scripts' EVALSHA, which the user may run."""
    h = outage
    limiter, breaker = h.keys.limiter("api"), h.keys.breaker("api")
    others = [f"~{h.keys.base}:[^lb]*", f"%R~{limiter}", f"%W~{breaker}"]
    async with acl_user(h.redis, redis_url, [*others, "+@all"]) as (_, client):
        with pytest.raises(CommandDenied) as zrem:
            await RedisLimiter(client, h.keys).release("api", "hit-1")
        with pytest.raises(CommandDenied) as hgetall:
            await RedisBreakers(client, h.keys).state("api")
        with pytest.raises(CommandDenied) as pipelined:
            await RedisBreakers(client, h.keys).states(["api"])
    assert [e.value.command for e in (zrem, hgetall, pipelined)] == ["ZREM", "HGETALL", "HGETALL"]


async def test_the_executor_user_of_the_docs_passes_the_start_check(
    outage: Harness, redis_url: str
) -> None:
    """docs/operations.md's `ACL SETUSER` line for executors, for this test's namespace."""
    h = outage
    [line] = [x for x in DOCS.read_text().splitlines() if x.startswith("ACL SETUSER ts-executor")]
    rules = line.replace("ts:{prod}", h.keys.base).split()[5:]  # after "on >PASSWORD"
    assert rules[0] == "resetkeys" and "+xadd" in rules
    async with acl_user(h.redis, redis_url, rules) as (_user, client):
        assert await redis_needs.refusals(client, redis_needs.executor_calls(h.keys)) == []
        without = [r for r in rules if r != "+xadd"]
        async with acl_user(h.redis, redis_url, without) as (_other, lacking):
            refused = await redis_needs.refusals(lacking, redis_needs.executor_calls(h.keys))
    assert [r.command for r in refused] == ["XADD"]


async def _namespace_keys(h: Harness) -> list[Any]:
    return sorted([k async for k in h.redis.scan_iter(match=f"{h.keys.base}:*")])


async def test_the_start_check_names_the_health_check_ping(outage: Harness, redis_url: str) -> None:
    """The client sends PING itself on a connection idle past its health-check interval: a
    user without it passes every command the roles send, then fails one every such time."""
    h = outage
    async with acl_user(h.redis, redis_url, [*namespace_rules(h.keys), "-ping"]) as (_u, client):
        for calls in ROLES:
            refused = await redis_needs.refusals(client, calls(h.keys))
            assert [r.command for r in refused] == ["PING"]


async def test_the_executor_user_of_the_docs_survives_the_clients_health_check(
    outage: Harness, redis_url: str
) -> None:
    h = outage
    [line] = [x for x in DOCS.read_text().splitlines() if x.startswith("ACL SETUSER ts-executor")]
    rules = line.replace("ts:{prod}", h.keys.base).split()[5:]
    async with acl_user(h.redis, redis_url, rules) as (_user, client):
        await streams.mark_alive(client, h.keys, "c1", 1000)
        pool: Any = client.connection_pool
        conn = await pool.get_connection()
        conn.next_health_check = 0  # idle past the interval: its next command is a PING first
        await pool.release(conn)
        await streams.mark_alive(client, h.keys, "c1", 1000)


async def test_the_start_check_names_a_denied_select_of_the_urls_database(
    outage: Harness, redis_url: str
) -> None:
    """A URL naming a database other than 0 makes the client SELECT it on every connection
    it opens: refused, the check names it instead of failing with the bare reply."""
    h = outage
    async with acl_user(h.redis, redis_url, [*namespace_rules(h.keys), "-select"]) as (user, _):
        client = streams.connect(as_user(_database(redis_url, 1), user))
        try:
            for calls in ROLES:
                refused = await redis_needs.refusals(client, calls(h.keys))
                assert [r.command for r in refused] == ["SELECT"]
                assert refused[0].reply.startswith("NOPERM ")
        finally:
            await client.aclose()


def _database(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


async def test_a_denied_discard_is_named_and_leaves_no_connection_in_the_transaction(
    outage: Harness, redis_url: str
) -> None:
    """DISCARD refused, the check's connection is still inside its MULTI: back in the pool,
    every command sent on it later would be queued, never run."""
    h = outage
    key = h.keys.alive("c1")
    async with acl_user(h.redis, redis_url, [*namespace_rules(h.keys), "-discard"]) as (_u, c):
        for calls in ROLES:
            refused = await redis_needs.refusals(c, calls(h.keys))
            assert [r.command for r in refused] == ["DISCARD"]
        assert await c.set(key, b"1", px=60_000)
        assert await c.get(key) == b"1"
