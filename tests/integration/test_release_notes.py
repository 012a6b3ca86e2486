"""Release notes (`executor.handover`) on real Redis and a real store: the sweeper makes a
noted release only for the run the row holds (its attempt, its lease owner, its lease as
read), and a stopping executor notes the releases and the ends the store did not take, or,
with Redis down too, gives them up without holding its exit up. A noted end is released with
a history note naming it; a note whose end landed after all is ignored."""

from __future__ import annotations

import asyncio
from random import Random

import pytest
import redis.asyncio as aioredis

from taskstream.core.errors import StoreRefused, StoreUnavailable
from taskstream.core.protocol import GROUP, RELEASED_TTL_S, Priority
from taskstream.core.reasons import OWNER_LOST, RELEASED
from taskstream.core.states import Status
from taskstream.core.store.port import FinishRequest
from taskstream.executor import handover
from taskstream.executor.committer import Committer
from taskstream.executor.handover import LOST_END, Handed, Handover
from taskstream.executor.intake import Run
from taskstream.executor.outcome import succeeded
from taskstream.executor.sweep import ReleaseNote
from tests.integration.harness import Harness
from tests.integration.outages import claimed_unrun, intake, no_dead_letters


async def _pending(h: Harness) -> int:
    return int((await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"])


async def test_a_noted_release_is_made_by_the_sweeper(outage: Harness) -> None:
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")  # RUNNING at 1 under c1, which is gone
    await handover.note(h.redis, h.keys, [Handed(instance_id, 1)], "c1")
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
    assert last.note is None
    assert await _pending(h) == 0
    assert not await h.redis.exists(h.keys.released(instance_id, 1))


async def test_a_noted_lost_end_is_released_with_a_note_naming_it(outage: Harness) -> None:
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    await handover.note(h.redis, h.keys, [Handed(instance_id, 1, "completed")], "c1")
    assert await h.redis.get(h.keys.released(instance_id, 1)) == b"c1|completed"
    await h.sweeper().sweep_once()
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RETRYING, 1)
    last = (await h.store.history(instance_id))[-1]
    assert (last.from_status, last.attempt, last.owner, last.reason) == (
        Status.RUNNING,
        1,
        "c1",
        RELEASED,
    )
    assert last.note == LOST_END.format(end="completed")
    assert await _pending(h) == 0


@pytest.mark.parametrize(
    ("dst", "reason"), [(Status.SUCCESS, "completed"), (Status.RETRYING, "retriable_error")]
)
async def test_a_note_of_an_end_that_landed_is_ignored(
    outage: Harness, dst: Status, reason: str
) -> None:
    """The end's commit landed, its reply lost with the link at the stop, so the executor
    noted it: the row is no longer RUNNING at that attempt, and the note changes nothing."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    due = 0 if dst is Status.RETRYING else None
    landed = FinishRequest(instance_id, 1, dst, reason, owner="c1", next_attempt_at_ms=due)
    assert (await h.store.finish_many([landed]))[instance_id].ok
    await handover.note(h.redis, h.keys, [Handed(instance_id, 1, reason)], "c1")
    before = await h.store.history(instance_id)
    await h.sweeper().sweep_once()
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (dst, 1)
    assert await h.store.history(instance_id) == before
    assert await _pending(h) == 0


@pytest.mark.parametrize(("attempt", "owner"), [(0, "c1"), (2, "c1"), (1, "c2")])
async def test_a_note_of_another_run_is_not_its_release(
    outage: Harness, attempt: int, owner: str
) -> None:
    """A note of another attempt (an older run of the instance, a later one) or of another
    owner: the run lost its owner, and is timed out as such."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    await handover.note(h.redis, h.keys, [Handed(instance_id, attempt)], owner)
    await h.sweeper().sweep_once()
    history = await h.store.history(instance_id)
    assert [x.reason for x in history if x.from_status is Status.RUNNING] == [OWNER_LOST]


@pytest.mark.parametrize("value", [b"c1\xff", b"\xff|completed", b"c1|\xfe\xff"])
async def test_a_note_that_is_not_utf8_is_no_release(outage: Harness, value: bytes) -> None:
    """A `released:` value written by some other program, bytes that are not UTF-8, is read
    as no note of this run's owner (its end, if any, shown with replacement characters): the
    run is timed out as a lost owner's, where the sweeper's pass failed on it every time."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    await h.redis.set(h.keys.released(instance_id, 1), value)
    await h.sweeper().sweep_once()
    history = await h.store.history(instance_id)
    moved = [x for x in history if x.from_status is Status.RUNNING]
    if value.startswith(b"c1|"):  # its owner's note: released, its end named as it could be
        assert [x.reason for x in moved] == [RELEASED]
        assert moved[0].note == LOST_END.format(end="\ufffd\ufffd")
    else:
        assert [x.reason for x in moved] == [OWNER_LOST]


async def test_a_noted_release_loses_to_a_lease_extended_since_it_was_read(
    outage: Harness,
) -> None:
    """The CAS holds the lease as read: an owner that extended it meanwhile is alive."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")
    read = await h.store.get_instance(instance_id)
    assert read is not None
    assert await h.store.extend_leases([(instance_id, 1)], lease_s=120) == {(instance_id, 1)}
    note = ReleaseNote(1, "c1")
    made = await handover.make_release(
        h.store, h.redis, h.keys, read, note, now_ms=h.clock.now_ms()
    )
    row = await h.store.get_instance(instance_id)
    assert not made
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)


