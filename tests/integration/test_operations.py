"""Operator actions on real Redis and a real store: requeue and dead-letter replay."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from taskstream.cli import ops_cmds
from taskstream.cli.common import Cluster
from taskstream.core import operations, streams
from taskstream.core import streams_admin as admin
from taskstream.core.errors import StoreUnavailable, TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, InstanceRow
from taskstream.core.store.sql import SqlStore
from tests.integration.harness import Harness, Running, until

TASKS = """
tasks:
  - id: once-fails
    agent: flaky
    retry: {max_attempts: 1}
    payload: {fail_until: 1}
  - id: ghost
    agent: nobody-knows-me
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS.replace("nobody-knows-me", "echo"))
    return harness


async def finished(h: Harness, instance_id: str, *wanted: Status) -> None:
    async def check() -> bool:
        row = await h.store.get_instance(instance_id)
        return row is not None and row.status in wanted

    await until(check)


async def test_requeue_gives_a_failed_instance_a_new_budget(h: Harness) -> None:
    row = await h.trigger(TASKS, "once-fails")
    ex = Running(h.executor())
    try:
        await finished(h, row.id, Status.FAILED)
        await operations.requeue(
            h.outbox, row.id, who="ops", why="upstream fixed", now_ms=h.clock.now_ms()
        )
        await finished(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()
    history = await h.store.history(row.id)
    requeue = next(x for x in history if x.reason == "requeued")
    assert (requeue.from_status, requeue.to_status, requeue.owner, requeue.note) == (
        Status.FAILED,
        Status.PENDING,
        "ops",
        "upstream fixed",
    )
    assert [x.note for x in history if x is not requeue] == [None] * (len(history) - 1)
    with pytest.raises(TaskstreamError, match="only FAILED"):
        await operations.requeue(h.outbox, row.id, who="ops", why="again", now_ms=0)


async def ghost_and_garbage_letters(h: Harness) -> InstanceRow:
    """An executor dead-letters a run of an agent it does not know (the instance FAILED
    poison) and an entry that is no work entry; returns the failed instance."""
    row = await h.trigger(TASKS.replace("nobody-knows-me", "no-such-agent"), "ghost")
    await h.redis.xadd(h.keys.stream(Priority.DEFAULT), {"garbage": "1"})
    ex = Running(h.executor())
    try:
        await finished(h, row.id, Status.FAILED)

        async def two_dead() -> bool:
            return await h.redis.xlen(h.keys.dead) == 2

        await until(two_dead)
    finally:
        await ex.close()
    return row


async def test_dead_letters_are_listed_and_replayed(h: Harness) -> None:
    row = await ghost_and_garbage_letters(h)
    failed = await h.store.get_instance(row.id)
    assert failed is not None and failed.fail_class is FailClass.POISON
    letters = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    assert sorted(x.reason for x in letters) == ["missing_version", "unknown_agent"]
    garbage = next(x for x in letters if x.reason == "missing_version")
    with pytest.raises(TaskstreamError, match="names no instance"):
        await operations.replay(h.outbox, garbage, who="ops", now_ms=0)
    ghost = next(x for x in letters if x.reason == "unknown_agent")
    assert await operations.dead_letter(h.redis, h.keys.dead, ghost.dead_id) == ghost
    assert await operations.dead_letter(h.redis, h.keys.dead, "1-1") is None
    for bad in ("abc", ghost.dead_id + "x", "99999999999999999999-0"):
        with pytest.raises(TaskstreamError, match="is not a dead letter id"):
            await operations.dead_letter(h.redis, h.keys.dead, bad)
    assert await operations.dead_letters(h.redis, h.keys.dead, limit=10, after=ghost.dead_id) == [
        x for x in letters if x.dead_id > ghost.dead_id
    ]
    assert await operations.replay(h.outbox, ghost, who="ops", now_ms=0) == "requeued"
    assert await h.redis.xlen(h.keys.dead) == 1
    replayed = await h.store.get_instance(row.id)
    assert replayed is not None and replayed.status is Status.DISPATCHED


async def test_a_letter_whose_instance_id_is_not_of_the_protocols_form_names_none(
    h: Harness,
) -> None:
    """A letter another program wrote, its original instance id empty or longer than an entry
    may carry, is listed with every field, naming no instance: it cannot be replayed."""
    for odd in ("", "x" * 200):
        await h.redis.xadd(h.keys.dead, {"reason": "poison", "orig.instance_id": odd})
    letters = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    assert [(x.instance_id, x.fields["orig.instance_id"]) for x in letters] == [
        (None, ""),
        (None, "x" * 200),
    ]
    with pytest.raises(TaskstreamError, match="names no instance"):
        await operations.replay(h.outbox, letters[1], who="ops", now_ms=0)


@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.RUNNING, Status.RETRYING])
async def test_replaying_a_letter_of_an_instance_in_flight(h: Harness, status: Status) -> None:
    """A letter whose instance has moved on since (say it was retried by hand): waiting for a
    claim, it is published again; running or waiting for its retry, nothing is published,
    since an entry at its attempt would later start the retry at once, past its backoff."""
    row = await h.trigger(TASKS, "once-fails")
    stream = h.keys.stream(Priority.DEFAULT)
    await h.redis.delete(stream)
    await streams.ensure_groups(h.redis, h.keys)
    if status is not Status.DISPATCHED:
        assert await h.store.claim(row.id, expected_attempt=0, owner="elsewhere", lease_s=60)
    if status is Status.RETRYING:
        later = h.clock.now_ms() + 3_600_000
        moved = await h.store.finish(
            row.id, token=1, dst=status, reason="retry", error="boom", next_attempt_at_ms=later
        )
        assert moved.ok
    await h.redis.xadd(h.keys.dead, {"reason": "poison", "orig.instance_id": row.id})
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    done = await operations.replay(h.outbox, letter, who="ops", now_ms=h.clock.now_ms())
    published = status is Status.DISPATCHED
    assert done == ("published" if published else f"in flight ({status}), left as it is")
    assert (await h.redis.xlen(stream), await h.redis.xlen(h.keys.dead)) == (int(published), 0)


