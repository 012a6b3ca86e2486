"""Executor delivery semantics on real Redis and a real store (in-process, clock passed in)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from random import Random
from typing import Any

import pytest
from sqlalchemy import select

from taskstream.agents.base import effect_key
from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.definitions import DefinitionCache
from taskstream.core.operations import requeue
from taskstream.core.protocol import GROUP, Keys, Priority, decode
from taskstream.core.reasons import LEASE_EXPIRED, OWNER_LOST, RELEASED, SEEN_ON_STREAM
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest, InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import review_queue
from taskstream.executor import service
from taskstream.executor.recovery import Recovered, Recovery
from taskstream.executor.sweeper import Sweeper
from taskstream.scheduler.instances import new_instance
from tests.integration.harness import T0, Harness, Running, until

TASKS = """
tasks:
  - id: flaky
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s, factor: 2, max: 10s}, jitter: 0}
    payload: {fail_until: 2}
  - id: hopeless
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 99}
  - id: twice
    agent: flaky
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 99}
  - id: fatal
    agent: flaky
    payload: {fail_until: 99, kind: fatal}
  - id: review
    agent: flaky
    payload: {fail_until: 99, kind: review}
  - id: effect
    agent: effect
    retry: {max_attempts: 3}
    payload: {seconds: 0}
  - id: effect-fails-first
    agent: effect
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 1}
  - id: effect-refused-first
    agent: effect
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 1, forget: true}
  - id: slow
    agent: slow
    timeout: 30s
    payload: {seconds: 0.5}
  - id: slow-once
    agent: slow
    retry: {max_attempts: 1}
    payload: {seconds: 0.5}
  - id: too-slow
    agent: slow
    timeout: 0.2s
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {seconds: 5}
  - id: past-deadline
    agent: slow
    timeout: 30s
    deadline: 0.3s
    retry: {max_attempts: 1}
    payload: {seconds: 5}
  - id: big
    agent: slow
    payload: {seconds: 0, blob: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())  # rows are stamped by the database clock
    await harness.apply(TASKS)
    return harness


async def status_of(h: Harness, instance_id: str) -> Status:
    row = await h.store.get_instance(instance_id)
    assert row is not None
    return row.status


async def reach(h: Harness, instance_id: str, *wanted: Status) -> None:
    async def check() -> bool:
        return await status_of(h, instance_id) in wanted

    await until(check)