async def _run_of_c1(h: Harness) -> tuple[str, Run, Committer]:
    """c1's claimed run, and a committer that does not run: nothing queued on it is written."""
    instance_id, delivery = await claimed_unrun(h, "c1")
    [run] = await (await intake(h, "c1")).admit([delivery])
    committer = Committer(h.store, h.redis, h.keys, h.clock, Random(7), no_dead_letters)
    return instance_id, run, committer


async def _unwritten_release(h: Harness, redis: aioredis.Redis) -> tuple[str, Handover]:
    """A release of c1's claimed run that the store never takes (its committer does not run),
    queued on `Handover` whose notes go to `redis`."""
    instance_id, run, committer = await _run_of_c1(h)
    releases = Handover(committer, redis, h.keys, h.clock, "c1")
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


async def test_a_stopping_executor_notes_the_ends_the_store_did_not_take(outage: Harness) -> None:
    """An end still queued at the stop (its commit never written, or cut off)."""
    h = outage
    instance_id, run, committer = await _run_of_c1(h)
    ends = Handover(committer, h.redis, h.keys, h.clock, "c1")
    ends.end(run, succeeded({"n": 1}))
    ends.stop()
    await ends.note_unwritten()
    key = h.keys.released(instance_id, 1)
    assert await h.redis.get(key) == b"c1|completed"
    assert 0 < await h.redis.ttl(key) <= RELEASED_TTL_S


@pytest.mark.parametrize(
    ("stopped", "error", "noted"),
    [
        (True, StoreUnavailable("down"), True),  # its last try at the stop met the outage
        (True, StoreRefused("too long"), False),  # a value the store will not take
        (False, StoreUnavailable("down"), False),  # before the stop: a step after its commit
        (True, None, False),  # written
    ],
)
async def test_only_an_end_the_outage_kept_from_the_store_at_the_stop_is_noted(
    outage: Harness, stopped: bool, error: Exception | None, noted: bool
) -> None:
    h = outage
    instance_id, run, committer = await _run_of_c1(h)
    ends = Handover(committer, h.redis, h.keys, h.clock, "c1")
    if stopped:
        ends.stop()
    done = ends.end(run, succeeded(None))
    if error is None:
        done.set_result(True)
    else:
        done.set_exception(error)
    await asyncio.sleep(0)  # the future's callbacks
    ends.stop()
    await ends.note_unwritten()
    assert await h.redis.exists(h.keys.released(instance_id, 1)) == noted


async def test_ends_done_before_the_stop_are_pruned_and_an_unwritten_one_is_kept(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handover, "PRUNE_AT", 2)
    h = outage
    instance_id, run, committer = await _run_of_c1(h)
    ends = Handover(committer, h.redis, h.keys, h.clock, "c1")
    ends.end(run, succeeded({"n": 1}))  # never written: its committer does not run
    for _ in range(6):  # written ones, forgotten by the prunes these ends set off
        ends.end(run, succeeded(None)).set_result(True)
    ends.stop()
    await ends.note_unwritten()
    assert await h.redis.get(h.keys.released(instance_id, 1)) == b"c1|completed"