async def test_the_queue_view_tells_live_consumers_from_dead_ones(h: Harness) -> None:
    await h.redis.xadd(h.keys.stream(Priority.DEFAULT), {"v": "1"})
    await h.redis.xadd(h.keys.stream(Priority.DEFAULT), {"v": "2"})
    await streams.mark_alive(h.redis, h.keys, "live-one", ttl_ms=60_000)
    for consumer in ("live-one", "gone-one"):
        await streams.read(h.redis, h.keys, consumer, count=1, block_ms=10)
    view = await admin.queue_view(h.redis, h.keys)
    found = {c["name"]: c["alive"] for c in view["streams"]["default"]["consumers"]}
    assert found == {"live-one": True, "gone-one": False}
    assert view["streams"]["high"]["consumers"] == []


async def test_sweeper_prunes_dead_consumers_and_trims(h: Harness) -> None:
    stream = h.keys.stream(Priority.DEFAULT)
    await h.redis.xadd(stream, {"v": "1"})
    await streams.read(h.redis, h.keys, "gone-consumer", count=1, block_ms=10)
    [pending] = await admin.pending(h.redis, stream, count=10)
    await streams.ack(h.redis, stream, pending.entry_id)
    assert await admin.prune_consumers(h.redis, h.keys, stream, idle_ms=-1) == ["gone-consumer"]
    assert await h.redis.xinfo_consumers(stream, GROUP) == []
    assert await admin.trim(h.redis, stream) == 0


FOREIGN = b"\xff\xfeother"
"""A consumer name that is not UTF-8, as some other program may make one in the group."""


async def _read_as(h: Harness, stream: str, consumer: bytes) -> None:
    """Another program's XREADGROUP of one entry under the name `consumer`."""
    command: Any = h.redis.execute_command
    await command("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", 1, "STREAMS", stream, ">")


async def test_a_consumer_named_in_bytes_that_are_not_utf8_is_pruned_by_them(h: Harness) -> None:
    """Idle, with nothing pending and no liveness key: deleted by its own bytes; one holding
    an entry stays; the pass goes on to the others."""
    stream = h.keys.stream(Priority.DEFAULT)
    await streams.ensure_groups(h.redis, h.keys)
    await h.redis.xgroup_createconsumer(stream, GROUP, FOREIGN)
    await h.redis.xgroup_createconsumer(stream, GROUP, "gone-consumer")
    await h.redis.xadd(stream, {"v": "1"})
    await _read_as(h, stream, b"\xfeholder")
    gone = await admin.prune_consumers(h.redis, h.keys, stream, idle_ms=-1)
    assert sorted(gone) == ["\\xff\\xfeother", "gone-consumer"]
    left = await h.redis.xinfo_consumers(stream, GROUP)
    assert [row["name"] for row in left] == [b"\xfeholder"]


