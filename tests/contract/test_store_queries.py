"""Work finding and bookkeeping reads: due retries and stale rows come oldest first and
filtered exactly; side effects, history reasons and the review queue answer from the store."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select, update

from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import review_queue, task_instances
from tests.contract.conftest import Advance, MakeNew


async def _retrying(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str, due_ms: int
) -> str:
    await store.create_instance(make_new(name))
    await advance(f"inst-{name}", Status.RUNNING)
    moved = await store.transition(
        f"inst-{name}", Status.RUNNING, Status.RETRYING, reason="retry", next_attempt_at_ms=due_ms
    )
    assert moved.ok
    return f"inst-{name}"


async def _set_updated(store: SqlStore, instance_id: str, updated_at_ms: int) -> None:
    async with store.engine.begin() as conn:
        stmt = update(task_instances).where(task_instances.c.id == instance_id)
        await conn.execute(stmt.values(updated_at_ms=updated_at_ms))


async def _reviews(store: SqlStore, instance_id: str) -> list[tuple[str, int | None]]:
    stmt = (
        select(review_queue.c.reason, review_queue.c.resolved_at_ms)
        .where(review_queue.c.instance_id == instance_id)
        .order_by(review_queue.c.id)
    )
    async with store.engine.connect() as conn:
        return [(r.reason, r.resolved_at_ms) for r in (await conn.execute(stmt)).all()]


async def test_due_retries_are_retrying_rows_due_by_now_earliest_first(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    for name, due_ms in (("a", 3_000), ("b", 1_000), ("c", 2_000), ("d", 2_000), ("e", 9_000)):
        await _retrying(store, make_new, advance, name, due_ms)
    await store.create_instance(make_new("f"))
    await advance("inst-f", Status.DISPATCHED)
    await store.create_instance(make_new("g"))
    await advance("inst-g", Status.RUNNING)
    # A FAILED row that still carries a due time is not a retry.
    failed = await store.transition(
        "inst-g",
        Status.RUNNING,
        Status.FAILED,
        reason="x",
        fail_class=FailClass.FATAL,
        next_attempt_at_ms=1,
    )
    assert failed.ok

    due = await store.due_retries(now_ms=3_000, limit=10)

    assert [r.id for r in due] == ["inst-b", "inst-c", "inst-d", "inst-a"]
    assert all(isinstance(r, InstanceRow) and r.status is Status.RETRYING for r in due)
    assert [r.id for r in await store.due_retries(now_ms=3_000, limit=2)] == ["inst-b", "inst-c"]
    assert await store.due_retries(now_ms=999, limit=10) == []
    assert await store.due_retries(now_ms=3_000, limit=0) == []
    # Paging: past (due time, id), ties on the due time broken by id.
    after_c = await store.due_retries(now_ms=3_000, limit=10, after=(2_000, "inst-c"))
    assert [r.id for r in after_c] == ["inst-d", "inst-a"]
    assert await store.due_retries(now_ms=3_000, limit=10, after=(3_000, "inst-a")) == []


async def test_stale_rows_are_filtered_by_status_and_age_oldest_first(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    states = {
        "a": (Status.DISPATCHED, 5_000),
        "b": (Status.RUNNING, 2_000),
        "c": (Status.DISPATCHED, 2_000),
        "d": (Status.DISPATCHED, 10_000),  # updated exactly at the bound: not stale
        "e": (Status.SUCCESS, 1_000),
        "f": (Status.PENDING, 1_000),
    }
    for name, (status, updated_ms) in states.items():
        await store.create_instance(make_new(name))
        await advance(f"inst-{name}", status)
        await _set_updated(store, f"inst-{name}", updated_ms)
    wanted = [Status.DISPATCHED, Status.RUNNING]

    found = await store.stale(wanted, updated_before_ms=10_000, limit=10)

    assert [(r.id, r.updated_at_ms) for r in found] == [
        ("inst-b", 2_000),
        ("inst-c", 2_000),
        ("inst-a", 5_000),
    ]
    assert [r.id for r in await store.stale(wanted, updated_before_ms=10_000, limit=1)] == [
        "inst-b"
    ]
    assert await store.stale([], updated_before_ms=10_000, limit=10) == []
    pending = await store.stale([Status.PENDING], updated_before_ms=10_000, limit=10)
    assert [r.id for r in pending] == ["inst-f"]
    # Paging on from a row seen: ties on the time are ordered by id.
    pages = [
        await store.stale(wanted, updated_before_ms=10_000, limit=1, after=after)
        for after in ((2_000, "inst-b"), (2_000, "inst-c"), (5_000, "inst-a"))
    ]
    assert [[r.id for r in page] for page in pages] == [["inst-c"], ["inst-a"], []]


async def test_side_effect_done_only_for_committed_keys(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    claim = await store.claim("inst-a", expected_attempt=0, owner="x", lease_s=30)
    assert claim is not None
    fenced = await store.finish(
        "inst-a", token=claim.token + 1, dst=Status.SUCCESS, reason="late", side_effects=["k:z"]
    )
    assert not fenced.ok

    done = await store.finish(
        "inst-a", token=claim.token, dst=Status.SUCCESS, reason="ok", side_effects=["k:1"]
    )

    assert done.ok
    assert await store.side_effect_done("k:1")
    assert not await store.side_effect_done("k:z")
    assert not await store.side_effect_done("K:1")


async def test_count_history_counts_rows_with_the_reason(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await store.create_instance(make_new("a"))
    await store.create_instance(make_new("b"))
    long_reason = "r" * 600
    for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.TIMEOUT)):
        assert (await store.transition("inst-a", src, dst, reason=long_reason)).ok
    await advance("inst-b", Status.DISPATCHED)

    assert await store.count_history("inst-a", reason=long_reason) == 2
    assert await store.count_history("inst-a", reason="scheduled") == 1
    assert await store.count_history("inst-a", reason="setup") == 0
    assert await store.count_history("inst-b", reason="setup") == 1
    assert await store.count_history("inst-missing", reason="scheduled") == 0


async def test_add_review_queues_an_instance_once_until_resolved(
    store: SqlStore, db_url: str, make_new: MakeNew
) -> None:
    await store.create_instance(make_new("a"))
    other = await SqlStore.connect(db_url)
    try:
        await asyncio.gather(
            *(s.add_review("inst-a", f"low quality {n}") for n in range(3) for s in (store, other))
        )
    finally:
        await other.close()

    assert len(await _reviews(store, "inst-a")) == 1
    async with store.engine.begin() as conn:
        await conn.execute(update(review_queue).values(resolved_at_ms=5, resolved_by="ops"))
    await store.add_review("inst-a", "again")
    await store.add_review("inst-a", "and again")
    await store.add_review("inst-missing", "ghost")

    reviews = await _reviews(store, "inst-a")
    assert [resolved for _, resolved in reviews] == [5, None]
    assert reviews[1][0] == "again"
    async with store.engine.connect() as conn:
        total = (await conn.execute(select(func.count()).select_from(review_queue))).scalar_one()
    assert total == 2


async def test_histories_answer_for_many_instances_as_history_does_for_each(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """Over a chunk of ids (`CHUNK` = 200) too: each id gets its own rows, oldest first, and
    an id without history (no such instance) is left out."""
    names = [f"h{n}" for n in range(203)]
    await store.create_instances([make_new(name) for name in names])
    await advance("inst-h0", Status.RUNNING)
    await advance("inst-h202", Status.DISPATCHED)
    ids = [f"inst-{name}" for name in names]
    got = await store.histories([*reversed(ids), "inst-none", "inst-h0"])
    assert set(got) == set(ids)
    for instance_id in ("inst-h0", "inst-h1", "inst-h202"):
        assert got[instance_id] == await store.history(instance_id)
    assert [h.to_status for h in got["inst-h0"]][-2:] == [Status.DISPATCHED, Status.RUNNING]
    assert await store.histories([]) == {}


async def _failed(store: SqlStore, advance: Advance, name: str, fail_class: FailClass) -> str:
    await advance(f"inst-{name}", Status.DISPATCHED)
    moved = await store.transition(
        f"inst-{name}", Status.DISPATCHED, Status.FAILED, reason="x", fail_class=fail_class
    )
    assert moved.ok
    return f"inst-{name}"


async def test_poisoned_rows_are_failed_poison_ones_latest_failure_first(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """The rows `dead list` looks through for letters Redis lost: FAILED `poison` only (not
    another class, not one requeued since), the latest failure first, ties by id."""
    classes = {
        "a": (FailClass.POISON, 2_000),
        "b": (FailClass.POISON, 5_000),
        "c": (FailClass.POISON, 2_000),
        "d": (FailClass.FATAL, 9_000),
        "e": (FailClass.POISON, 1_000),
        "f": (FailClass.POISON, 9_000),  # requeued below: PENDING now
    }
    await store.create_instances([make_new(name) for name in [*classes, "g"]])
    for name, (fail_class, updated_ms) in classes.items():
        await _failed(store, advance, name, fail_class)
        await _set_updated(store, f"inst-{name}", updated_ms)
    assert (await store.transition("inst-f", Status.FAILED, Status.PENDING, reason="requeued")).ok
    await advance("inst-g", Status.RUNNING)

    found = await store.poisoned(limit=10)

    assert [(r.id, r.updated_at_ms) for r in found] == [
        ("inst-b", 5_000),
        ("inst-c", 2_000),
        ("inst-a", 2_000),
        ("inst-e", 1_000),
    ]
    read = [r for r in found if isinstance(r, InstanceRow)]
    assert len(read) == len(found)
    assert all((r.status, r.fail_class) == (Status.FAILED, FailClass.POISON) for r in read)
    assert [r.id for r in await store.poisoned(limit=2)] == ["inst-b", "inst-c"]
    assert await store.poisoned(limit=0) == []
    # Paging on from a row seen: only rows that failed before it, ties by id.
    pages = [
        await store.poisoned(limit=1, before=before)
        for before in ((5_000, "inst-b"), (2_000, "inst-c"), (2_000, "inst-a"), (1_000, "inst-e"))
    ]
    assert [[r.id for r in page] for page in pages] == [["inst-c"], ["inst-a"], ["inst-e"], []]


async def _fail_for_review(store: SqlStore, instance_id: str, why: str) -> None:
    for src, dst in ((Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.RUNNING)):
        assert (await store.transition(instance_id, src, dst, reason="setup")).ok
    failed = await store.transition(
        instance_id,
        Status.RUNNING,
        Status.FAILED,
        reason="manual_review",
        fail_class=FailClass.MANUAL_REVIEW,
    )
    assert failed.ok
    await store.add_review(instance_id, why)


async def test_a_requeue_resolves_the_review_so_the_next_life_is_queued_again(
    store: SqlStore, make_new: MakeNew
) -> None:
    """An operator's requeue (FAILED -> PENDING) is their answer to the open review: it is
    resolved, by them. A review the new life asks for is then queued as a row of its own,
    where it used to be dropped as a duplicate of the old one."""
    await store.create_instance(make_new("a"))
    await _fail_for_review(store, "inst-a", "first look")
    requeued = await store.transition(
        "inst-a", Status.FAILED, Status.PENDING, reason="requeued", owner="alice"
    )
    assert requeued.ok
    stmt = select(review_queue.c.resolved_at_ms, review_queue.c.resolved_by)
    async with store.engine.connect() as conn:
        [(resolved_at_ms, resolved_by)] = (await conn.execute(stmt)).all()
    assert resolved_at_ms is not None and resolved_by == "alice"
    await _fail_for_review(store, "inst-a", "second look")
    reviews = await _reviews(store, "inst-a")
    assert [reason for reason, _ in reviews] == ["first look", "second look"]
    assert reviews[1][1] is None