async def failed_run(h: Harness, task_id: str, **trigger: int) -> InstanceRow:
    """Trigger one instance of `task_id`, run an executor until it is FAILED, and read it."""
    row = await h.trigger(TASKS, task_id, **trigger)
    ex = Running(h.executor())
    try:
        await reach(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None
    return done


async def test_retries_with_backoff_until_success(h: Harness) -> None:
    row = await h.trigger(TASKS, "flaky")
    ex = Running(h.executor())
    try:
        for attempt, delay_ms in ((1, 1000), (2, 2000)):
            await reach(h, row.id, Status.RETRYING)
            current = await h.store.get_instance(row.id)
            assert current is not None and current.attempt == attempt
            assert current.next_attempt_at_ms == h.clock.now_ms() + delay_ms
            await h.scheduler().run_pass()
            assert await status_of(h, row.id) is Status.RETRYING  # not due yet
            h.clock.advance(delay_ms)
            await h.scheduler().run_pass()
        await reach(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None and done.attempt == 3 and done.result == {"attempt": 3}


async def test_attempts_are_never_exceeded(h: Harness) -> None:
    row = await h.trigger(TASKS, "hopeless")
    ex = Running(h.executor())
    try:
        for _ in range(5):
            await reach(h, row.id, Status.RETRYING, Status.FAILED)
            h.clock.advance(60_000)
            await h.scheduler().run_pass()
        await reach(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.attempt, done.fail_class) == (3, FailClass.EXHAUSTED)
    runs = [x for x in await h.store.history(row.id) if x.to_status is Status.RUNNING]
    assert len(runs) == 3


@pytest.mark.parametrize(
    ("task", "fail_class"), [("fatal", FailClass.FATAL), ("review", FailClass.MANUAL_REVIEW)]
)
async def test_fatal_and_review_fail_at_once(h: Harness, task: str, fail_class: FailClass) -> None:
    done = await failed_run(h, task)
    assert (done.attempt, done.fail_class) == (1, fail_class)
    async with h.store.engine.connect() as conn:
        stmt = select(review_queue.c.reason).where(review_queue.c.instance_id == done.id)
        reviews = list((await conn.execute(stmt)).scalars())
    assert reviews == (
        ["NeedsReview: attempt 1 fails"] if fail_class is FailClass.MANUAL_REVIEW else []
    )


async def test_timeout_goes_through_timeout_to_retry(h: Harness) -> None:
    row = await h.trigger(TASKS, "too-slow")
    ex = Running(h.executor())
    try:
        await reach(h, row.id, Status.RETRYING)
        h.clock.advance(1000)
        await h.scheduler().run_pass()
        await reach(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    path = [x.to_status for x in await h.store.history(row.id)]
    assert path.count(Status.TIMEOUT) == 2
    assert path[-2:] == [Status.TIMEOUT, Status.FAILED]
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert done.last_error == "TimeoutError: the attempt ran past its timeout (0.2 s)"


async def test_a_deadline_sooner_than_the_timeout_limits_the_attempt(h: Harness) -> None:
    done = await failed_run(h, "past-deadline", fire_ms=h.clock.now_ms())
    assert done.last_error == "TimeoutError: the attempt ran past its deadline (0.3 s)"


async def test_oversize_payload_is_poison(h: Harness) -> None:
    row = await h.trigger(TASKS, "big")
    ex = Running(h.executor(max_payload_bytes=50))

    async def dead_lettered() -> bool:
        # The FAILED commit comes first, the move to the dead-letter stream after it.
        return bool(await h.redis.xlen(h.keys.dead))

    try:
        await reach(h, row.id, Status.FAILED)
        await until(dead_lettered)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None and done.fail_class is FailClass.POISON
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"payload_too_large"]


async def test_consumers_dying_before_their_claim_make_the_entry_poison(h: Harness) -> None:
    """Each read of the entry kills its consumer before the claim (no liveness key, no claim):
    the sweeper publishes it again with the deliveries so far, and the sixth delivery, the
    first over `max_deliveries` (5), is poison. Without the count it would loop for ever."""
    row = await h.trigger(TASKS, "slow")
    sweeper = h.sweeper(max_deliveries=5)
    actions: list[dict[str, int]] = []
    for n in range(1, 9):
        [d] = await streams.read(h.redis, h.keys, f"doomed-{n}", count=1, block_ms=10)
        assert decode(d.fields).redeliveries == n - 1
        actions.append(await sweeper.sweep_once())
        if actions[-1].get("poison"):
            break
    assert [a.get("redeliver", 0) for a in actions] == [1, 1, 1, 1, 1, 0]
    assert actions[-1]["poison"] == 1
    done = await h.store.get_instance(row.id)
    assert done is not None and done.status is Status.FAILED
    assert done.fail_class is FailClass.POISON
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"poison"]
    assert await h.redis.xlen(h.keys.stream(Priority.DEFAULT)) == 0


CRASHY = """
tasks:
  - id: crashy
    agent: slow
    retry: {max_attempts: 10, backoff: {base: 1s}, jitter: 0}
    payload: {seconds: 0}
"""


async def _claimed_by(h: Harness, instance_id: str, owner: str) -> InstanceRow:
    """The instance claimed by `owner` (a consumer with no liveness key: gone)."""
    row = await h.store.get_instance(instance_id)
    assert row is not None
    if row.status is Status.RETRYING:
        moved = await h.store.transition(
            row.id, Status.RETRYING, Status.DISPATCHED, reason="published", attempt=row.attempt
        )
        assert moved.ok
    claims = await h.store.claim_many([ClaimRequest(row.id, row.attempt, 30)], owner=owner)
    assert instance_id in claims
    running = await h.store.get_instance(instance_id)
    assert running is not None
    return running


async def test_a_requeue_starts_the_count_of_lost_owners_again(h: Harness) -> None:
    """Five runs lost their executor; the operator failed the instance, fixed the cause and
    requeued it. The first run after the requeue that loses its executor is retried (one
    attempt of ten used), not poison: lost owners count from the requeue on, as attempts do."""
    await h.apply(CRASHY)
    row = await h.trigger(CRASHY, "crashy")
    defs = DefinitionCache(h.store)
    await defs.refresh(force=True)
    recovery = Recovery(h.store, defs, Random(7))
    for n in range(5):
        running = await _claimed_by(h, row.id, f"gone-{n}")
        lost = await recovery.time_out(running, reason=OWNER_LOST, now_ms=h.clock.now_ms())
        assert lost.ok and lost.decision is not None
        assert lost.decision.status is Status.RETRYING
    failed = await h.store.transition(
        row.id,
        Status.RETRYING,
        Status.FAILED,
        reason="manual",
        attempt=5,
        fail_class=FailClass.POISON,
    )
    assert failed.ok
    for stream in h.keys.streams():  # the earlier entries are gone; only the requeue's is read
        await h.redis.delete(stream)
    await streams.ensure_groups(h.redis, h.keys)
    assert await requeue(h.outbox, row.id, who="ops", why="fixed", now_ms=h.clock.now_ms()) is None
    await streams.read(h.redis, h.keys, "crashed-once", count=1, block_ms=10)
    await _claimed_by(h, row.id, "crashed-once")
    counts = await h.sweeper(max_deliveries=5).sweep_once()
    after = await h.store.get_instance(row.id)
    assert after is not None
    assert (after.status, after.fail_class, counts.get("poison")) == (Status.RETRYING, None, None)


Write = Callable[[str, Status, Status], Awaitable[None]]


async def _sweep_poison_with(
    h: Harness, monkeypatch: pytest.MonkeyPatch, before: Callable[[Status, str], bool], other: Write
) -> tuple[Sweeper, dict[str, int], list[CasResult]]:
    """The instance's entry is read by two consumers that die before their claims, so the
    second sweep judges it poison (`max_deliveries` 1). Just before the sweeper's first
    transition that `before(dst, reason)` picks, `other` commits its write of the row. Returns
    the sweeper, the second sweep's counts and the result of the transition raced."""
    sweeper = h.sweeper(max_deliveries=1)
    real = h.store.transition
    raced: list[CasResult] = []

    async def other_first(instance_id: str, src: Status, dst: Status, **kw: Any) -> CasResult:
        if not raced and before(dst, str(kw.get("reason"))):
            await other(instance_id, src, dst)
            raced.append(result := await real(instance_id, src, dst, **kw))
            return result
        return await real(instance_id, src, dst, **kw)

    await streams.read(h.redis, h.keys, "doomed-1", count=1, block_ms=10)
    assert (await sweeper.sweep_once()).get("redeliver") == 1
    monkeypatch.setattr(h.store, "transition", other_first)
    await streams.read(h.redis, h.keys, "doomed-2", count=1, block_ms=10)
    return sweeper, await sweeper.sweep_once(), raced


async def test_a_poison_entry_whose_row_the_outbox_moves_meanwhile_still_fails_the_instance(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper read the row PENDING (the outbox's CAS to DISPATCHED not landed) and the
    outbox's CAS lands just before the sweeper's own move to DISPATCHED: that move is lost,
    yet the instance fails as poison. Left DISPATCHED, it would be published again by the
    reconciler and kill consumers anew, its delivery count started over."""
    row = await h.pending_on_stream(TASKS, "slow")

    async def outbox(instance_id: str, src: Status, dst: Status) -> None:
        assert (await h.store.transition(instance_id, src, dst, reason="published")).ok

    _, counts, raced = await _sweep_poison_with(
        h, monkeypatch, lambda _dst, reason: reason == SEEN_ON_STREAM, outbox
    )
    assert counts.get("poison") == 1
    assert raced == [CasResult(ok=False, found=Status.DISPATCHED)]
    done = await h.store.get_instance(row.id)
    assert done is not None and (done.status, done.fail_class) == (
        Status.FAILED,
        FailClass.POISON,
    )
    assert [x.reason for x in await h.store.history(row.id)][-2:] == ["published", "poison"]


async def test_a_poison_entry_whose_instance_is_claimed_meanwhile_is_not_dead_lettered(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper judged the entry poison from a DISPATCHED row, but a consumer holding a
    second delivery of the attempt claims the row just before the sweeper's move to FAILED:
    that move is lost, and the entry is left, not dead-lettered, for a run that goes on. The
    next pass acks it as a duplicate of the run the other consumer holds."""
    row = await h.trigger(TASKS, "slow")

    async def claim(instance_id: str, _src: Status, _dst: Status) -> None:
        won = await h.store.claim_many([ClaimRequest(instance_id, 0, 60)], owner="c9")
        assert instance_id in won

    sweeper, counts, raced = await _sweep_poison_with(
        h, monkeypatch, lambda dst, _reason: dst is Status.FAILED, claim
    )
    assert raced == [CasResult(ok=False, found=Status.RUNNING)]
    assert (counts.get("poison"), counts.get("leave")) == (None, 1)
    assert await h.redis.xlen(h.keys.dead) == 0
    done = await h.store.get_instance(row.id)
    assert done is not None and (done.status, done.lease_owner) == (Status.RUNNING, "c9")
    assert (await sweeper.sweep_once()).get("ack") == 1
    assert await h.redis.xlen(h.keys.dead) == 0


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


@pytest.mark.parametrize(
    ("task", "performed_again"), [("effect-fails-first", False), ("effect-refused-first", True)]
)
async def test_a_failed_attempts_effect_is_kept_unless_the_agent_forgets_it(
    h: Harness, task: str, performed_again: bool
) -> None:
    """Attempt 1 gets the effect from `once`, then fails. Its key commits with the failure (the
    effect may have happened), so attempt 2 does not perform it again; unless attempt 1 said
    with `forget` that it did not happen, and then attempt 2 performs it."""
    row = await h.trigger(TASKS, task)
    await h.run_until(row.id, Status.RETRYING)
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send") is not performed_again
    h.clock.advance(1000)
    await h.scheduler().run_pass()
    await h.run_until(row.id, Status.SUCCESS)
    done = await h.store.get_instance(row.id)
    assert done is not None and done.result == {"performed": performed_again, "attempt": 2}
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send")


async def test_a_duplicate_delivery_has_one_committed_effect(h: Harness) -> None:
    row = await h.trigger(TASKS, "effect")
    stream = h.keys.stream(Priority.DEFAULT)
    entries: Any = await h.redis.xrange(stream)
    [(entry_id, fields)] = entries
    await h.redis.xadd(stream, fields)  # the same entry, twice on the stream
    ex1 = Running(h.executor("c1"))
    ex2 = Running(h.executor("c2"))
    try:
        await reach(h, row.id, Status.SUCCESS)
        await h.sweeper(min_idle_ms=0).sweep_once()  # acks a copy another consumer left

        async def drained() -> bool:
            return await h.redis.xlen(stream) == 0

        await until(drained)
    finally:
        await ex1.close()
        await ex2.close()
    history = await h.store.history(row.id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send")
    assert (await h.redis.xpending(stream, GROUP))["pending"] == 0
    assert entry_id


async def test_a_fenced_zombie_does_not_commit_or_ack(h: Harness) -> None:
    """Run A is timed out by the sweeper (owner gone), B re-runs and commits; A's late
    commit is fenced and its entry stays unacked by A."""
    row = await h.trigger(TASKS, "effect")
    stream = h.keys.stream(Priority.DEFAULT)
    [d] = await streams.read(h.redis, h.keys, "zombie", count=1, block_ms=10)
    from taskstream.core.store.port import ClaimRequest, FinishRequest

    won = await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner="zombie")
    token = won[row.id].token
    counts = await h.sweeper().sweep_once()  # "zombie" has no liveness key: owner lost
    assert counts.get("timeout") == 1
    assert await status_of(h, row.id) is Status.RETRYING
    h.clock.advance(60_000)
    await h.scheduler().run_pass()
    ex = Running(h.executor("c2"))
    try:
        await reach(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()
    late = await h.store.finish_many([FinishRequest(row.id, token, Status.SUCCESS, "late")])
    assert not late[row.id].ok
    history = await h.store.history(row.id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert [x.owner for x in history if x.to_status is Status.SUCCESS] == ["c2"]
    assert d.stream == stream


async def test_redis_emptied_in_flight_nothing_is_lost(h: Harness) -> None:
    rows = [await h.trigger(TASKS, "slow", T0 + i) for i in range(6)]
    await h.redis.delete(*h.keys.streams())  # what FLUSHDB does to our keys
    h.clock.advance(60_000)  # past the reconciler's grace
    counts = await h.sweeper().sweep_once()
    assert counts["republished"] == 6
    ex = Running(h.executor(concurrency=8))
    try:
        for row in rows:
            await reach(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()


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


async def test_stop_lets_a_run_finish_within_the_grace(h: Harness) -> None:
    row = await h.trigger(TASKS, "slow")
    ex = Running(h.executor(grace_s=10))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    assert await status_of(h, row.id) is Status.SUCCESS


async def test_a_run_past_the_grace_is_released_without_spending_an_attempt(h: Harness) -> None:
    row = await h.trigger(TASKS, "slow-once")
    ex = Running(h.executor(grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    released = await h.store.get_instance(row.id)
    assert released is not None and released.status is Status.RETRYING
    assert released.next_attempt_at_ms is not None
    assert released.next_attempt_at_ms <= h.clock.now_ms()
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0
    await h.scheduler().run_pass()
    again = Running(h.executor(grace_s=10))
    try:
        await reach(h, row.id, Status.SUCCESS)  # max_attempts is 1: the release did not count
    finally:
        await again.close()
    done = await h.store.get_instance(row.id)
    assert done is not None and done.attempt == 2


LONG = """
tasks:
  - id: long
    agent: slow
    timeout: 120s
    payload: {seconds: 60}
"""


async def test_stop_with_every_slot_busy_releases_after_the_grace(h: Harness) -> None:
    """With no free slot the executor waits for a run to end; a stop must end that wait,
    or the grace and the release wait for the 60 s run (and SIGKILL loses it meanwhile)."""
    await h.apply(LONG)
    row = await h.trigger(LONG, "long")
    ex = Running(h.executor(concurrency=1, grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    ex.stop.set()
    await asyncio.wait_for(ex.task, timeout=10)  # bounds a broken run only
    assert await status_of(h, row.id) is Status.RETRYING
    assert (await h.store.history(row.id))[-1].reason == RELEASED


STALLS = """
tasks:
  - id: stalls
    agent: flaky
    retry: {{max_attempts: {max_attempts}, backoff: {{base: 1s, factor: 2}}, jitter: 0}}
    payload: {{stall_until: 1, seconds: 60, fail_until: 2}}
"""


@pytest.mark.parametrize("max_attempts", [2, 5])
async def test_a_released_attempt_does_not_count(h: Harness, max_attempts: int) -> None:
    """Attempt 1 is released at shutdown (not counted); attempt 2, only the first that ran,
    fails retriably. At max_attempts 2 it is the last by the token, yet one attempt is left;
    at 5 (below the limit, where intake does not read the history) its backoff is still the
    first one's: base * factor**0 = 1 s, not 2 s."""
    stalls = STALLS.format(max_attempts=max_attempts)
    h.clock.set(await h.store.db_now_ms())
    await h.apply(stalls)
    row = await h.trigger(stalls, "stalls")
    ex = Running(h.executor(grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    assert await status_of(h, row.id) is Status.RETRYING
    await h.scheduler().run_pass()
    again = Running(h.executor())
    try:

        async def second_ended() -> bool:
            found = await h.store.get_instance(row.id)
            assert found is not None
            return found.attempt == 2 and found.status in (Status.RETRYING, Status.FAILED)

        await until(second_ended)
    finally:
        await again.close()
    ended = await h.store.get_instance(row.id)
    assert ended is not None
    assert (ended.status, ended.fail_class) == (Status.RETRYING, None)
    assert ended.next_attempt_at_ms == h.clock.now_ms() + 1000


LONG_KEY = f"""
tasks:
  - id: long-key
    agent: effect
    dedupe_key: "{{task_id}}:{{scheduled_for}}:{"k" * 220}"
    payload: {{seconds: 0}}
"""


async def test_a_side_effect_of_an_instance_with_a_long_dedupe_key_commits(h: Harness) -> None:
    """`dedupe_key:name` would be longer than the store's key column: the key is stored as
    its digest instead of failing the commit every time."""
    await h.apply(LONG_KEY)
    row = await h.trigger(LONG_KEY, "long-key")
    assert len(f"{row.dedupe_key}:send") > 255
    ex = Running(h.executor())
    try:
        await reach(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()
    assert await h.store.side_effect_done(effect_key(row.dedupe_key, "send"))
    done = await h.store.get_instance(row.id)
    assert done is not None and done.result == {"performed": True, "attempt": 1}


async def test_liveness_key_is_set_while_running_and_removed_after(h: Harness) -> None:
    ex = Running(h.executor("c9"))

    async def alive() -> bool:
        return bool(await h.redis.exists(h.keys.alive("c9")))

    await until(alive)
    await ex.close()
    assert not await alive()


async def test_a_defect_around_the_agent_fails_the_attempt_instead_of_losing_the_run(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever escapes `runner.execute` (it should return an end for everything but
    cancellation) becomes a retriable failure of that attempt: the run is committed and its
    entry acked, not left RUNNING until its lease runs out."""

    async def defective(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("defect")

    monkeypatch.setattr(service, "execute", defective)
    row = await h.trigger(TASKS, "slow-once")
    running = Running(h.executor())
    try:

        async def failed() -> bool:
            return await status_of(h, row.id) is Status.FAILED

        await until(failed)
    finally:
        await running.close()
    found = await h.store.get_instance(row.id)
    assert found is not None and found.last_error == "RuntimeError: defect"
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


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


async def test_a_recovered_run_whose_retry_would_miss_the_deadline_is_exhausted(
    h: Harness,
) -> None:
    """Its executor died; the next attempt would be due 30 s on, 25 s past the deadline. As
    for a failure the executor commits, that retry is not planned: FAILED `exhausted` now,
    instead of a claim after the deadline that only finds it passed."""
    h.clock.set(await h.store.db_now_ms())
    await h.apply(DEADLINED)
    row = await h.trigger(DEADLINED, "deadlined", fire_ms=h.clock.now_ms())
    assert row.deadline_ms == h.clock.now_ms() + 5000
    done = await time_out_claimed(h, row.id, 0, LEASE_EXPIRED)
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
