"""Rows that no stream entry can be made of (values a foreign writer put in the store) on real
Redis and a real store: they are logged and left as they are, and never hold back the rows
published with them (the scheduler's due retries, the reconciler's republishing), and an
operator's requeue or replay of such a FAILED row is refused, leaving it FAILED."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text, update
from structlog.testing import capture_logs

from taskstream.core import operations, streams
from taskstream.core.clock import FixedClock
from taskstream.core.errors import TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys, Priority, decode
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import task_instances
from taskstream.scheduler import service
from taskstream.scheduler.instances import new_instance
from taskstream.scheduler.service import REFUSED_RECHECK_S, Scheduler, SchedulerConfig
from tests.integration.harness import T0, Harness

SPEC = parse_task_file_text("tasks: [{id: t, agent: echo}]", "t.yaml").tasks[0]


async def foreign(store: SqlStore, instance_id: str, **values: Any) -> None:
    """Write `values` into a row as another program would, past the store's own checks."""
    async with store.engine.begin() as conn:
        stmt = update(task_instances).where(task_instances.c.id == instance_id).values(**values)
        await conn.execute(stmt)


async def queued(redis: streams.Redis, keys: Keys) -> list[str]:
    entries: Any = await redis.xrange(keys.stream(Priority.DEFAULT))
    return [decode(fields).instance_id for _, fields in entries]


async def two_rows(store: SqlStore) -> tuple[str, str]:
    """Two PENDING instances, not yet published; the first with a foreign priority."""
    rows = [new_instance(SPEC, T0 + n * 3_600_000) for n in (0, 1)]
    for row in rows:
        await store.create_instance(row)
    await foreign(store, rows[0].id, priority="urgent")
    return rows[0].id, rows[1].id


async def test_publish_many_leaves_a_row_it_cannot_publish_and_publishes_the_rest(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    bad, good = await two_rows(store)
    rows = [r for r in await store.list_instances() if r.id in (bad, good)]
    with capture_logs() as logs:
        refused = await Outbox(store, redis, keys).publish_many(rows, now_ms=T0)
    assert list(refused) == [bad] and "priority" in refused[bad] and "urgent" in refused[bad]
    assert await queued(redis, keys) == [good]
    statuses = {r.id: r.status for r in await store.list_instances()}
    assert statuses == {bad: Status.PENDING, good: Status.DISPATCHED}
    [logged] = [e for e in logs if e["event"] == "instance.unpublishable"]
    assert (logged["instance_id"], logged["log_level"]) == (bad, "error")


async def test_a_refused_row_is_logged_once_until_its_reason_changes(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The reconciler offers a refused row again every pass: one error line says it, not
    one per pass; a row whose reason changed, or that was published in between and refused
    again later, is logged again."""
    bad, _ = await two_rows(store)
    outbox = Outbox(store, redis, keys)

    async def offer() -> list[str]:
        [row] = [r for r in await store.list_instances() if r.id == bad]
        with capture_logs() as logs:
            await outbox.publish_many([row], now_ms=T0)
        return [e["error"] for e in logs if e["event"] == "instance.unpublishable"]

    [first] = await offer()
    assert await offer() == [] and await offer() == []
    await foreign(store, bad, priority="default", agent="")  # wrong for another reason
    [second] = await offer()
    assert second != first and "agent" in second
    assert await offer() == []
    await foreign(store, bad, agent="echo")
    assert await offer() == [] and await queued(redis, keys) == [bad]
    await foreign(store, bad, agent="")
    assert await offer() == [second]


async def test_a_due_retry_no_entry_can_be_made_of_does_not_hold_back_the_others(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(T0))
    fixed, bad = await two_rows(store)
    for instance_id in (fixed, bad):
        for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.RUNNING)):
            await store.transition(instance_id, src, dst, reason="setup")
        await store.transition(
            instance_id, Status.RUNNING, Status.RETRYING, reason="setup", next_attempt_at_ms=T0
        )
    await foreign(store, fixed, priority="high")
    await foreign(store, bad, agent="")  # an entry's agent has at least one character
    h.clock.set(T0 + 1)
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    with capture_logs() as logs:
        await scheduler.run_pass()
    statuses = {r.id: r.status for r in await store.list_instances()}
    assert statuses == {fixed: Status.DISPATCHED, bad: Status.RETRYING}
    [logged] = [e for e in logs if e["event"] == "instance.unpublishable"]
    assert logged["instance_id"] == bad and logged["error"].startswith("agent: ")
    [emitted] = [e for e in logs if e["event"] == "retries.emitted"]
    assert emitted["runs"] == [f"{fixed}@0"]


async def test_requeue_and_replay_refuse_a_row_they_could_not_publish(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A requeue would leave the row PENDING for good (the reconciler cannot publish it,
    `retry` takes only FAILED): both refuse it, naming why; it stays FAILED, its letter kept."""
    h = Harness(store, redis, keys)
    bad, _ = await two_rows(store)
    for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.RUNNING)):
        await store.transition(bad, src, dst, reason="setup")
    await store.transition(
        bad, Status.RUNNING, Status.FAILED, fail_class=FailClass.POISON, reason="setup"
    )
    with pytest.raises(TaskstreamError, match=r"cannot be published \(priority: .*urgent.*FAILED"):
        await operations.requeue(h.outbox, bad, who="ops", why="fixed", now_ms=T0)
    await redis.xadd(keys.dead, {"orig.instance_id": bad, "reason": "poison"})
    [letter] = await operations.dead_letters(redis, keys.dead, limit=10)
    with pytest.raises(TaskstreamError, match=r"cannot be published \(priority: .*urgent"):
        await operations.replay(h.outbox, letter, who="ops", now_ms=T0)
    assert await redis.xlen(keys.dead) == 1
    row = await store.get_instance(bad)
    assert row is not None and row.status is Status.FAILED