async def test_a_sweep_pass_and_the_queue_view_go_on_past_such_a_consumer(h: Harness) -> None:
    """The holder's entry is swept (an owner with no liveness key), the idle one pruned, and
    `status` shows each name with its bad bytes escaped, as not alive."""
    stream = h.keys.stream(Priority.DEFAULT)
    await streams.ensure_groups(h.redis, h.keys)
    await h.redis.xgroup_createconsumer(stream, GROUP, FOREIGN)
    await h.redis.xadd(stream, {"v": "1"})
    await _read_as(h, stream, b"\xfeholder")
    view = await admin.queue_view(h.redis, h.keys)
    shown = {c["name"]: c["alive"] for c in view["streams"]["default"]["consumers"]}
    assert shown == {"\\xfeholder": False, "\\xff\\xfeother": False}
    counts = await h.sweeper(consumer_idle_ms=0).sweep_once()
    assert counts.get("dead_letter") == 1, counts
    assert await h.redis.xinfo_consumers(stream, GROUP) == []


async def test_a_requeue_with_redis_down_stands_and_the_reconciler_publishes_it(
    h: Harness,
) -> None:
    """The store is the truth: FAILED -> PENDING commits, the publish fails and says so
    (no error), and the reconciler publishes the PENDING row once Redis answers."""
    row = await h.trigger(TASKS, "once-fails")
    await h.run_until(row.id, Status.FAILED)
    down = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    try:
        late = await operations.requeue(
            Outbox(h.store, down, h.keys), row.id, who="ops", why="fixed", now_ms=0
        )
    finally:
        await down.aclose()
    assert late is not None and "reconciler publishes it" in late
    pending = await h.store.get_instance(row.id)
    assert pending is not None and pending.status is Status.PENDING
    h.clock.advance(60_000)
    reconciler = h.reconciler()
    assert await reconciler.reconcile() == 1
    assert row.id in await admin.instance_ids(h.redis, h.keys)


@dataclass
class _Cluster:
    """What `dead replay` uses of an open cluster."""

    store: SqlStore
    queue: streams.Redis
    keys: Keys


