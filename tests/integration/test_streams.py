"""The stream shell against a real Redis: groups, priority order, ack+del, dead letters."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.protocol import GROUP, Keys, Priority, WorkEntry, decode, encode
from tests.integration.harness import until
from tests.support.keyspace import drop_keys


def entry(n: int) -> WorkEntry:
    return WorkEntry(
        instance_id=f"i_{n}",
        task_id="t",
        agent="echo",
        attempt=0,
        scheduled_for_ms=n,
        emitted_at_ms=n,
    )


async def test_groups_are_idempotent_and_priority_is_respected(
    redis: streams.Redis, keys: Keys
) -> None:
    await streams.ensure_groups(redis, keys)
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.LOW, entry(1))
    await streams.publish(redis, keys, Priority.HIGH, entry(2))
    await streams.publish(redis, keys, Priority.DEFAULT, entry(3))
    got = await streams.read(redis, keys, "c1", count=2, block_ms=10)
    assert [decode(d.fields).instance_id for d in got] == ["i_2", "i_3"]
    rest = await streams.read(redis, keys, "c1", count=5, block_ms=10)
    assert [decode(d.fields).instance_id for d in rest] == ["i_1"]


async def test_ack_removes_from_pending_and_stream(redis: streams.Redis, keys: Keys) -> None:
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.DEFAULT, entry(1))
    [d] = await streams.read(redis, keys, "c1", count=1, block_ms=10)
    assert (await redis.xpending(d.stream, GROUP))["pending"] == 1
    await streams.ack(redis, d.stream, d.entry_id)
    assert (await redis.xpending(d.stream, GROUP))["pending"] == 0
    assert await redis.xlen(d.stream) == 0


async def test_dead_letter_moves_the_entry_with_its_reason(
    redis: streams.Redis, keys: Keys
) -> None:
    await streams.ensure_groups(redis, keys)
    stream = keys.stream(Priority.DEFAULT)
    await redis.xadd(stream, {"garbage": b"\xff"})
    [d] = await streams.read(redis, keys, "c1", count=1, block_ms=10)
    await streams.dead_letter(redis, keys, d, "missing_version", "")
    assert await redis.xlen(stream) == 0
    dead: Any = await redis.xrange(keys.dead)
    [(_, fields)] = dead
    assert fields[b"reason"] == b"missing_version"
    assert fields[b"source_id"] == d.entry_id.encode()
    stats = await admin.queue_stats(redis, keys)
    assert stats["dead"] == 1
    assert stats["streams"]["default"]["pending"] == 0


async def test_blocking_read_returns_when_empty(redis: streams.Redis, keys: Keys) -> None:
    await streams.ensure_groups(redis, keys)
    assert await streams.read(redis, keys, "c1", count=3, block_ms=20) == []


async def test_read_order_lets_low_go_first(redis: streams.Redis, keys: Keys) -> None:
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.HIGH, entry(1))
    await streams.publish(redis, keys, Priority.LOW, entry(2))
    low_first = (Priority.LOW, Priority.HIGH, Priority.DEFAULT)
    got = await streams.read(redis, keys, "c1", count=1, block_ms=10, order=low_first)
    assert [decode(d.fields).instance_id for d in got] == ["i_2"]


async def test_touch_keeps_our_pending_entries_and_names_only_those(
    redis: streams.Redis, keys: Keys
) -> None:
    """Touching resets idle time without a delivery, and returns the deliveries still pending:
    one acked and one dead-lettered since the read are left out, in the order given."""
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.DEFAULT, entry(1))
    await streams.publish(redis, keys, Priority.HIGH, entry(2))
    await streams.publish(redis, keys, Priority.DEFAULT, entry(3))
    await streams.publish(redis, keys, Priority.DEFAULT, entry(4))
    got = await streams.read(redis, keys, "c1", count=4, block_ms=10)
    by_instance = {decode(d.fields).instance_id: d for d in got}
    await streams.ack(redis, by_instance["i_1"].stream, by_instance["i_1"].entry_id)
    await streams.dead_letter(redis, keys, by_instance["i_4"], "bad_encoding", "x")

    still = await streams.touch(redis, "c1", got)

    assert [decode(d.fields).instance_id for d in still] == ["i_2", "i_3"]
    pending: Any = await redis.xpending_range(
        keys.stream(Priority.DEFAULT), GROUP, min="-", max="+", count=10
    )
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"c1", 1)]


async def test_read_own_returns_our_pending_entries_but_not_deleted_ones(
    redis: streams.Redis, keys: Keys
) -> None:
    await streams.ensure_groups(redis, keys)
    for n in (1, 2, 3):
        await streams.publish(redis, keys, Priority.DEFAULT, entry(n))
    got = await streams.read(redis, keys, "c1", count=3, block_ms=10)
    await streams.read(redis, keys, "c2", count=1, block_ms=10)  # nothing left for c2
    await redis.xdel(got[1].stream, got[1].entry_id)  # pending, but its fields are gone

    own = await admin.read_own(redis, keys, "c1", count=10)

    assert [decode(d.fields).instance_id for d in own] == ["i_1", "i_3"]
    assert await admin.read_own(redis, keys, "c2", count=10) == []


async def test_read_own_leaves_delivery_counts_as_they_are(
    redis: streams.Redis, keys: Keys
) -> None:
    """Reading our own list again (after a Redis error) is not a delivery: the counts the
    sweeper's poison limit looks at stay where they were."""
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.DEFAULT, entry(1))
    await streams.read(redis, keys, "c1", count=1, block_ms=10)

    for _ in range(3):
        assert len(await admin.read_own(redis, keys, "c1", count=10)) == 1

    pending: Any = await redis.xpending_range(
        keys.stream(Priority.DEFAULT), GROUP, min="-", max="+", count=10
    )
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"c1", 1)]


