"""A run's end that PostgreSQL cancels (an operator's `pg_cancel_backend`, a pooler, a
statement timeout) is an error that passes: the commit is sent again and the run keeps the
end its agent gave it, never FAILED `commit_refused`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration import outages
from tests.integration.executor_cases import reach
from tests.integration.harness import Harness, until
from tests.integration.outages import Gate, gated_executor, lock
from tests.support.databases import available_kinds, temp_database

pytestmark = pytest.mark.skipif("postgres" not in available_kinds(), reason="no PostgreSQL")

# The other sessions of this test's database waiting on a row lock in a statement that
# starts with :head.
WAITING = text(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE :head"
)


@pytest.fixture
async def pg(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    async with temp_database("postgres") as url:
        store = await SqlStore.connect(url)
        try:
            yield await outages.harness(store, redis, keys)
        finally:
            await store.close()


async def test_a_cancelled_finish_is_sent_again_and_the_run_keeps_its_success(
    pg: Harness,
) -> None:
    h = pg
    gate = Gate()
    instance_id, ex = await gated_executor(h, gate)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        async with h.store.engine.connect() as conn:
            await lock(conn, instance_id)
            gate.release.set()
            pids: list[int] = []

            async def blocked() -> bool:
                async with h.store.engine.connect() as look:  # a new snapshot of the view
                    found = await look.execute(WAITING, {"head": "UPDATE task_instances%"})
                    pids[:] = [p for (p,) in found.all()]
                return bool(pids)

            await until(blocked)
            await conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": pids[0]})
            await conn.rollback()
        await reach(h, instance_id, Status.SUCCESS, Status.FAILED)
    finally:
        await ex.close()
    row = await h.store.get_instance(instance_id)
    assert row is not None
    assert row.status is Status.SUCCESS, (row.status, row.fail_class, row.last_error)
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