async def test_a_due_retry_no_entry_can_be_made_of_does_not_keep_the_scheduler_awake(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The refused row stays due; the scheduler sleeps until the next retry due after it
    (5 s on), not 0 s after every pass, and once none is left, offers it again within
    `REFUSED_RECHECK_S`."""
    h = Harness(store, redis, keys, FixedClock(T0))
    later, bad = await two_rows(store)
    for instance_id, due_ms in ((later, T0 + 5000), (bad, T0)):
        for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.RUNNING)):
            await store.transition(instance_id, src, dst, reason="setup")
        await store.transition(
            instance_id, Status.RUNNING, Status.RETRYING, reason="setup", next_attempt_at_ms=due_ms
        )
    await foreign(store, later, priority="default")
    await foreign(store, bad, agent="")
    h.clock.set(T0 + 1)
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    assert await scheduler._step() == pytest.approx(4.999)
    h.clock.set(T0 + 5000)
    assert await scheduler._step() == pytest.approx(REFUSED_RECHECK_S)
    statuses = {r.id: r.status for r in await store.list_instances()}
    assert statuses == {later: Status.DISPATCHED, bad: Status.RETRYING}


async def retrying(store: SqlStore, due_ms: int, *, count: int, offset: int = 0) -> list[str]:
    """`count` instances RETRYING, due at `due_ms`; their ids."""
    ids = []
    for n in range(count):
        row = new_instance(SPEC, T0 + (offset + n) * 3_600_000)
        await store.create_instance(row)
        for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.RUNNING)):
            await store.transition(row.id, src, dst, reason="setup")
        await store.transition(
            row.id, Status.RUNNING, Status.RETRYING, reason="setup", next_attempt_at_ms=due_ms
        )
        ids.append(row.id)
    return ids


async def test_a_full_page_of_refused_retries_does_not_hide_the_ones_due_after_it(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 2 due retries per pass; the 3 due first cannot be published. The next passes
    read on past them, so the one due after them is published on the second pass; the pass
    that finds no more starts over, and the scheduler then waits `REFUSED_RECHECK_S`."""
    monkeypatch.setattr(service, "MAX_RETRIES_PER_PASS", 2)
    bad = await retrying(store, T0, count=3)
    [good] = await retrying(store, T0 + 1, count=1, offset=3)
    for instance_id in bad:
        await foreign(store, instance_id, agent="")
    h = Harness(store, redis, keys, FixedClock(T0 + 10))
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    assert await scheduler._step() == 0  # a full page, all refused: read on at once
    assert await scheduler._step() == 0
    assert await queued(redis, keys) == [good]
    assert await scheduler._step() == pytest.approx(REFUSED_RECHECK_S)
    statuses = {r.id: r.status for r in await store.list_instances()}
    assert statuses == {**dict.fromkeys(bad, Status.RETRYING), good: Status.DISPATCHED}


async def test_a_due_retry_whose_row_cannot_be_read_does_not_stop_the_scheduler(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A RETRYING row holding JSON that does not parse (a hand edit in SQL): the scheduler's
    pass re-emits the other due retry and logs the bad row once, not on every pass, leaving
    it as it is."""
    bad, good = await retrying(store, T0, count=2)
    async with store.engine.begin() as conn:
        await conn.execute(
            text("UPDATE task_instances SET payload = '{oops' WHERE id = :id"), {"id": bad}
        )
    h = Harness(store, redis, keys, FixedClock(T0 + 10))
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    with capture_logs() as logs:
        await scheduler.run_pass()
        await scheduler.run_pass()
    assert await queued(redis, keys) == [good]
    told = [e for e in logs if e["event"] == "instance.unreadable"]
    assert [e["instance_id"] for e in told] == [bad]
    assert "payload" in told[0]["error"]
    async with store.engine.connect() as conn:
        kept = (
            await conn.execute(
                text("SELECT status, payload FROM task_instances WHERE id = :id"), {"id": bad}
            )
        ).one()
    assert tuple(kept) == (Status.RETRYING.value, "{oops")


async def test_a_full_page_of_unreadable_retries_does_not_hide_the_ones_due_after_it(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "MAX_RETRIES_PER_PASS", 2)
    bad = await retrying(store, T0, count=2)
    [good] = await retrying(store, T0 + 1, count=1, offset=2)
    for instance_id in bad:
        await foreign(store, instance_id, context="[1, 2")
    h = Harness(store, redis, keys, FixedClock(T0 + 10))
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    assert await scheduler._step() == 0  # a full page, none readable: read on at once
    # The unreadable rows stay due: read again after a while, not in a loop with no sleep.
    assert await scheduler._step() == pytest.approx(REFUSED_RECHECK_S)
    assert await queued(redis, keys) == [good]
