"""Instances: inserts guarded by the UNIQUE dedupe key (also under concurrent inserts from
several connections), reads, filters, counts and history order."""

from __future__ import annotations

import asyncio
import dataclasses

from sqlalchemy import func, select, update

from taskstream.core.errors import StoreRefused
from taskstream.core.states import Status
from taskstream.core.store.port import CreateResult, InstanceRow, StatusCounts
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import instance_history, task_instances
from tests.contract.conftest import Advance, MakeNew


async def test_create_inserts_pending_row_and_first_history_row(
    store: SqlStore, make_new: MakeNew
) -> None:
    new = dataclasses.replace(
        make_new("a"),
        business_date="2024-03-01",
        not_before_ms=1_700_000_100_000,
        deadline_ms=1_700_000_900_000,
        priority="high",
        payload={"text": "naïve ☃ 😀", "nested": {"b": 1, "a": [True, None]}},
        reason="manual trigger",
    )

    created = await store.create_instance(new)

    assert created == CreateResult(created=True, instance_id="inst-a")
    row = await store.get_instance("inst-a")
    assert row is not None
    assert row == InstanceRow(
        id="inst-a",
        task_id="report",
        agent="echo",
        dedupe_key="report:a",
        status=Status.PENDING,
        attempt=0,
        max_attempts=3,
        priority="high",
        scheduled_for_ms=1_700_000_000_000,
        business_date="2024-03-01",
        payload=new.payload,
        result=None,
        context={},
        fail_class=None,
        last_error=None,
        lease_owner=None,
        lease_expires_at_ms=None,
        not_before_ms=1_700_000_100_000,
        deadline_ms=1_700_000_900_000,
        next_attempt_at_ms=None,
        trace_id="trace-a",
        created_at_ms=row.created_at_ms,
        updated_at_ms=row.created_at_ms,
    )
    [first] = await store.history("inst-a")
    assert (first.from_status, first.to_status, first.attempt, first.reason) == (
        None,
        Status.PENDING,
        0,
        "manual trigger",
    )
    assert first.at_ms == row.created_at_ms


async def test_create_skipped_is_never_seen_pending(store: SqlStore, make_new: MakeNew) -> None:
    """A record-only instance (a missed tick) is created and moved to SKIPPED in one
    transaction; a duplicate key writes nothing."""
    outcome = await store.create_instance(make_new("m"), skipped="missed")

    assert outcome == CreateResult(created=True, instance_id="inst-m")
    row = await store.get_instance("inst-m")
    assert row is not None and row.status is Status.SKIPPED
    history = await store.history("inst-m")
    assert [(h.from_status, h.to_status, h.reason) for h in history][-1] == (
        Status.PENDING,
        Status.SKIPPED,
        "missed",
    )
    assert len(history) == 2
    again = await store.create_instance(make_new("m"), skipped="missed")
    assert again == CreateResult(created=False, instance_id="inst-m")
    assert len(await store.history("inst-m")) == 2


async def test_duplicate_dedupe_key_returns_the_existing_id(
    store: SqlStore, make_new: MakeNew
) -> None:
    await store.create_instance(make_new("a"))
    again = dataclasses.replace(make_new("a"), id="inst-other", payload={"x": 1})

    outcome = await store.create_instance(again)

    assert outcome == CreateResult(created=False, instance_id="inst-a")
    assert await store.get_instance("inst-other") is None
    assert len(await store.history("inst-a")) == 1


async def test_keys_differing_only_by_trailing_spaces_are_distinct(
    store: SqlStore, make_new: MakeNew
) -> None:
    """Ids and dedupe keys compare byte for byte on every dialect: a PAD SPACE collation
    (MariaDB's utf8mb4_bin) would take "report:acme " for a duplicate of "report:acme"."""
    plain, spaced = make_new("acme"), make_new("acme ")

    assert await store.create_instance(plain) == CreateResult(True, "inst-acme")
    assert await store.create_instance(spaced) == CreateResult(True, "inst-acme ")

    found = await store.get_instance("inst-acme ")
    assert found is not None and found.dedupe_key == "report:acme "
    assert len(await store.history("inst-acme")) == 1
    assert await store.get_instance("inst-acme  ") is None


