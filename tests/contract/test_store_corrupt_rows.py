"""A row holding what taskstream never writes (JSON that does not parse, a status no state
machine has), say after a hand edit in SQL, is read as `StoreCorrupt` naming its table, row
and column, on every dialect; the row is left as it is."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from taskstream.core.errors import StoreCorrupt, StoreError
from taskstream.core.states import Status
from taskstream.core.store.port import DefinitionRecord, InstanceRow, UnreadableRow
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import Advance, MakeNew

CORRUPTIONS = [
    ("payload", "{not json"),
    ("context", "[1, 2"),
    ("status", "HALF_DONE"),
]


async def _corrupt(store: SqlStore, instance_id: str, column: str, value: str) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(
            text(f"UPDATE task_instances SET {column} = :v WHERE id = :id"),  # column: ours
            {"v": value, "id": instance_id},
        )


async def _listed(store: SqlStore) -> object:
    return await store.list_instances(task_id="report")


@pytest.mark.parametrize(("column", "value"), CORRUPTIONS)
async def test_a_row_that_cannot_be_read_is_named_not_a_traceback(
    store: SqlStore, make_new: MakeNew, column: str, value: str
) -> None:
    await store.create_instance(make_new("a"))
    await _corrupt(store, "inst-a", column, value)

    for read in (store.get_instance, _listed):
        with pytest.raises(StoreCorrupt) as raised:
            await read("inst-a") if read is store.get_instance else await _listed(store)
        assert isinstance(raised.value, StoreError)
        assert "task_instances" in str(raised.value)
        assert "'inst-a'" in str(raised.value) and column in str(raised.value)

    async with store.engine.connect() as conn:
        kept = (
            await conn.execute(text(f"SELECT {column} FROM task_instances WHERE id = 'inst-a'"))
        ).scalar_one()
    assert kept == value


async def test_a_stored_spec_that_is_not_json_is_named(store: SqlStore) -> None:
    spec = {"id": "t1", "agent": "echo"}
    await store.upsert_definitions([DefinitionRecord(task_id="t1", spec=spec, spec_hash="h")])
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE task_definitions SET spec = '{oops'"))
    with pytest.raises(StoreCorrupt, match=r"task_definitions row 't1': spec is not JSON"):
        await store.list_definitions()


async def test_an_apply_mends_a_stored_spec_that_is_not_json(store: SqlStore) -> None:
    record = DefinitionRecord(task_id="t1", spec={"id": "t1", "agent": "echo"}, spec_hash="h")
    await store.upsert_definitions([record])
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE task_definitions SET spec = '{oops', spec_hash = 'x'"))
    assert await store.upsert_definitions([record]) == {"t1": "updated"}
    [read] = await store.list_definitions()
    assert read.spec == record.spec


async def test_a_stored_upstream_config_that_is_not_an_object_is_named(store: SqlStore) -> None:
    await store.upsert_upstreams({"api": {"limit": 5, "window": 10}})
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE upstreams SET config = '[1]'"))
    with pytest.raises(StoreCorrupt, match=r"upstreams row 'api': config is not a JSON object"):
        await store.list_upstreams()


async def test_a_status_no_state_has_is_named_beside_the_counts_of_the_others(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """`taskstream status` counts instances by status: the rows of a status no state has are
    named, with one row that holds it and how many do, and every other status is counted."""
    for name in ("a", "b", "c", "d", "e"):
        await store.create_instance(make_new(name))
    await advance("inst-d", Status.SUCCESS)
    await _corrupt(store, "inst-a", "status", "HALF_DONE")
    await _corrupt(store, "inst-b", "status", "HALF_DONE")
    await _corrupt(store, "inst-c", "status", "MOSTLY")

    counts = await store.count_by_status()

    assert counts.counts == {**dict.fromkeys(Status, 0), Status.PENDING: 1, Status.SUCCESS: 1}
    half, mostly = counts.unreadable
    assert half.startswith("task_instances row 'inst-a': status is 'HALF_DONE', not a status")
    assert half.endswith("(2 rows)")
    assert mostly.startswith("task_instances row 'inst-c': status is 'MOSTLY', not a status")
    assert mostly.endswith("(1 row)")


async def test_due_retries_read_a_corrupt_row_as_unreadable_in_its_place(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """The scheduler pages through due retries by (next_attempt_at_ms, id): a row that does
    not decode keeps its place, and the rows after it are read."""
    for name, due_ms in (("a", 1_000), ("b", 2_000)):
        await store.create_instance(make_new(name))
        await advance(f"inst-{name}", Status.RUNNING)
        await store.transition(
            f"inst-{name}", Status.RUNNING, Status.RETRYING, reason="r", next_attempt_at_ms=due_ms
        )
    await _corrupt(store, "inst-a", "payload", "{not json")
    bad, good = await store.due_retries(now_ms=3_000, limit=10)
    assert isinstance(bad, UnreadableRow) and isinstance(good, InstanceRow)
    assert (bad.id, bad.next_attempt_at_ms, good.id) == ("inst-a", 1_000, "inst-b")
    assert "task_instances row 'inst-a': payload is not JSON" in bad.error
    assert [
        r.id for r in await store.due_retries(now_ms=3_000, limit=10, after=(1_000, "inst-a"))
    ] == ["inst-b"]
