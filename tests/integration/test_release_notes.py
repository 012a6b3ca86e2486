"""Release notes (`executor.handover`) on real Redis and a real store: the sweeper makes a
noted release only for the run the row holds (its attempt, its lease owner, its lease as
read), and a stopping executor notes the releases the store did not take, or, with Redis
down too, gives them up without holding its exit up."""

from __future__ import annotations

import asyncio
from random import Random

import pytest
import redis.asyncio as aioredis

from taskstream.core.protocol import GROUP, RELEASED_TTL_S, Priority
from taskstream.core.reasons import OWNER_LOST, RELEASED
from taskstream.core.states import Status
from taskstream.executor import handover
from taskstream.executor.committer import Committer
from taskstream.executor.handover import Releases
from tests.integration.harness import Harness
from tests.integration.outages import claimed_unrun, intake, no_dead_letters


async def _pending(h: Harness) -> int:
    return int((await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"])


async def test_a_noted_release_is_made_by_the_sweeper(outage: Harness) -> None:
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")  # RUNNING at 1 under c1, which is gone
    await handover.note(h.redis, h.keys, [(instance_id, 1)], "c1")
    await h.sweeper().sweep_once()
    row = await h.store.get_instance(instance_id)
    assert row is not None
    assert (row.status, row.attempt, row.lease_owner) == (Status.RETRYING, 1, None)
    assert row.next_attempt_at_ms is not None and row.next_attempt_at_ms <= h.clock.now_ms()
    last = (await h.store.history(instance_id))[-1]
    assert (last.from_status, last.attempt, last.owner, last.reason) == (
        Status.RUNNING,
        1,
        "c1",
        RELEASED,
    )
    assert await _pending(h) == 0
    assert not await h.redis.exists(h.keys.released(instance_id, 1))


@pytest.mark.parametrize(("attempt", "owner"), [(0, "c1"), (2, "c1"), (1, "c2")])
async def test_a_note_of_another_run_is_not_its_release(
    outage: Harness, attempt: int, owner: str
) -> None:
    """A note of another attempt (an older run of the instance, a later one) or of another
    owner: the run lost its owner, and is timed out as such."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    await handover.note(h.redis, h.keys, [(instance_id, attempt)], owner)
    await h.sweeper().sweep_once()
    history = await h.store.history(instance_id)
    assert [x.reason for x in history if x.from_status is Status.RUNNING] == [OWNER_LOST]


async def test_a_noted_release_loses_to_a_lease_extended_since_it_was_read(
    outage: Harness,
) -> None:
    """The CAS holds the lease as read: an owner that extended it meanwhile is alive."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    read = await h.store.get_instance(instance_id)
    assert read is not None
    assert await h.store.extend_leases([(instance_id, 1)], lease_s=120) == {(instance_id, 1)}
    made = await handover.make_release(h.store, h.redis, h.keys, read, now_ms=h.clock.now_ms())
    row = await h.store.get_instance(instance_id)
    assert not made
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)


async def _unwritten_release(h: Harness, redis: aioredis.Redis) -> tuple[str, Releases]:
    """A release of c1's claimed run that the store never takes (its committer does not run),
    queued on `Releases` whose notes go to `redis`."""
    instance_id, delivery = await claimed_unrun(h, "c1")
    [run] = await (await intake(h, "c1")).admit([delivery])
    committer = Committer(h.store, h.redis, h.keys, h.clock, Random(7), no_dead_letters)
    releases = Releases(committer, redis, h.keys, h.clock, "c1")
    releases.release(run)
    return instance_id, releases


async def test_a_stopping_executor_notes_the_releases_the_store_did_not_take(
    outage: Harness,
) -> None:
    h = outage
    instance_id, releases = await _unwritten_release(h, h.redis)
    await releases.note_unwritten()
    key = h.keys.released(instance_id, 1)
    assert await h.redis.get(key) == b"c1"
    assert 0 < await h.redis.ttl(key) <= RELEASED_TTL_S


async def test_with_redis_down_too_the_releases_are_given_up_at_once(outage: Harness) -> None:
    """Nothing can be noted: the stop goes on (the sweeper times the run out, as before)."""
    h = outage
    down = aioredis.Redis(host="127.0.0.1", port=1)  # nothing listens there
    try:
        instance_id, releases = await _unwritten_release(h, down)
        await asyncio.wait_for(releases.note_unwritten(), timeout=5)  # bounds a broken run
    finally:
        await down.aclose()
    assert not await h.redis.exists(h.keys.released(instance_id, 1))