async def test_duplicate_id_is_not_a_second_row(store: SqlStore, make_new: MakeNew) -> None:
    await store.create_instance(make_new("a"))
    same_id = dataclasses.replace(make_new("b"), id="inst-a")

    outcome = await store.create_instance(same_id)

    assert outcome == CreateResult(created=False, instance_id="inst-a")
    assert await store.list_instances() == [await store.get_instance("inst-a")]


async def test_concurrent_inserts_of_one_dedupe_key_create_exactly_one_row(
    db_url: str, make_new: MakeNew
) -> None:
    stores = [await SqlStore.connect(db_url) for _ in range(4)]
    try:
        racers = [dataclasses.replace(make_new("race"), id=f"inst-race-{i}") for i in range(20)]
        outcomes = await asyncio.gather(
            *(stores[i % len(stores)].create_instance(new) for i, new in enumerate(racers))
        )
        async with stores[0].engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(task_instances))).scalar()
            hist = (await conn.execute(select(func.count()).select_from(instance_history))).scalar()
    finally:
        for opened in stores:
            await opened.close()

    winners = [o for o in outcomes if o.created]
    assert len(winners) == 1
    assert {o.instance_id for o in outcomes} == {winners[0].instance_id}
    assert (rows, hist) == (1, 1)


async def test_missing_instance_reads_as_none(store: SqlStore) -> None:
    assert await store.get_instance("missing") is None
    assert await store.history("missing") == []


async def test_list_filters_orders_and_limits(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    for i, name in enumerate(["c", "a", "b"]):
        new = dataclasses.replace(make_new(name), scheduled_for_ms=1_000 * (3 - i))
        await store.create_instance(new)
    other = dataclasses.replace(make_new("z"), task_id="other", scheduled_for_ms=0)
    await store.create_instance(other)
    await advance("inst-a", Status.DISPATCHED)

    assert [r.id for r in await store.list_instances()] == [
        "inst-z",
        "inst-b",
        "inst-a",
        "inst-c",
    ]
    assert [r.id for r in await store.list_instances(task_id="report")] == [
        "inst-b",
        "inst-a",
        "inst-c",
    ]
    pending = await store.list_instances(task_id="report", status=Status.PENDING)
    assert [r.id for r in pending] == ["inst-b", "inst-c"]
    assert [r.id for r in await store.list_instances(status=Status.DISPATCHED)] == ["inst-a"]
    assert [r.id for r in await store.list_instances(limit=2)] == ["inst-z", "inst-b"]
    assert await store.list_instances(task_id="none") == []


async def test_count_by_status_names_every_status(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    assert await store.count_by_status() == StatusCounts(dict.fromkeys(Status, 0), ())
    for name in ["a", "b", "c"]:
        await store.create_instance(make_new(name))
    await advance("inst-a", Status.SUCCESS)
    await advance("inst-b", Status.SKIPPED)

    counts = await store.count_by_status()

    assert counts.counts == {
        **dict.fromkeys(Status, 0),
        Status.PENDING: 1,
        Status.SUCCESS: 1,
        Status.SKIPPED: 1,
    }
    assert counts.unreadable == ()


async def test_history_is_in_commit_order(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.SUCCESS)

    steps = [(h.from_status, h.to_status) for h in await store.history("inst-a")]

    assert steps == [
        (None, Status.PENDING),
        (Status.PENDING, Status.DISPATCHED),
        (Status.DISPATCHED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]
    times = [h.at_ms for h in await store.history("inst-a")]
    assert times == sorted(times)


async def test_update_that_changes_no_value_still_counts_as_matched(
    store: SqlStore, make_new: MakeNew
) -> None:
    # MySQL reports changed rows unless the FOUND_ROWS flag is set; CAS relies on matched rows.
    await store.create_instance(make_new("a"))
    noop = (
        update(task_instances)
        .where(task_instances.c.id == "inst-a")
        .values(priority=task_instances.c.priority)
    )

    async with store.engine.begin() as conn:
        result = await conn.execute(noop)

    assert result.rowcount == 1


async def test_an_id_no_store_can_hold_is_not_found_or_refused_never_a_driver_error(
    store: SqlStore,
) -> None:
    """A lone surrogate (bytes that are not UTF-8, from a command line): MariaDB finds no
    such instance; SQLite's driver and PostgreSQL refuse the text, as `StoreRefused`."""
    try:
        found = await store.get_instance("a\udcffb")
    except StoreRefused:
        return
    assert found is None
