"""The sweeper and the reconciler on real Redis and a real store (in-process, clock passed
in): they find what is lost behind a full page of entries or rows that are fine, two sweepers
move a stuck entry once, a row no entry can be made of does not stop a pass, and a run whose
owner is gone fails or retries as its executor would have (within the attempts stored with it
and its deadline, whatever its `retry_on`), unless its lease was extended meanwhile."""

from __future__ import annotations

import asyncio
from random import Random
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.definitions import DefinitionCache
from taskstream.core.protocol import GROUP, Keys, Priority, decode
from taskstream.core.reasons import LEASE_EXPIRED, OWNER_LOST
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, InstanceRow, UnreadableRow
from taskstream.core.store.sql import SqlStore
from taskstream.executor.recovery import Recovered, Recovery
from taskstream.scheduler.instances import new_instance
from tests.integration.executor_cases import TASKS, harness, reach, status_of
from tests.integration.harness import T0, Harness


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def test_two_sweepers_over_one_stuck_entry_move_it_once(h: Harness) -> None:
    """Two sweeper passes at once over one entry whose consumer died before its claim: both
    see it pending and decide to publish it again; one new entry is published. Likewise an
    undecodable entry gets one dead letter."""
    row = await h.trigger(TASKS, "slow")
    stream = h.keys.stream(Priority.DEFAULT)
    await h.redis.xadd(stream, {"garbage": b"\xff"})
    await streams.read(h.redis, h.keys, "gone", count=2, block_ms=10)
    sweepers = [h.sweeper(), h.sweeper()]
    counts = await asyncio.gather(*(s.sweep_once() for s in sweepers))
    assert sum(c.get("redeliver", 0) for c in counts) == 1
    assert sum(c.get("dead_letter", 0) for c in counts) == 1
    entries: Any = await h.redis.xrange(stream)
    assert [decode(f).instance_id for _, f in entries] == [row.id]
    assert await h.redis.xlen(h.keys.dead) == 1
    assert (await h.redis.xpending(stream, GROUP))["pending"] == 0


async def test_the_reconciler_reaches_a_lost_row_behind_a_page_of_rows_that_are_fine(
    h: Harness,
) -> None:
    """More stale in-flight rows than one pass reads (2 here) have live entries; a newer row
    lost its entry. The reconciler pages on across passes and republishes it."""
    fine = [await h.trigger(TASKS, "slow", T0 + k) for k in (1, 2)]
    lost = await h.trigger(TASKS, "slow", T0 + 3)
    stream = h.keys.stream(Priority.DEFAULT)
    entries: Any = await h.redis.xrange(stream)
    [lost_entry] = [i for i, f in entries if decode(f).instance_id == lost.id]
    await h.redis.xdel(stream, lost_entry)
    h.clock.advance(60_000)  # every row is past the grace
    reconciler = h.reconciler(limit=2)

    republished = [await reconciler.reconcile() for _ in range(2)]

    assert republished == [0, 1]
    entries = await h.redis.xrange(stream)
    assert sorted(decode(f).instance_id for _, f in entries) == sorted(
        [r.id for r in fine] + [lost.id]
    )


async def test_the_sweeper_looks_past_a_full_page_of_healthy_pending_entries(
    h: Harness,
) -> None:
    """Pages of 2: `live` (alive, leases held) has the two oldest pending entries, `gone` (no
    liveness key) the third. One pass reaches the third and times its run out."""
    rows = [await h.trigger(TASKS, "slow", fire_ms=h.clock.now_ms() + i) for i in range(3)]
    assert len(await streams.read(h.redis, h.keys, "live", count=2, block_ms=10)) == 2
    assert len(await streams.read(h.redis, h.keys, "gone", count=1, block_ms=10)) == 1
    await h.store.claim_many([ClaimRequest(r.id, 0, 600) for r in rows[:2]], owner="live")
    await h.store.claim_many([ClaimRequest(rows[2].id, 0, 600)], owner="gone")
    await streams.mark_alive(h.redis, h.keys, "live", 60_000)
    counts = await h.sweeper(batch=2, min_idle_ms=0).sweep_once()
    assert counts.get("timeout") == 1
    statuses = [await status_of(h, r.id) for r in rows]
    assert statuses[:2] == [Status.RUNNING, Status.RUNNING]
    assert statuses[2] is not Status.RUNNING