async def test_an_entry_is_moved_once_however_many_movers_try(
    redis: streams.Redis, keys: Keys
) -> None:
    """Two sweepers (or a sweeper and the entry's executor) that both decided to move the same
    pending entry: the first move takes it, the later ones find it no longer pending and do
    nothing, so one entry gives at most one dead letter or one new entry."""
    await streams.ensure_groups(redis, keys)
    stream = keys.stream(Priority.DEFAULT)
    for n in (1, 2):
        await streams.publish(redis, keys, Priority.DEFAULT, entry(n))
    first, second = await streams.read(redis, keys, "c1", count=2, block_ms=10)
    moved = await streams.dead_letter(redis, keys, first, "poison", "swept")
    assert moved is not None
    assert await streams.dead_letter(redis, keys, first, "poison", "swept") is None
    again = decode(second.fields).model_copy(update={"redeliveries": 1})
    assert await admin.redeliver(redis, first, again) is None
    new_id = await admin.redeliver(redis, second, again)
    assert new_id is not None
    assert await admin.redeliver(redis, second, again) is None
    assert await streams.dead_letter(redis, keys, second, "poison", "swept") is None
    assert await redis.xlen(keys.dead) == 1
    on_stream: Any = await redis.xrange(stream)
    assert [(streams.as_text(i), decode(f).redeliveries) for i, f in on_stream] == [(new_id, 1)]
    assert (await redis.xpending(stream, GROUP))["pending"] == 0


async def test_an_entry_whose_instance_id_is_not_utf8_names_no_instance(
    redis: streams.Redis, keys: Keys
) -> None:
    """Another writer's poison entry must not crash the reconciler's scan (and with it the
    sweeper at every start) before an executor dead-letters it."""
    await streams.ensure_groups(redis, keys)
    await streams.publish(redis, keys, Priority.LOW, entry(1))
    fields: dict[str, str | bytes] = {**encode(entry(2)), "instance_id": b"\xff\xfe"}
    await redis.xadd(keys.stream(Priority.LOW), fields)  # type: ignore[arg-type]
    assert await admin.instance_ids(redis, keys) == {"i_1"}


