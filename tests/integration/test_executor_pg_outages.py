"""A run's end that PostgreSQL cancels (an operator's `pg_cancel_backend`, a pooler, a
statement timeout) is an error that passes: the commit is sent again and the run keeps the
end its agent gave it, never FAILED `commit_refused`."""

from __future__ import annotations

from sqlalchemy import text

from taskstream.core.states import Status
from tests.integration.executor_cases import reach
from tests.integration.harness import Harness, until
from tests.integration.outages import Gate, finishing_under_lock

# The other sessions of this test's database waiting on a row lock in a statement that
# starts with :head.
WAITING = text(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE :head"
)


async def test_a_cancelled_finish_is_sent_again_and_the_run_keeps_its_success(
    outage_pg: Harness,
) -> None:
    h = outage_pg
    async with finishing_under_lock(h, Gate()) as (instance_id, _ex, conn):
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
    row = await h.store.get_instance(instance_id)
    assert row is not None
    assert row.status is Status.SUCCESS, (row.status, row.fail_class, row.last_error)
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