async def test_a_row_no_entry_can_be_made_of_does_not_stop_the_reconciler(h: Harness) -> None:
    """A PENDING row whose fire time is before 1970 (the stream protocol refuses it) sits
    beside a lost row that can be published: the pass publishes the second and goes on."""
    spec = next(s for s in await h.definitions() if s.id == "slow")
    bad = await h.outbox.emit(new_instance(spec, -60_000), now_ms=h.clock.now_ms())
    good = await h.trigger(TASKS, "slow")
    stream = h.keys.stream(Priority.DEFAULT)
    entries: Any = await h.redis.xrange(stream)
    await h.redis.xdel(stream, *[i for i, f in entries if decode(f).instance_id == good.id])
    h.clock.advance(60_000)
    reconciler = h.reconciler()
    assert await reconciler.reconcile() == 1
    assert await status_of(h, bad.instance_id) is Status.PENDING
    assert good.id in await admin.instance_ids(h.redis, h.keys)


async def test_a_reconciler_that_lost_the_race_counts_nothing(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reconcilers read the same lost run (RUNNING, its lease and entry gone). The one
    whose timeout lands first counts it; the other, whose move finds it moved, counts and
    logs nothing."""
    row = await h.trigger(TASKS, "slow")
    await h.redis.delete(*h.keys.streams())
    await h.store.claim_many([ClaimRequest(row.id, 0, 1)], owner="gone")
    h.clock.advance(60_000)
    first, second = h.reconciler(), h.reconciler()
    seen = await h.store.stale([Status.RUNNING], updated_before_ms=h.clock.now_ms() + 1, limit=10)
    assert [r.id for r in seen] == [row.id]
    assert await first.reconcile() == 1

    async def as_read_before(*_: Any, **__: Any) -> list[InstanceRow | UnreadableRow]:
        return seen

    monkeypatch.setattr(h.store, "stale", as_read_before)
    assert await second.reconcile() == 0


async def _entry_lost_while_running(h: Harness) -> InstanceRow:
    """A `slow` run claimed by `gone` for 10 minutes whose entry Redis then lost, left
    untouched past the reconciler's grace."""
    row = await h.trigger(TASKS, "slow")
    await h.redis.delete(*h.keys.streams())
    await h.store.claim_many([ClaimRequest(row.id, 0, 600)], owner="gone")
    h.clock.advance(60_000)
    return row


async def test_a_run_whose_entry_and_owner_are_gone_is_timed_out_before_its_lease_ends(
    h: Harness,
) -> None:
    """Redis lost the entry of a running run and its executor died: the owner's liveness key
    stays absent. The reconciler times the run out as `owner_lost` once the key has been
    absent for a TTL, instead of waiting out the 10-minute lease."""
    row = await _entry_lost_while_running(h)
    reconciler = h.reconciler()  # a liveness TTL of 6 s
    assert await reconciler.reconcile() == 0  # absent once: maybe a Redis emptied just now
    h.clock.advance(6_000)
    assert await reconciler.reconcile() == 1
    reasons = [x.reason for x in await h.store.history(row.id)]
    assert OWNER_LOST in reasons and LEASE_EXPIRED not in reasons
    assert await status_of(h, row.id) in (Status.RETRYING, Status.DISPATCHED)


async def test_a_run_whose_owner_sets_its_key_again_keeps_its_lease(h: Harness) -> None:
    """The owner's key was absent at one pass (Redis emptied under a live executor) and set
    again before the next: the run is left RUNNING. So is one read while liveness is not
    trusted (Redis failed within a TTL), however long its key is absent."""
    row = await _entry_lost_while_running(h)
    reconciler = h.reconciler(liveness_ttl_ms=6_000)
    assert await reconciler.reconcile() == 0
    await h.redis.set(h.keys.alive("gone"), "1", px=6_000)
    h.clock.advance(6_000)
    assert await reconciler.reconcile() == 0
    await h.redis.delete(h.keys.alive("gone"))
    for _ in range(3):
        h.clock.advance(6_000)
        assert await reconciler.reconcile(liveness_trusted=False) == 0
    assert await status_of(h, row.id) is Status.RUNNING


async def time_out_claimed(
    h: Harness, instance_id: str, expected_attempt: int, reason: str
) -> Recovered:
    """Claim the instance for an owner that then vanishes, and time its run out as the
    sweeper (`OWNER_LOST`) or the reconciler (`LEASE_EXPIRED`) would."""
    claim = ClaimRequest(instance_id, expected_attempt, 30)
    assert instance_id in await h.store.claim_many([claim], owner="gone")
    running = await h.store.get_instance(instance_id)
    assert running is not None
    defs = DefinitionCache(h.store)
    await defs.refresh(force=True)
    return await Recovery(h.store, defs, Random(7)).time_out(
        running, reason=reason, now_ms=h.clock.now_ms()
    )


async def test_a_last_run_that_lost_its_owner_after_ordinary_failures_is_exhausted(
    h: Harness,
) -> None:
    """Attempt 1 fails on its own; attempt 2's executor dies. The work did not kill every
    executor it ran on, so the instance is `exhausted`, not `poison` (no dead letter)."""
    row = await h.trigger(TASKS, "twice")
    await h.run_until(row.id, Status.RETRYING)
    h.clock.advance(60_000)
    await h.scheduler().run_pass()
    await reach(h, row.id, Status.DISPATCHED)
    done = await time_out_claimed(h, row.id, 1, OWNER_LOST)
    assert done.ok and done.decision is not None
    assert done.decision.fail_class is FailClass.EXHAUSTED
    final = await h.store.get_instance(row.id)
    assert final is not None and (final.status, final.fail_class) == (
        Status.FAILED,
        FailClass.EXHAUSTED,
    )


NO_TIMEOUT_RETRIES = """
tasks:
  - id: strict
    agent: slow
    retry: {max_attempts: 5, retry_on: [retriable]}
    payload: {seconds: 0}
"""


@pytest.mark.parametrize("reason", [OWNER_LOST, LEASE_EXPIRED])
async def test_a_lost_run_retries_though_its_task_does_not_retry_timeouts(
    h: Harness, reason: str
) -> None:
    """`retry_on: [retriable]` leaves out the agent's own timeouts, not runs lost with their
    executor: one crash or lapsed lease retries (1 of 5 attempts), not `poison` or `fatal`."""
    await h.apply(NO_TIMEOUT_RETRIES)
    row = await h.trigger(NO_TIMEOUT_RETRIES, "strict")
    done = await time_out_claimed(h, row.id, 0, reason)
    assert done.ok and done.decision is not None
    assert (done.decision.status, done.decision.fail_class) == (Status.RETRYING, None)
    assert await status_of(h, row.id) is Status.RETRYING
    assert await h.redis.xlen(h.keys.dead) == 0


UNDEFINED = """
tasks:
  - id: undefined
    agent: slow
    retry: {max_attempts: 3}
    payload: {seconds: 0}
"""


async def test_a_timed_out_run_of_a_task_not_defined_keeps_the_attempts_stored_with_it(
    h: Harness,
) -> None:
    """No stored definition names the instance's task (it was triggered from a file never
    applied, or its definition was removed): recovery retries it within the attempt limit its
    row was created with (3), as its executor would, instead of failing it after one."""
    row = await h.trigger(UNDEFINED, "undefined")
    assert row.max_attempts == 3
    defs = DefinitionCache(h.store)
    await defs.refresh(force=True)
    assert defs.get("undefined") is None
    done = await time_out_claimed(h, row.id, 0, OWNER_LOST)
    assert done.ok and done.decision is not None
    assert done.decision.status is Status.RETRYING
    assert await status_of(h, row.id) is Status.RETRYING


DEADLINED = """
tasks:
  - id: deadlined
    agent: slow
    timeout: 1s
    deadline: 5s
    retry: {max_attempts: 3, backoff: {base: 30s}, jitter: 0}
    payload: {seconds: 0}
"""


@pytest.mark.parametrize("why", [LEASE_EXPIRED, OWNER_LOST])
async def test_a_recovered_run_whose_retry_would_miss_the_deadline_is_exhausted(
    h: Harness, why: str
) -> None:
    """Its executor died; the next attempt would be due 30 s on, 25 s past the deadline. As
    for a failure the executor commits, that retry is not planned: FAILED `exhausted` now,
    instead of a claim after the deadline that only finds it passed. Not `poison` when its
    owner was lost: one lost run of three attempts is not a run that kills its executors."""
    h.clock.set(await h.store.db_now_ms())
    await h.apply(DEADLINED)
    row = await h.trigger(DEADLINED, "deadlined", fire_ms=h.clock.now_ms())
    assert row.deadline_ms == h.clock.now_ms() + 5000
    done = await time_out_claimed(h, row.id, 0, why)
    assert done.ok and done.decision is not None
    final = await h.store.get_instance(row.id)
    assert final is not None
    assert (final.status, final.fail_class, final.next_attempt_at_ms) == (
        Status.FAILED,
        FailClass.EXHAUSTED,
        None,
    )


async def test_a_run_whose_lease_was_extended_after_the_sweepers_read_is_left_running(
    h: Harness,
) -> None:
    """The sweeper read the row with its lease run out; before its move, the heartbeat
    extended the lease. The owner is alive: the run stays RUNNING under it, no attempt is
    spent, and nothing is recorded."""
    row = await h.trigger(TASKS, "twice")
    await reach(h, row.id, Status.DISPATCHED)
    claim = ClaimRequest(row.id, 0, 30)
    won = await h.store.claim_many([claim], owner="exec-1")
    seen = await h.store.get_instance(row.id)
    assert seen is not None
    assert await h.store.extend_lease(row.id, token=won[row.id].token, lease_s=90)
    before = await h.store.history(row.id)
    defs = DefinitionCache(h.store)
    recovered = await Recovery(h.store, defs, Random(7)).time_out(
        seen, reason=LEASE_EXPIRED, now_ms=h.clock.now_ms()
    )
    after_read = await h.store.get_instance(row.id)
    assert after_read is not None
    assert (recovered.ok, after_read.status, after_read.lease_owner) == (
        False,
        Status.RUNNING,
        "exec-1",
    )
    assert await h.store.history(row.id) == before


LATE = """
tasks:
  - id: late
    agent: slow
    timeout: 30s
    deadline: 5s
    retry: {max_attempts: 3, backoff: {base: 1s}, jitter: 0, retry_on: [retriable]}
    payload: {seconds: 0}
"""


async def test_a_timeout_left_behind_past_the_deadline_is_exhausted_whatever_retry_on(
    h: Harness,
) -> None:
    """The executor stopped its run at the deadline and its move into TIMEOUT landed, the
    move out of it did not; recovery finishes it past the deadline. No retry can follow, so
    the instance is `exhausted`, as the executor would have moved it: not `fatal` because
    the task's `retry_on` leaves timeouts out."""
    h.clock.set(await h.store.db_now_ms())
    await h.apply(LATE)
    row = await h.trigger(LATE, "late", fire_ms=h.clock.now_ms())
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 0, 30)], owner="gone")
    moved = await h.store.transition(
        row.id, Status.RUNNING, Status.TIMEOUT, reason="timeout", attempt=1
    )
    assert moved.ok
    h.clock.advance(6_000)
    left = await h.store.get_instance(row.id)
    assert left is not None
    defs = DefinitionCache(h.store)
    await defs.refresh(force=True)
    done = await Recovery(h.store, defs, Random(7)).leave_timeout(left, now_ms=h.clock.now_ms())
    assert done.ok
    final = await h.store.get_instance(row.id)
    assert final is not None
    assert (final.status, final.fail_class) == (Status.FAILED, FailClass.EXHAUSTED)
