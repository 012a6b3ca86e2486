"""The scheduler lease on a real Redis: one holder, growing fencing tokens, release."""

from __future__ import annotations

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.scheduler.leader import LeaderLease
from tests.integration.harness import until


async def test_one_holder_and_tokens_only_grow(redis: streams.Redis, keys: Keys) -> None:
    a = LeaderLease(redis, keys, "a", lease_ms=10_000)
    b = LeaderLease(redis, keys, "b", lease_ms=10_000)
    first = await a.hold()
    assert first is not None
    assert await b.hold() is None
    assert await a.hold() == first  # renewal keeps the token
    assert await a.holder() == ("a", first)
    await a.release()
    second = await b.hold()
    assert second is not None and second > first
    assert await a.hold() is None


async def test_an_expired_lease_passes_to_the_standby(redis: streams.Redis, keys: Keys) -> None:
    a = LeaderLease(redis, keys, "a", lease_ms=10_000)
    b = LeaderLease(redis, keys, "b", lease_ms=10_000)
    first = await a.hold()
    await redis.pexpire(keys.leader, 1)  # what time does to a leader that stopped renewing

    async def expired() -> bool:
        return not await redis.exists(keys.leader)

    await until(expired)
    taken = await b.hold()
    assert first is not None and taken is not None and taken > first
    await a.release()  # a stale holder cannot release the new lease
    assert await b.holder() == ("b", taken)


async def test_a_standby_learns_when_the_lease_lapses(redis: streams.Redis, keys: Keys) -> None:
    a = LeaderLease(redis, keys, "a", lease_ms=10_000)
    b = LeaderLease(redis, keys, "b", lease_ms=10_000)
    await a.hold()
    assert a.lapses_in_ms is None  # the holder waits for nobody
    await redis.pexpire(keys.leader, 2_500)  # the leader last renewed 7.5 s ago
    assert await b.hold() is None
    assert b.lapses_in_ms is not None and 2_000 < b.lapses_in_ms <= 2_500
    await redis.persist(keys.leader)  # a key without a time to live: wait a whole lease
    assert await b.hold() is None and b.lapses_in_ms == 10_000
