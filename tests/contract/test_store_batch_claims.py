"""Batches of claims and lease extensions: `claim_many` keeps the single-row rules (CAS on
(id, status, attempt), one history row per win) and wins each row at most once, also when two
callers race and across chunks; `extend_leases` extends only the leases still held, returns
them, and changes nothing else."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from sqlalchemy import func, select

from taskstream.core.states import Status
from taskstream.core.store import sql_chunks
from taskstream.core.store.port import CasResult, ClaimRequest, DispatchRequest
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import instance_history, task_instances
from tests.contract.conftest import Advance, MakeNew
from tests.contract.store_batch_cases import _dispatched, _running, _seed


async def _count(store: SqlStore, table: Any, *where: Any) -> int:
    async with store.engine.connect() as conn:
        stmt = select(func.count()).select_from(table).where(*where)
        return int((await conn.execute(stmt)).scalar_one())


# claim_many


async def test_claim_many_completes_the_outbox_step_a_read_entry_proves(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """A claim names an entry that was read from a stream, so its XADD happened: a row still
    PENDING or RETRYING at that attempt (the outbox's CAS to DISPATCHED not landed yet) is
    moved on (`seen_on_stream`) and claimed in the same transaction; the outbox's CAS then
    finds it claimed."""
    await store.create_instance(make_new("pending"))
    await store.create_instance(make_new("retrying"))
    await advance("inst-retrying", Status.RUNNING)
    moved = await store.transition(
        "inst-retrying", Status.RUNNING, Status.RETRYING, reason="retry", next_attempt_at_ms=1
    )
    assert moved.ok
    retrying = await store.get_instance("inst-retrying")
    assert retrying is not None
    requests = [
        ClaimRequest("inst-pending", 0, 30),
        ClaimRequest("inst-retrying", retrying.attempt, 30),
    ]
    claimed = await store.claim_many(requests, owner="exec-1")
    assert set(claimed) == {"inst-pending", "inst-retrying"}
    for instance_id, src, token in (
        ("inst-pending", Status.PENDING, 1),
        ("inst-retrying", Status.RETRYING, retrying.attempt + 1),
    ):
        won = claimed[instance_id]
        assert won.row == await store.get_instance(instance_id)
        assert (won.token, won.row.status, won.row.next_attempt_at_ms) == (
            token,
            Status.RUNNING,
            None,
        )
        steps = [
            (h.from_status, h.to_status, h.attempt, h.owner, h.reason)
            for h in (await store.history(instance_id))[-2:]
        ]
        assert steps == [
            (src, Status.DISPATCHED, token - 1, None, "seen_on_stream"),
            (Status.DISPATCHED, Status.RUNNING, token, "exec-1", "claimed"),
        ]
    late = await store.dispatch_many([DispatchRequest("inst-pending", Status.PENDING, 0)])
    assert late == {"inst-pending": CasResult(ok=False, found=Status.RUNNING)}


async def test_claim_many_wins_exactly_the_matching_rows(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    a = await _dispatched(store, make_new, advance, "a")
    b = await _dispatched(store, make_new, advance, "b")
    stale = await _dispatched(store, make_new, advance, "stale")
    await store.create_instance(make_new("pending"))
    # Already claimed by this same owner: attempt is expected + 1, yet this batch did not win it.
    again, _ = await _running(store, make_new, advance, "again", owner="exec-1")
    untouched = {i: await store.get_instance(i) for i in (stale, "inst-pending", again)}
    requests = [
        ClaimRequest(a, 0, 30),
        ClaimRequest(b, 0, 60.5),
        ClaimRequest(stale, 5, 30),
        ClaimRequest("inst-pending", 5, 30),  # not the attempt its entry would be for
        ClaimRequest("inst-missing", 0, 30),
        ClaimRequest(again, 0, 30),
    ]

    before = await store.db_now_ms()
    claimed = await store.claim_many(requests, owner="exec-1")
    after = await store.db_now_ms()

    assert set(claimed) == {a, b}
    for instance_id, lease_ms in ((a, 30_000), (b, 60_500)):
        won = claimed[instance_id]
        assert won.row == await store.get_instance(instance_id)
        assert (won.token, won.row.status, won.row.attempt, won.row.lease_owner) == (
            1,
            Status.RUNNING,
            1,
            "exec-1",
        )
        assert won.lease_expires_at_ms == won.row.lease_expires_at_ms
        assert before + lease_ms <= won.lease_expires_at_ms <= after + lease_ms
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.to_status, last.attempt, last.owner, last.reason) == (
            Status.DISPATCHED,
            Status.RUNNING,
            1,
            "exec-1",
            "claimed",
        )
        assert last.at_ms == won.row.updated_at_ms
        assert await store.count_history(instance_id, reason="claimed") == 1
    for instance_id, row in untouched.items():
        assert await store.get_instance(instance_id) == row
    assert await store.count_history(again, reason="claimed") == 1


async def test_claim_many_edge_cases(store: SqlStore, make_new: MakeNew, advance: Advance) -> None:
    a = await _dispatched(store, make_new, advance, "a")
    row = await store.get_instance(a)

    assert await store.claim_many([], owner="x") == {}
    with pytest.raises(ValueError, match="lease_s"):
        await store.claim_many([ClaimRequest(a, 0, 30), ClaimRequest(a, 0, 0)], owner="x")
    assert await store.get_instance(a) == row

    # Named twice: the first request expecting the row's attempt wins, once.
    claimed = await store.claim_many([ClaimRequest(a, 7, 10), ClaimRequest(a, 0, 20)], owner="x")

    assert list(claimed) == [a]
    assert claimed[a].lease_expires_at_ms >= claimed[a].row.updated_at_ms + 20_000
    assert await store.count_history(a, reason="claimed") == 1


async def test_concurrent_claim_many_wins_each_id_once(store: SqlStore, db_url: str) -> None:
    ids = await _seed(store, (f"c{n:02d}" for n in range(50)))
    requests = [ClaimRequest(i, 0, 30) for i in ids]
    other = await SqlStore.connect(db_url)
    try:
        one, two = await asyncio.gather(
            store.claim_many(requests, owner="one"),
            other.claim_many(requests[::-1], owner="two"),
        )
    finally:
        await other.close()

    assert set(one).isdisjoint(two)
    assert set(one) | set(two) == set(ids)
    for winners, owner in ((one, "one"), (two, "two")):
        assert all(c.row.lease_owner == owner and c.token == 1 for c in winners.values())
    claimed = instance_history.c.reason == "claimed"
    assert await _count(store, instance_history, claimed) == 50


async def test_claim_many_spans_chunks(store: SqlStore) -> None:
    count = 2 * sql_chunks.CHUNK + 50
    ids = await _seed(store, (f"c{n:04d}" for n in range(count)))
    requests = [ClaimRequest(i, 0, 30) for i in ids] + [ClaimRequest("inst-none", 0, 30)]

    claimed = await store.claim_many(requests[::-1], owner="x")

    assert set(claimed) == set(ids)
    assert await _count(store, instance_history, instance_history.c.reason == "claimed") == count
    running = task_instances.c.status == Status.RUNNING.value
    assert await _count(store, task_instances, running, task_instances.c.attempt == 1) == count


# extend_leases


async def test_extend_leases_extends_and_returns_only_held_rows(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    held, token = await _running(store, make_new, advance, "held")
    stale, stale_token = await _running(store, make_new, advance, "stale")
    waiting = await _dispatched(store, make_new, advance, "waiting")
    before = {i: await store.get_instance(i) for i in (held, stale, waiting)}
    history = {i: await store.history(i) for i in (held, stale, waiting)}

    assert await store.extend_leases([], lease_s=600) == set()
    now = await store.db_now_ms()
    still = await store.extend_leases(
        [(held, token), (held, token - 1), (stale, stale_token + 1), (waiting, 0), ("gone", 1)],
        lease_s=600,
    )

    assert still == {(held, token)}
    row, old = await store.get_instance(held), before[held]
    assert row is not None
    assert old is not None
    assert row.lease_expires_at_ms is not None
    assert row.lease_expires_at_ms >= now + 600_000
    assert dataclasses.replace(row, lease_expires_at_ms=old.lease_expires_at_ms) == old
    for instance_id in (stale, waiting):
        assert await store.get_instance(instance_id) == before[instance_id]
    for instance_id, rows in history.items():
        assert await store.history(instance_id) == rows
    with pytest.raises(ValueError, match="lease_s"):
        await store.extend_leases([(held, token)], lease_s=0)
