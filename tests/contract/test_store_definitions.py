"""Definitions (upsert outcomes, version, pause, cursor) and the explain log."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import insert

from taskstream.core.errors import StoreError
from taskstream.core.store import sql_codec as codec
from taskstream.core.store.port import DecisionRow, DefinitionRecord
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.tables import task_definitions
from taskstream.core.store.urls import normalize_url
from tests.support.refused_inserts import MESSAGE, refused_inserts


def _record(task_id: str, schedule: str, *, paused: bool = False) -> DefinitionRecord:
    spec = {"id": task_id, "agent": "echo", "schedule": {"cron": schedule, "timezone": "UTC"}}
    return DefinitionRecord(
        task_id=task_id, spec=spec, spec_hash=f"h-{task_id}-{schedule}", paused=paused
    )


def _decision(fire_time_ms: int, decision: str = "should_run", **kw: object) -> DecisionRow:
    return DecisionRow(
        task_id=str(kw.get("task_id", "report")),
        fire_time_ms=fire_time_ms,
        decision=decision,
        reason=str(kw.get("reason", "window open")),
        details={"window_s": 60, "late_ms": fire_time_ms % 7},
        instance_id=None if decision != "should_run" else f"inst-{fire_time_ms}",
        decided_at_ms=int(str(kw.get("decided_at_ms", 0))),
    )


async def test_upsert_reports_created_updated_unchanged(store: SqlStore) -> None:
    first = await store.upsert_definitions([_record("a", "0 9 * * *"), _record("b", "* * * * *")])
    second = await store.upsert_definitions([_record("a", "0 10 * * *"), _record("b", "* * * * *")])

    assert first == {"a": "created", "b": "created"}
    assert second == {"a": "updated", "b": "unchanged"}
    stored = await store.list_definitions()
    assert [(d.task_id, d.spec, d.spec_hash, d.paused) for d in stored] == [
        ("a", _record("a", "0 10 * * *").spec, "h-a-0 10 * * *", False),
        ("b", _record("b", "* * * * *").spec, "h-b-* * * * *", False),
    ]
    assert all(d.updated_at_ms > 0 for d in stored)
    assert await store.upsert_definitions([]) == {}


async def test_apply_writes_tasks_and_upstreams_in_one_transaction(store: SqlStore) -> None:
    """A failure on the upstreams, after the tasks' statements ran, stores neither: no task
    is left changed or created without the limits applied with it."""
    await store.upsert_definitions([_record("a", "0 9 * * *")])
    before = (await store.list_definitions(), await store.definitions_version())
    records = [_record("a", "0 10 * * *"), _record("b", "* * * * *")]
    limits = {"llm": {"limit": 5, "window": 10.0}}
    async with refused_inserts(store.engine, "upstreams"):
        with pytest.raises(StoreError, match=MESSAGE):
            await store.apply_definitions(records, limits)
    assert (await store.list_definitions(), await store.definitions_version()) == before
    assert await store.list_upstreams() == {}

    assert await store.apply_definitions(records, limits) == (
        {"a": "updated", "b": "created"},
        {"llm": "created"},
    )
    assert await store.list_upstreams() == {"llm": {"limit": 5, "window": 10.0}}


async def test_version_moves_on_every_change_and_only_then(store: SqlStore) -> None:
    empty = await store.definitions_version()
    await store.upsert_definitions([_record("a", "0 9 * * *")])
    created = await store.definitions_version()
    await store.upsert_definitions([_record("a", "0 9 * * *")])
    unchanged = await store.definitions_version()
    versions = [empty, created]
    for schedule in ["0 10 * * *", "0 11 * * *", "0 12 * * *"]:
        # Back-to-back edits may share a millisecond; each must still move the version.
        await store.upsert_definitions([_record("a", schedule)])
        versions.append(await store.definitions_version())
    await store.set_cursor("a", 123)
    after_cursor = await store.definitions_version()

    assert unchanged == created
    assert len(set(versions)) == len(versions)
    assert after_cursor == versions[-1]


async def test_pause_survives_reapply_and_moves_the_version(store: SqlStore) -> None:
    await store.upsert_definitions([_record("a", "0 9 * * *")])
    before = await store.definitions_version()

    assert await store.set_paused("a", True)
    paused = await store.definitions_version()
    await store.upsert_definitions([_record("a", "0 10 * * *", paused=False)])
    [record] = await store.list_definitions()
    assert await store.set_paused("a", False)

    assert paused != before
    assert record.paused
    assert [d.paused for d in await store.list_definitions()] == [False]
    assert not await store.set_paused("missing", True)


async def test_a_pause_of_a_paused_task_says_so_and_changes_nothing(store: SqlStore) -> None:
    """True when the flag changed, False when it was already so (the version does not
    move: nothing changed), None for a task that is not defined."""
    await store.upsert_definitions([_record("a", "0 9 * * *")])
    assert await store.set_paused("a", False) is False
    assert await store.set_paused("a", True) is True
    paused = await store.definitions_version()
    assert await store.set_paused("a", True) is False
    assert await store.definitions_version() == paused
    assert await store.set_paused("a", False) is True
    assert await store.set_paused("missing", True) is None
    assert await store.set_paused("missing", False) is None


async def test_created_paused_when_the_record_says_so(store: SqlStore) -> None:
    await store.upsert_definitions([_record("a", "0 9 * * *", paused=True)])

    assert [d.paused for d in await store.list_definitions()] == [True]


async def test_cursor_get_and_set(store: SqlStore) -> None:
    await store.upsert_definitions([_record("a", "0 9 * * *")])

    assert await store.get_cursor("a") is None
    await store.set_cursor("a", 1_700_000_000_000)
    assert await store.get_cursor("a") == 1_700_000_000_000
    await store.set_cursor("a", 1_700_000_060_000)
    assert await store.get_cursor("a") == 1_700_000_060_000
    await store.set_cursor("missing", 5)
    assert await store.get_cursor("missing") is None


async def test_decisions_are_recorded_and_listed_by_fire_time(store: SqlStore) -> None:
    for fire in [3_000, 1_000, 2_000]:
        await store.record_decision(_decision(fire))
    await store.record_decision(_decision(2_000, "skip_duplicated", reason="dedupe"))
    await store.record_decision(_decision(9_000, task_id="other", decided_at_ms=42))
    now = await store.db_now_ms()

    listed = await store.decisions("report")

    assert [(d.fire_time_ms, d.decision) for d in listed] == [
        (1_000, "should_run"),
        (2_000, "should_run"),
        (2_000, "skip_duplicated"),
        (3_000, "should_run"),
    ]
    assert listed[0].details == {"window_s": 60, "late_ms": 1_000 % 7}
    assert listed[0].instance_id == "inst-1000"
    assert listed[2].instance_id is None
    assert all(abs(d.decided_at_ms - now) < 5_000 for d in listed)
    assert [d.decided_at_ms for d in await store.decisions("other")] == [42]


async def test_decisions_since_and_limit(store: SqlStore) -> None:
    for fire in range(1_000, 6_000, 1_000):
        await store.record_decision(_decision(fire))

    since = await store.decisions("report", since_ms=2_000, limit=2)
    latest = await store.decisions("report", limit=2)

    assert [d.fire_time_ms for d in since] == [2_000, 3_000]
    assert [d.fire_time_ms for d in latest] == [4_000, 5_000]
    assert await store.decisions("report", since_ms=9_000) == []


async def test_cursor_writes_are_fenced_by_the_leader_token(store: SqlStore) -> None:
    await store.upsert_definitions([DefinitionRecord("fenced", {"id": "fenced"}, "h")])
    assert await store.set_cursor("fenced", 1000, token=5)
    assert await store.set_cursor("fenced", 2000, token=5)
    assert not await store.set_cursor("fenced", 3000, token=4)  # a stale leader
    assert await store.get_cursor("fenced") == 2000
    assert await store.set_cursor("fenced", 4000, token=6)
    assert not await store.set_cursor("nope", 1, token=9)


async def test_a_new_leader_claims_every_cursor_and_older_tokens_are_refused(
    store: SqlStore,
) -> None:
    await store.upsert_definitions(
        [DefinitionRecord(t, {"id": t}, "h") for t in ("fresh", "old", "ahead")]
    )
    version = await store.definitions_version()
    assert await store.set_cursor("old", 1000, token=3)
    assert await store.set_cursor("ahead", 1000, token=9)

    assert await store.claim_cursors(5) == 2  # "fresh" (never written) and "old"

    assert await store.definitions_version() == version  # not a definition change
    assert not await store.set_cursor("old", 2000, token=4)
    assert await store.get_cursor("old") == 1000
    assert await store.set_cursor("fresh", 2000, token=5)
    assert await store.max_cursor_token() == 9


async def test_decision_records_are_fenced_by_the_leader_token(store: SqlStore) -> None:
    await store.upsert_definitions([DefinitionRecord("report", {"id": "report"}, "h")])
    assert await store.record_decision(_decision(1_000), token=4)  # no token held yet
    await store.claim_cursors(5)

    assert not await store.record_decision(_decision(2_000), token=4)  # a stale leader
    assert await store.record_decision(_decision(3_000), token=5)
    assert await store.record_decision(_decision(4_000), token=6)
    assert await store.record_decision(_decision(5_000))  # manual: no token, not fenced

    fires = [d.fire_time_ms for d in await store.decisions("report", limit=10)]
    assert fires == [1_000, 3_000, 4_000, 5_000]


async def test_a_task_applied_after_a_takeover_is_fenced_from_older_leaders(
    store: SqlStore,
) -> None:
    await store.upsert_definitions([DefinitionRecord("report", {"id": "report"}, "h")])
    await store.claim_cursors(5)

    await store.upsert_definitions([DefinitionRecord("late", {"id": "late"}, "h")])

    assert not await store.record_decision(_decision(1_000, task_id="late"), token=4)
    assert await store.record_decision(_decision(2_000, task_id="late"), token=5)
    assert not await store.set_cursor("late", 2_000, token=4)


async def test_a_schedule_takes_effect_when_created_and_when_changed_only(
    store: SqlStore,
) -> None:
    """`schedule_from_ms` is when the stored schedule was applied: set at creation, moved by
    an apply that changes the `schedule`, kept by one that changes anything else, and by a
    pause."""
    await store.upsert_definitions([_record("a", "0 9 * * *")], now_ms=1_000)
    other = DefinitionRecord("a", {**_record("a", "0 9 * * *").spec, "timeout": 5}, "h-a-t")
    await store.upsert_definitions([other], now_ms=2_000)
    await store.set_paused("a", True)
    [kept] = await store.list_definitions()
    await store.upsert_definitions([_record("a", "0 10 * * *")], now_ms=3_000)
    [moved] = await store.list_definitions()
    await store.upsert_definitions([_record("b", "0 9 * * *")])
    db_now = await store.db_now_ms()
    [_, b] = await store.list_definitions()

    assert (kept.schedule_from_ms, kept.paused) == (1_000, True)
    assert moved.schedule_from_ms == 3_000
    assert b.schedule_from_ms is not None and db_now - 60_000 < b.schedule_from_ms <= db_now


async def test_applies_editing_the_same_tasks_in_other_orders_all_succeed(
    store: SqlStore, db_url: str
) -> None:
    """Each apply locked the rows it updated in its file's order, so two applies of the same
    stored tasks in opposite orders deadlocked on MariaDB, and one failed as "store
    unavailable". Every apply now takes one lock first, and the second waits."""
    other = await SqlStore.connect(db_url)
    ids = [f"t{i:03d}" for i in range(60)]
    try:
        await store.upsert_definitions([_record(t, "0 9 * * *") for t in ids])
        for n in range(5):
            forward = [_record(t, f"{n} 10 * * *") for t in ids]
            backward = [_record(t, f"{n} 11 * * *") for t in reversed(ids)]
            outcomes = await asyncio.gather(
                store.upsert_definitions(forward), other.upsert_definitions(backward)
            )
            assert [set(o.values()) for o in outcomes] == [{"updated"}, {"updated"}]
    finally:
        await other.close()


@pytest.mark.slow
async def test_a_file_of_more_tasks_than_a_driver_takes_parameters_applies(
    store: SqlStore, db_url: str
) -> None:
    """An apply read the stored definitions of its tasks with one bound parameter per task:
    with more than 32767 tasks PostgreSQL's driver refused it (as "store unavailable"), so a
    valid file could never be applied again. The read now goes by chunks of ids."""
    records = [_record(f"t{i:05d}", "0 9 * * *") for i in range(33_000)]
    rows = [
        {
            "task_id": r.task_id,
            "spec": codec.dumps(r.spec, what="spec"),
            "spec_hash": r.spec_hash,
            "paused": False,
            "created_at_ms": 1_000,
            "updated_at_ms": 1_000,
        }
        for r in records
    ]
    engine = make_engine(normalize_url(db_url))  # stored in bulk: one by one takes a minute
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(task_definitions), rows)
    finally:
        await engine.dispose()

    outcome = await store.upsert_definitions([*records, _record("new", "0 9 * * *")])

    assert len(outcome) == 33_001
    assert outcome.pop("new") == "created"
    assert set(outcome.values()) == {"unchanged"}