async def test_replay_all_looks_at_the_letters_there_were_once(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replayed instance is dead-lettered again at once (as an executor that still does
    not know its agent would): `--all` must not chase the letters its own replays cause."""
    await ghost_and_garbage_letters(h)
    seen: list[str] = []
    replay = ops_cmds._replay_one

    async def replay_then_dead_again(cluster: Cluster, letter: operations.DeadLetter) -> str:
        seen.append(letter.dead_id)
        said = await replay(cluster, letter)
        if said == "requeued":
            await h.redis.xadd(h.keys.dead, {"reason": "unknown_agent", "instance_id": "x"})
        return said

    monkeypatch.setattr(ops_cmds, "_replay_one", replay_then_dead_again)
    cluster = _Cluster(h.store, h.redis, h.keys)
    with pytest.raises(TaskstreamError, match=r"^1 of 2 dead letters not replayed"):
        await asyncio.wait_for(ops_cmds._replay_all(cluster), timeout=30)  # type: ignore[arg-type]
    assert len(seen) == len(set(seen)) == 2
    assert await h.redis.xlen(h.keys.dead) == 2  # the kept garbage and the new letter


async def test_replay_all_stops_when_the_store_goes_down(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store outage is not one more letter kept: `--all` stops at once (exit 1), and the
    letters after it are left untouched."""
    await ghost_and_garbage_letters(h)
    for n in range(3):
        await h.redis.xadd(h.keys.dead, {"reason": "poison", "orig.instance_id": f"i{n}"})
    seen: list[str] = []

    async def store_down(cluster: Cluster, letter: operations.DeadLetter) -> str:
        seen.append(letter.dead_id)
        raise StoreUnavailable("store mysql://... unavailable: OperationalError")

    monkeypatch.setattr(ops_cmds, "_replay_one", store_down)
    cluster = _Cluster(h.store, h.redis, h.keys)
    with pytest.raises(StoreUnavailable):
        await ops_cmds._replay_all(cluster)  # type: ignore[arg-type]
    assert len(seen) == 1
    assert await h.redis.xlen(h.keys.dead) == 5


async def test_a_requeue_past_the_deadline_is_refused(h: Harness) -> None:
    """Its new attempt would time out before it starts: the instance stays FAILED and the
    operator is told why, instead of `requeued` followed by an instant failure."""
    tasks = TASKS.replace("{fail_until: 1}", "{fail_until: 1}\n    deadline: 1h")
    row = await h.trigger(tasks, "once-fails", fire_ms=h.clock.now_ms())
    assert row.deadline_ms == h.clock.now_ms() + 3_600_000
    ex = Running(h.executor())
    try:
        await finished(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    with pytest.raises(TaskstreamError, match=r"is past its deadline \(.*\): .*; left FAILED$"):
        await operations.requeue(h.outbox, row.id, who="ops", why="late", now_ms=row.deadline_ms)
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is Status.FAILED
    said = await operations.requeue(
        h.outbox, row.id, who="ops", why="in time", now_ms=row.deadline_ms - 1
    )
    assert said is None


async def test_a_requeue_is_not_failed_again_by_the_entry_it_replaces(h: Harness) -> None:
    """The sweeper failed an unclaimed entry as poison (FAILED committed) and Redis failed
    before the entry reached the dead-letter stream. The operator fixes the cause and
    requeues: the old entry, still pending with its delivery count, is of an older attempt
    now and acked, not taken for the requeued run's and failed as poison again."""
    row = await h.trigger(TASKS, "once-fails")
    sweeper = h.sweeper(max_deliveries=1)
    await streams.read(h.redis, h.keys, "doomed-1", count=1, block_ms=10)
    assert (await sweeper.sweep_once()).get("redeliver") == 1
    [old] = await streams.read(h.redis, h.keys, "doomed-2", count=1, block_ms=10)
    poisoned = await h.store.transition(  # as the sweeper commits it; its XADD then failed
        row.id, Status.DISPATCHED, Status.FAILED, reason="poison", fail_class=FailClass.POISON
    )
    assert poisoned.ok
    said = await operations.requeue(h.outbox, row.id, who="ops", why="fixed", now_ms=0)
    assert said is None
    counts = await sweeper.sweep_once()
    after = await h.store.get_instance(row.id)
    assert after is not None
    assert (after.status, after.fail_class, after.attempt) == (Status.DISPATCHED, None, 1)
    assert counts.get("ack") == 1 and not counts.get("poison")
    pending: Any = await h.redis.xpending_range(old.stream, GROUP, "-", "+", 10)
    assert old.entry_id.encode() not in [p["message_id"] for p in pending]


async def _poisoned_unclaimed(h: Harness, instance_id: str, *, attempt: int) -> None:
    """Fail the dispatched instance as poison before any claim, and dead-letter its entry, as
    an executor that does not know its agent does."""
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    poisoned = await h.store.transition(
        instance_id,
        Status.DISPATCHED,
        Status.FAILED,
        reason="unknown_agent",
        attempt=attempt,
        fail_class=FailClass.POISON,
    )
    assert poisoned.ok
    assert await streams.dead_letter(h.redis, h.keys, delivery, "unknown_agent", "flaky")


@pytest.mark.parametrize("fail_class", [FailClass.MANUAL_REVIEW, FailClass.FATAL])
async def test_a_letter_does_not_requeue_a_later_failure_of_another_kind(
    h: Harness, fail_class: FailClass
) -> None:
    """Attempt 0 was dead-lettered as poison; the operator fixed the cause and retried the
    instance by hand (the letter stays), and its new run failed for a reason of its own. A
    later `dead replay` of the old letter must not requeue it past that verdict."""
    row = await h.trigger(TASKS, "once-fails")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    now_ms = h.clock.now_ms()
    await operations.requeue(h.outbox, row.id, who="ops", why="agent deployed", now_ms=now_ms)
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 1, 60)], owner="c2")
    failed = await h.store.finish(
        row.id, token=2, dst=Status.FAILED, reason="failed", fail_class=fail_class
    )
    assert failed.ok
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    done = await operations.replay(h.outbox, letter, who="ops", now_ms=now_ms)
    assert done.startswith("failed since, not by this letter")
    after = await h.store.get_instance(row.id)
    assert after is not None and (after.status, after.fail_class) == (Status.FAILED, fail_class)
    assert await h.redis.xlen(h.keys.dead) == 0


async def test_a_letter_does_not_requeue_a_later_poison_failure_after_a_retry_by_hand(
    h: Harness,
) -> None:
    """Attempt 0 was dead-lettered as poison before any claim; the operator retried it by
    hand (attempt 1), and it was poisoned again before any claim. The letter of attempt 0
    is not the failure of attempt 1: that attempt came from the requeue, not from a run the
    letter's entry started, so replaying the old letter leaves the instance as it is."""
    row = await h.trigger(TASKS, "once-fails")
    now_ms = h.clock.now_ms()
    for attempt in (0, 1):
        if attempt:
            await operations.requeue(h.outbox, row.id, who="ops", why="fixed", now_ms=now_ms)
        await _poisoned_unclaimed(h, row.id, attempt=attempt)
    old, new = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    assert (old.fields["orig.attempt"], new.fields["orig.attempt"]) == ("0", "1")

    done = await operations.replay(h.outbox, old, who="ops", now_ms=now_ms)

    assert done.startswith("failed since, not by this letter"), done
    after = await h.store.get_instance(row.id)
    assert after is not None and (after.status, after.attempt) == (Status.FAILED, 1)
    assert await operations.replay(h.outbox, new, who="ops", now_ms=now_ms) == "requeued"
