"""Poison entries on real Redis and a real store (in-process, clock passed in): a payload
too large, or an entry whose consumers keep dying before their claim, fails its instance as
poison and is dead-lettered; a requeue starts the count of lost owners again; and a poison
entry whose row the outbox or a consumer moves meanwhile still ends as it should."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from random import Random
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.operations import requeue
from taskstream.core.protocol import GROUP, Keys, Priority, decode
from taskstream.core.reasons import OWNER_LOST, SEEN_ON_STREAM
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest, InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.executor.recovery import Recovery
from taskstream.executor.sweeper import Sweeper
from tests.integration.executor_cases import TASKS, harness, reach
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import fail_next_dead_letter, intake


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


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


async def test_lost_runs_and_consumers_dead_before_their_claim_count_together(
    h: Harness,
) -> None:
    """`max_deliveries` 2. The first run loses its executor and is retried; its retry's entry
    then kills two consumers before their claim. Three deliveries ended without an outcome,
    one more than the limit: the third is poison, whatever mix of the two kinds they were."""
    await h.apply(CRASHY)
    row = await h.trigger(CRASHY, "crashy")
    sweeper = h.sweeper(max_deliveries=2)
    [d] = await streams.read(h.redis, h.keys, "gone-0", count=1, block_ms=10)
    claims = [ClaimRequest(row.id, decode(d.fields).attempt, 30)]
    assert row.id in await h.store.claim_many(claims, owner="gone-0")
    assert (await sweeper.sweep_once()).get("timeout") == 1
    retrying = await h.store.get_instance(row.id)
    assert retrying is not None and retrying.status is Status.RETRYING
    assert await h.outbox.publish(retrying, now_ms=h.clock.now_ms()) is None
    counts = []
    for n in (1, 2):
        assert await streams.read(h.redis, h.keys, f"doomed-{n}", count=1, block_ms=10)
        counts.append(await sweeper.sweep_once())
    assert [c.get("redeliver", 0) for c in counts] == [1, 0]
    assert counts[-1].get("poison") == 1
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.status, done.fail_class) == (Status.FAILED, FailClass.POISON)


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


async def test_a_retry_entry_a_live_executor_has_not_claimed_yet_is_not_poison(
    h: Harness,
) -> None:
    """Two runs lost their executor (two deliveries ended without an outcome, `max_deliveries`
    2); the retry's entry is then read by a live executor whose claim has not landed when the
    sweeper looks. That delivery has not ended: the entry is left, not failed as poison."""
    await h.apply(CRASHY)
    row = await h.trigger(CRASHY, "crashy")
    sweeper = h.sweeper(max_deliveries=2, min_idle_ms=0)
    for n in (0, 1):
        [d] = await streams.read(h.redis, h.keys, f"gone-{n}", count=1, block_ms=10)
        claims = [ClaimRequest(row.id, decode(d.fields).attempt, 30)]
        assert row.id in await h.store.claim_many(claims, owner=f"gone-{n}")
        assert (await sweeper.sweep_once()).get("timeout") == 1
        retrying = await h.store.get_instance(row.id)
        assert retrying is not None and retrying.status is Status.RETRYING
        assert await h.outbox.publish(retrying, now_ms=h.clock.now_ms()) is None
    await streams.mark_alive(h.redis, h.keys, "alive-1", ttl_ms=60_000)
    assert await streams.read(h.redis, h.keys, "alive-1", count=1, block_ms=10)
    counts = await sweeper.sweep_once()
    assert counts.get("poison") is None, counts
    assert (await h.redis.xrange(h.keys.dead)) == []
    now = await h.store.get_instance(row.id)
    assert now is not None and now.status is Status.DISPATCHED


async def test_a_poisoned_entry_whose_letter_failed_is_dead_lettered_by_its_waking_consumer(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c1 reads an entry and pauses before claiming. The sweeper fails the instance as poison,
    then Redis fails on the dead letter. c1 wakes and admits its batch: its claim loses to the
    FAILED row, and the entry is the letter the sweeper owed, not a duplicate to ack, which
    would leave a poison instance that `dead list` and `dead replay` never show."""
    row = await h.trigger(TASKS, "slow")
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    fail_next_dead_letter(monkeypatch)
    with pytest.raises(RedisConnectionError):
        await h.sweeper(max_deliveries=0).sweep_once()  # 1 delivery > 0: poison
    failed = await h.store.get_instance(row.id)
    assert failed is not None
    assert (failed.status, failed.fail_class) == (Status.FAILED, FailClass.POISON)
    assert await (await intake(h, "c1")).admit([delivery]) == []  # c1 wakes
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"poison"]
    assert (await h.redis.xpending(delivery.stream, GROUP))["pending"] == 0
