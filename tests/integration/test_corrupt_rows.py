"""A `task_instances` row holding what taskstream never writes (a hand edit in SQL) is set
aside, visibly, while the rest of the cluster's work flows: the executor dead-letters its
entry (`corrupt_row`) and runs the other instances of the batch, the sweeper does the same
with such an entry left pending, and the reconciler passes over such a row, logging it once,
and publishes the others. Nothing stored is rewritten."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.errors import StoreCorrupt
from taskstream.core.lost_letters import latest_lost
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.cli_in_process import run_cli
from tests.integration.executor_cases import TASKS, harness, reach
from tests.integration.harness import T0, Harness, Running, until

CORRUPTIONS = [
    # column, value, the status the row is left at
    ("payload", "{not json", Status.FAILED),
    ("status", "HALF_DONE", None),
    ("fail_class", "mostly", Status.DISPATCHED),
]


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def _corrupt(h: Harness, instance_id: str, column: str, value: str) -> None:
    async with h.store.engine.begin() as conn:
        await conn.execute(
            text(f"UPDATE task_instances SET {column} = :v WHERE id = :id"),  # column: ours
            {"v": value, "id": instance_id},
        )


async def _raw(h: Harness, instance_id: str, column: str) -> Any:
    async with h.store.engine.connect() as conn:
        stmt = text(f"SELECT {column} FROM task_instances WHERE id = :id")  # column: ours
        return (await conn.execute(stmt, {"id": instance_id})).scalar_one()


async def _letters(h: Harness) -> list[tuple[bytes, bytes]]:
    dead: Any = await h.redis.xrange(h.keys.dead)
    return [(f[b"reason"], f[b"detail"]) for _, f in dead]


@pytest.mark.parametrize(("column", "value", "left_at"), CORRUPTIONS)
async def test_an_executor_sets_a_corrupt_row_aside_and_runs_the_rest_of_its_batch(
    h: Harness, column: str, value: str, left_at: Status | None
) -> None:
    bad = await h.trigger(TASKS, "effect", fire_ms=T0)
    good = await h.trigger(TASKS, "effect", fire_ms=T0 + 60_000)
    await _corrupt(h, bad.id, column, value)
    ex = Running(h.executor())

    async def dead_lettered() -> bool:
        return bool(await h.redis.xlen(h.keys.dead))

    try:
        await reach(h, good.id, Status.SUCCESS)
        await until(dead_lettered)
        assert not ex.task.done(), "the executor goes on"
    finally:
        await ex.close()
    [(reason, detail)] = await _letters(h)
    assert reason == b"corrupt_row"
    assert f"task_instances row '{bad.id}': {column}".encode() in detail
    assert await _raw(h, bad.id, column) == value, "the bad value is left as it is"
    if left_at is not None:
        assert await _raw(h, bad.id, "status") == left_at.value
    if left_at is Status.FAILED:
        assert await _raw(h, bad.id, "fail_class") == "poison"
        assert "not JSON" in await _raw(h, bad.id, "last_error")
        # `status` and `dead list` look for lost letters among the poison failures.
        assert (await latest_lost(h.store, h.redis, h.keys.dead, examine=10)).lost == []


async def test_a_sweeper_dead_letters_a_pending_entry_whose_row_is_corrupt(h: Harness) -> None:
    """The entry's consumer died before its claim: the sweeper, deciding from the row, sets
    the entry aside instead of stopping its pass, and still sweeps the other entry."""
    bad = await h.trigger(TASKS, "effect", fire_ms=T0)
    good = await h.trigger(TASKS, "effect", fire_ms=T0 + 60_000)
    await _corrupt(h, bad.id, "payload", "[1, 2")
    read = await streams.read(h.redis, h.keys, "gone", count=2, block_ms=10)
    assert len(read) == 2
    counts = await h.sweeper(min_idle_ms=0).sweep_once()
    assert counts.get("dead_letter") == 1
    assert counts.get("redeliver") == 1, "the good entry is swept too"
    [(reason, _)] = await _letters(h)
    assert reason == b"corrupt_row"
    assert await _raw(h, bad.id, "status") == Status.FAILED.value
    assert await _raw(h, bad.id, "payload") == "[1, 2"
    with pytest.raises(StoreCorrupt):
        await h.store.get_instance(bad.id)
    assert good.id in await admin.instance_ids(h.redis, h.keys)


async def test_a_sweep_pass_passes_over_a_corrupt_stale_row_and_publishes_the_others(
    h: Harness,
) -> None:
    """Redis lost both entries; one row's context was edited by hand. The pass publishes the
    other row again, and logs the bad one once, not on every pass."""
    bad = await h.trigger(TASKS, "effect", fire_ms=T0)
    good = await h.trigger(TASKS, "effect", fire_ms=T0 + 60_000)
    await h.redis.delete(*h.keys.streams())
    await _corrupt(h, bad.id, "context", "{oops")
    h.clock.advance(60_000)
    sweeper = h.sweeper()
    with capture_logs() as logs:
        first = await sweeper.sweep_once()
        await h.redis.delete(*h.keys.streams())
        second = await sweeper.sweep_once()
    assert (first["republished"], second["republished"]) == (1, 1)
    assert await admin.instance_ids(h.redis, h.keys) == {good.id}
    told = [e for e in logs if e["event"] == "instance.unreadable"]
    assert [e["instance_id"] for e in told] == [bad.id]
    assert "context" in told[0]["error"]
    assert await _raw(h, bad.id, "context") == "{oops"
    assert await _raw(h, bad.id, "status") == Status.DISPATCHED.value


async def test_instances_lists_the_good_rows_and_names_a_corrupt_one(
    h: Harness, db_url: str, redis_url: str
) -> None:
    """`taskstream instances` shows every row it can read, names the one it cannot (row and
    column) on stderr and exits 1, instead of a traceback or an error alone."""
    bad = await h.trigger(TASKS, "effect", fire_ms=T0)
    good = await h.trigger(TASKS, "effect", fire_ms=T0 + 60_000)
    await _corrupt(h, bad.id, "status", "HALF_DONE")
    out = await run_cli(h, db_url, redis_url, "instances")
    assert out.exit_code == 1, out.output
    assert good.id in out.stdout and bad.id in out.stdout
    assert f"task_instances row '{bad.id}': status is 'HALF_DONE'" in out.stderr
    as_json = await run_cli(h, db_url, redis_url, "instances", "--json")
    assert as_json.exit_code == 1, as_json.output
    listed = {r["id"]: r for r in json.loads(as_json.stdout)}
    assert listed[good.id]["status"] == Status.DISPATCHED.value
    assert listed[bad.id]["unreadable"] and "status" in listed[bad.id]["error"]
    assert await _raw(h, bad.id, "status") == "HALF_DONE"


async def test_status_counts_the_readable_statuses_and_names_one_no_state_has(
    h: Harness, db_url: str, redis_url: str
) -> None:
    """The rows whose status no state has are named, with how many there are, and every
    other status is counted, beside the queue, dead letters and upstreams; exit 1."""
    bad = await h.trigger(TASKS, "effect", fire_ms=T0)
    await h.trigger(TASKS, "effect", fire_ms=T0 + 60_000)
    await _corrupt(h, bad.id, "status", "HALF_DONE")
    out = await run_cli(h, db_url, redis_url, "status")
    assert out.exit_code == 1, out.output
    assert "dead letters: 0" in out.stdout
    assert "DISPATCHED=1" in out.stdout, "the readable rows are counted"
    named = f"task_instances row '{bad.id}': status is 'HALF_DONE'"
    assert named in out.stdout and named in out.stderr
    assert "(1 row)" in out.stderr
    as_json = await run_cli(h, db_url, redis_url, "status", "--json")
    assert as_json.exit_code == 1, as_json.output
    data = json.loads(as_json.stdout)
    assert data["dead"] == 0 and data["instances"][Status.DISPATCHED.value] == 1
    [unreadable] = data["instances_unreadable"]
    assert named in unreadable