async def test_trim_keeps_entries_delivered_between_its_reads(
    redis: streams.Redis, keys: Keys
) -> None:
    """The group's pending list is empty (all work done) when `trim` starts; an executor reads
    three new entries between trim's two reads of the group, whichever comes first. They
    are pending, so none may go ("only acknowledged entries can go")."""
    await streams.ensure_groups(redis, keys)
    stream = keys.stream(Priority.DEFAULT)
    for n in range(3):
        await streams.publish(redis, keys, Priority.DEFAULT, entry(n))
    reads = [redis.xinfo_groups, redis.xpending]
    between: list[int] = []

    def then_an_executor_reads(call: Any) -> Any:
        async def wrapped(*args: Any) -> Any:
            answer = await call(*args)
            if not between:
                between.append(len(await streams.read(redis, keys, "c1", count=3, block_ms=10)))
            return answer

        return wrapped

    redis.xinfo_groups, redis.xpending = (then_an_executor_reads(r) for r in reads)  # type: ignore[method-assign]
    try:
        await admin.trim(redis, stream)
    finally:
        del redis.xinfo_groups, redis.xpending  # back to the class's methods
    assert between == [3]
    assert (await redis.xpending(stream, GROUP))["pending"] == 3
    assert await redis.xlen(stream) == 3


async def test_prune_keeps_a_consumer_that_reads_after_it_was_checked(
    redis: streams.Redis, keys: Keys
) -> None:
    """A consumer with nothing pending and no liveness key reads an entry right after prune
    listed the group's consumers: it is no longer idle, so it stays, and so does its pending
    entry (deleting a consumer drops its pending list)."""
    await streams.ensure_groups(redis, keys)
    stream = keys.stream(Priority.DEFAULT)
    await redis.xgroup_createconsumer(stream, GROUP, "quiet")
    await streams.publish(redis, keys, Priority.DEFAULT, entry(1))
    listed = redis.xinfo_consumers

    async def then_it_reads(*args: Any) -> Any:
        rows = await listed(*args)
        assert len(await streams.read(redis, keys, "quiet", count=1, block_ms=10)) == 1
        return rows

    redis.xinfo_consumers = then_it_reads  # type: ignore[method-assign, assignment]
    try:
        assert await admin.prune_consumers(redis, keys, stream, idle_ms=-1) == []
    finally:
        del redis.xinfo_consumers  # back to the class's method
    assert (await redis.xpending(stream, GROUP))["pending"] == 1


async def _a_read_is_blocked(redis: streams.Redis) -> bool:
    """Some client waits in a blocking XREADGROUP (this test's reader, or another test's:
    either way the deletion below happens before or during this test's read)."""
    clients: Any = await redis.client_list()
    return any(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in clients)


async def test_streams_deleted_under_a_blocked_read_say_the_group_is_missing(
    redis: streams.Redis, keys: Keys
) -> None:
    """The namespace's streams are deleted (Redis flushed) while an idle executor waits in
    its blocking read: Redis 7 answers `UNBLOCKED`, a read after it `NOGROUP`. Both mean the
    groups are to be made again, not a defect that stops the executor."""
    await streams.ensure_groups(redis, keys)
    reader = asyncio.create_task(streams.read(redis, keys, "c1", count=1, block_ms=10_000))
    await until(lambda: _a_read_is_blocked(redis))
    await drop_keys(redis, keys)
    with pytest.raises(ResponseError) as caught:
        await asyncio.wait_for(reader, timeout=10)
    assert streams.group_missing(caught.value), str(caught.value)
    assert not streams.group_missing(ResponseError("WRONGTYPE Operation against a key"))


async def test_a_missing_group_is_recognised_through_a_pipeline(
    redis: streams.Redis, keys: Keys
) -> None:
    """`touch` runs in a pipeline, whose errors redis-py prefixes with the command: a stream
    lost meanwhile (Redis restarted empty) still reads as a missing group."""
    await streams.ensure_groups(redis, keys)
    await redis.xadd(keys.streams()[0], {"x": "1"})
    read = await streams.read(redis, keys, "c1", count=1, block_ms=10)
    await redis.delete(*keys.streams())
    with pytest.raises(ResponseError) as caught:
        await streams.touch(redis, "c1", read)
    assert not str(caught.value).startswith("NOGROUP")
    assert streams.group_missing(caught.value), str(caught.value)
