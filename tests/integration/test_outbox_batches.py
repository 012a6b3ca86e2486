"""The outbox's group commit on real Redis and a real store: concurrent emits share a few
batches, each instance still ends up created once, published once and DISPATCHED, duplicates
are answered as such, a batch the store could not write reaches every caller while one it
refused for one row's value fails that row's emit only, and one whose XADDs failed is
answered `unpublished` while its rows stay PENDING for the reconciler."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncConnection
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core.errors import StoreRefused, StoreUnavailable
from taskstream.core.outbox import Emitted, Outbox
from taskstream.core.protocol import Keys, Priority, decode
from taskstream.core.spec import instance_id_for
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import CasResult, ClaimRequest, DispatchRequest, NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_instances import instance_values
from taskstream.core.store.tables import task_instances
from taskstream.core.store.urls import normalize_url
from taskstream.scheduler.instances import new_instance
from tests.integration.harness import until
from tests.integration.outages import RUNNING, kill_waiter
from tests.support.databases import available_kinds, temp_database
from tests.support.statements import statements

T0 = 1_780_000_000_000
NOBODY = "mysql://root@127.0.0.1:1/nothing"
"""A database URL nothing listens on (port 1)."""
SPEC = parse_task_file_text("tasks: [{id: t, agent: echo}]", "t.yaml").tasks[0]


def news(n: int) -> list[NewInstance]:
    return [new_instance(SPEC, T0 + i * 1000) for i in range(n)]


async def stream_ids(redis: streams.Redis, keys: Keys) -> list[str]:
    entries: Any = await redis.xrange(keys.stream(Priority.DEFAULT))
    return [decode(fields).instance_id for _, fields in entries]


async def test_concurrent_emits_share_batches(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    outbox = Outbox(store, redis, keys)
    batch = news(60)
    with statements(store, ("INSERT INTO TASK_INSTANCES",)) as inserts:
        emitted = await asyncio.gather(*(outbox.emit(n, now_ms=T0) for n in batch))

    assert [e.outcome for e in emitted] == ["published"] * 60
    assert [e.instance_id for e in emitted] == [n.id for n in batch]
    assert 1 <= len(inserts) <= 3  # the first emit alone, then the rest together
    assert sorted(await stream_ids(redis, keys)) == sorted(n.id for n in batch)
    for new in batch:
        row = await store.get_instance(new.id)
        assert row is not None and row.status is Status.DISPATCHED
        history = [(h.from_status, h.to_status) for h in await store.history(new.id)]
        assert history == [(None, Status.PENDING), (Status.PENDING, Status.DISPATCHED)]


async def test_duplicates_in_and_across_batches_publish_once(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    outbox = Outbox(store, redis, keys)
    first, second = news(2)
    await outbox.emit(first, now_ms=T0)
    twin = dataclasses.replace(second, id="i_twin")  # same dedupe key, other id
    emitted = await asyncio.gather(
        outbox.emit(first, now_ms=T0),
        outbox.emit(second, now_ms=T0),
        outbox.emit(twin, now_ms=T0),
    )
    assert [(e.outcome, e.instance_id, e.status) for e in emitted] == [
        ("duplicate", first.id, Status.DISPATCHED),
        ("published", second.id, Status.DISPATCHED),
        ("duplicate", second.id, Status.DISPATCHED),
    ]
    assert sorted(await stream_ids(redis, keys)) == sorted([first.id, second.id])
    assert await store.get_instance("i_twin") is None


async def test_a_batch_redis_refused_is_answered_unpublished_and_left_pending(
    store: SqlStore, keys: Keys
) -> None:
    """Created, then the XADDs fail: every caller learns its instance exists but is not on a
    stream (so it records it rather than emitting again); the rows stay PENDING for the
    reconciler."""
    dead = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    outbox = Outbox(store, dead, keys)
    batch = news(5)
    try:
        results = await asyncio.gather(*(outbox.emit(n, now_ms=T0) for n in batch))
    finally:
        await dead.aclose()
    assert [(r.outcome, r.instance_id, r.status) for r in results] == [
        ("unpublished", n.id, Status.PENDING) for n in batch
    ]
    for new in batch:
        row = await store.get_instance(new.id)
        assert row is not None and row.status is Status.PENDING


async def test_a_batch_the_store_refused_reaches_every_caller_and_writes_nothing(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    nobody = SqlStore(make_engine(normalize_url(NOBODY)), display_url=NOBODY)
    outbox = Outbox(nobody, redis, keys)
    batch = news(5)
    try:
        results = await asyncio.gather(
            *(outbox.emit(n, now_ms=T0) for n in batch), return_exceptions=True
        )
    finally:
        await nobody.close()
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert await stream_ids(redis, keys) == []
    assert await store.list_instances(limit=10) == []


async def test_a_batch_whose_dispatched_step_failed_is_still_answered_published(
    redis: streams.Redis, keys: Keys
) -> None:
    """Created and on the stream, then the CAS to DISPATCHED fails (its UPDATE waits for this
    test's lock on the table and its connection is killed; MariaDB): the caller learns its
    instance is published, still PENDING, so it records it instead of emitting it again."""
    async with temp_database("mariadb") as url:
        store = await SqlStore.connect(url)
        try:
            [new] = news(1)
            emitted = await _emit_with_failing_dispatch(Outbox(store, redis, keys), store, new)
            row = await store.get_instance(new.id)
        finally:
            await store.close()
    assert (emitted.outcome, emitted.instance_id, emitted.status) == (
        "published",
        new.id,
        Status.PENDING,
    )
    assert row is not None and row.status is Status.PENDING
    assert await stream_ids(redis, keys) == [new.id]


async def _emit_with_failing_dispatch(outbox: Outbox, store: SqlStore, new: NewInstance) -> Any:
    """Emit `new` while this test holds its key (an uncommitted row with its id), queue a lock
    of `task_instances` behind the creation's own, let the creation commit, then kill the
    outbox's CAS UPDATE that waits for that lock."""
    async with store.engine.connect() as row, store.engine.connect() as table:
        values = instance_values(new) | {"created_at_ms": T0, "updated_at_ms": T0}
        await row.execute(insert(task_instances).values(values))
        emitting = asyncio.create_task(outbox.emit(new, now_ms=T0))
        await _waiting(row, "INSERT INTO task_instances%")
        locking = asyncio.create_task(table.execute(text("LOCK TABLES task_instances WRITE")))
        await _waiting(row, "LOCK TABLES task_instances%")
        await row.rollback()
        await locking
        await kill_waiter(row, "UPDATE task_instances%", release=False)
        await table.execute(text("UNLOCK TABLES"))
    return await emitting


async def _waiting(conn: AsyncConnection, head: str) -> None:
    async def found() -> bool:
        return bool((await conn.execute(RUNNING, {"head": head})).all())

    await until(found)


async def test_a_cancelled_caller_does_not_stop_its_batch(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    outbox = Outbox(store, redis, keys)
    batch = news(10)
    tasks = [asyncio.create_task(outbox.emit(n, now_ms=T0)) for n in batch]
    await asyncio.sleep(0)  # every emit is queued and the batch writer has started
    tasks[3].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[3], asyncio.CancelledError)
    assert sorted(await stream_ids(redis, keys)) == sorted(n.id for n in batch)
    for new in batch:
        row = await store.get_instance(new.id)
        assert row is not None and row.status is Status.DISPATCHED


@pytest.mark.parametrize("count", [1, 250])
async def test_batches_are_cut_at_the_chunk_size(
    store: SqlStore, redis: streams.Redis, keys: Keys, count: int
) -> None:
    outbox = Outbox(store, redis, keys)
    emitted = await asyncio.gather(*(outbox.emit(n, now_ms=T0) for n in news(count)))
    assert {e.outcome for e in emitted} == {"published"}
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == count


async def test_emits_arriving_at_any_step_of_a_batch_are_written(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Emits start while earlier batches are at every step (creating, publishing, the CAS
    step, or the writer about to finish); none is left waiting."""
    outbox = Outbox(store, redis, keys)
    batch = news(40)
    rng = random.Random(7)
    tasks = []
    for new in batch:
        tasks.append(asyncio.create_task(outbox.emit(new, now_ms=T0)))
        for _ in range(rng.randrange(0, 30)):
            await asyncio.sleep(0)
    emitted = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert {e.outcome for e in emitted} == {"published"}
    assert sorted(await stream_ids(redis, keys)) == sorted(n.id for n in batch)


async def test_an_emit_during_the_last_cas_step_is_written(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second emit arrives while the writer waits for the first batch's CAS step with
    nothing else queued: the writer, not a second one, writes it once that step is done. The
    store's CAS step is held (then run for real) until the second emit is queued."""
    outbox = Outbox(store, redis, keys)
    first, second = news(2)
    real = store.dispatch_many
    in_cas, release = asyncio.Event(), asyncio.Event()

    async def held(requests: list[DispatchRequest]) -> dict[str, CasResult]:
        if not in_cas.is_set():
            in_cas.set()
            await release.wait()
        return await real(requests)

    monkeypatch.setattr(store, "dispatch_many", held)
    writing = asyncio.create_task(outbox.emit(first, now_ms=T0))
    await asyncio.wait_for(in_cas.wait(), timeout=10)
    queued = asyncio.create_task(outbox.emit(second, now_ms=T0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not writing.done() and not queued.done()
    release.set()
    emitted = await asyncio.wait_for(queued, timeout=10)
    assert emitted.outcome == "published"
    assert (await writing).outcome == "published"
    assert sorted(await stream_ids(redis, keys)) == sorted([first.id, second.id])


async def test_emits_whose_entries_an_executor_claims_first_are_dispatched_once(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor reads a batch's entries and claims the rows before the outbox's CAS to
    DISPATCHED: the claim completes that step (`seen_on_stream`), the outbox's CAS finds the
    rows claimed, and the emits are answered published. Each row has one move to DISPATCHED,
    and the next batch, which no executor outruns, is dispatched by the outbox itself."""
    await streams.ensure_groups(redis, keys)
    outbox = Outbox(store, redis, keys)
    real = store.dispatch_many
    lost: list[dict[str, CasResult]] = []

    async def claimed_first(requests: list[DispatchRequest]) -> dict[str, CasResult]:
        read = await streams.read(redis, keys, "exec-1", count=len(requests), block_ms=1000)
        entries = [decode(d.fields) for d in read]
        claims = [ClaimRequest(e.instance_id, e.attempt, 30) for e in entries]
        won = await store.claim_many(claims, owner="exec-1")
        assert sorted(won) == sorted(r.instance_id for r in requests)
        lost.append(await real(requests))
        return lost[-1]

    raced, later = news(4)[:3], news(4)[3]
    monkeypatch.setattr(store, "dispatch_many", claimed_first)
    emitted = await asyncio.gather(*(outbox.emit(n, now_ms=T0) for n in raced))
    monkeypatch.setattr(store, "dispatch_many", real)
    after = await outbox.emit(later, now_ms=T0)

    assert [(e.outcome, e.status) for e in emitted] == [("published", Status.DISPATCHED)] * 3
    assert [set(r.values()) for r in lost] == [{CasResult(ok=False, found=Status.RUNNING)}]
    for new in raced:
        steps = [
            (h.from_status, h.to_status, h.attempt, h.reason) for h in await store.history(new.id)
        ]
        assert steps[1:] == [
            (Status.PENDING, Status.DISPATCHED, 0, "seen_on_stream"),
            (Status.DISPATCHED, Status.RUNNING, 1, "claimed"),
        ]
    assert (after.outcome, after.status) == ("published", Status.DISPATCHED)
    last = (await store.history(later.id))[-1]
    assert (last.to_status, last.reason) == (Status.DISPATCHED, "published")


async def test_publish_many_adds_every_entry_and_dispatches_the_waiting_rows(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    pending, retrying, dispatched = news(3)
    for new in (pending, retrying, dispatched):
        await store.create_instance(new)
    await store.transition(dispatched.id, Status.PENDING, Status.DISPATCHED, reason="setup")
    for src, dst in (
        (Status.PENDING, Status.DISPATCHED),
        (Status.DISPATCHED, Status.RUNNING),
        (Status.RUNNING, Status.RETRYING),
    ):
        await store.transition(retrying.id, src, dst, reason="setup")
    rows = [await store.get_instance(n.id) for n in (pending, retrying, dispatched)]
    await Outbox(store, redis, keys).publish_many([r for r in rows if r is not None], now_ms=T0)

    assert sorted(await stream_ids(redis, keys)) == sorted([pending.id, retrying.id, dispatched.id])
    for new in (pending, retrying, dispatched):
        row = await store.get_instance(new.id)
        assert row is not None and row.status is Status.DISPATCHED
    assert len(await store.history(dispatched.id)) == 2  # only published again: no CAS
    last = (await store.history(retrying.id))[-1]
    assert (last.from_status, last.reason) == (Status.RETRYING, "published")


async def test_a_row_that_moved_on_before_its_dispatch_step_is_noted_at_debug_only(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """An executor that reads the entry first completes the PENDING -> DISPATCHED step itself;
    the publisher's own CAS then loses. That is routine, so one-shot commands such as `trigger`
    must not print it at the default level."""
    [new] = news(1)
    await store.create_instance(new)
    stale = await store.get_instance(new.id)
    assert stale is not None
    await store.transition(new.id, Status.PENDING, Status.DISPATCHED, reason="claimed first")
    with capture_logs() as logs:
        await Outbox(store, redis, keys).publish_many([stale], now_ms=T0)
    lost = [e for e in logs if e["event"] == "instance.dispatch_cas_lost"]
    assert [(e["log_level"], e["instance_id"], e["found"]) for e in lost] == [
        ("debug", new.id, Status.DISPATCHED)
    ]


NUL_KEY_SPEC = parse_task_file_text(
    """
tasks:
  - id: nul
    agent: echo
    schedule: {cron: "* * * * *", timezone: UTC}
""",
    "t.yaml",
).tasks[0]


def nul_key_instance() -> NewInstance:
    """An instance whose dedupe key holds a NUL, which PostgreSQL's text refuses (a task
    file can no longer give one: its key is refused at validation)."""
    new = new_instance(NUL_KEY_SPEC, T0)
    key = new.dedupe_key + ":a\x00b"
    return dataclasses.replace(new, dedupe_key=key, id=instance_id_for(key))


async def test_an_instance_the_store_refuses_fails_its_own_emit_only(
    redis: streams.Redis, keys: Keys
) -> None:
    """Emits batched with one the store refuses (PostgreSQL: a dedupe key holding a NUL)
    are created and published; only the refused one's caller gets the error. Else every
    task firing with such a task would fail its ticks with it, pass after pass."""
    if "postgres" not in available_kinds():
        pytest.skip("PostgreSQL is not reachable")
    bad = nul_key_instance()
    batch = [*news(2), bad, *news(4)[2:]]
    async with temp_database("postgres") as url:
        store = await SqlStore.connect(url)
        try:
            outbox = Outbox(store, redis, keys)
            results = await asyncio.gather(
                *(outbox.emit(n, now_ms=T0) for n in batch), return_exceptions=True
            )
            good = [n for n in batch if n is not bad]
            for new, result in zip(batch, results, strict=True):
                if new is bad:
                    assert isinstance(result, StoreRefused), result
                else:
                    assert isinstance(result, Emitted) and result.outcome == "published", result
            assert sorted(await stream_ids(redis, keys)) == sorted(n.id for n in good)
            assert await store.get_instance(bad.id) is None
        finally:
            await store.close()
