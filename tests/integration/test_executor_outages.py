"""An executor's intake across store failures, on real Redis and a real store: entries it read
before a failure are admitted when the store answers again, and its own claims that no run
holds are adopted instead of waiting for their leases to expire."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest
from taskstream.core.store.sql import SqlStore
from taskstream.executor.intake import Intake
from tests.integration.harness import Harness, Running, until

TASKS = """
tasks:
  - id: quick
    agent: slow
    retry: {max_attempts: 1}
    payload: {seconds: 0}
"""

# The other connections of this test's database in a locking read of instances (the claim's).
# PROCESSLIST, not INNODB_TRX: the latter is a cache that frequent polling never refreshes.
_LOCK_WAITERS = text(
    "SELECT ID FROM information_schema.PROCESSLIST"
    " WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
    " AND INFO LIKE 'SELECT task_instances.%FOR UPDATE'"
)


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    return harness


async def _intake(h: Harness, consumer: str, held: frozenset[str] = frozenset()) -> Intake:
    defs = DefinitionCache(h.store)
    await defs.refresh()
    registry = default_registry(h.registry_modules)
    return Intake(h.store, h.redis, h.keys, registry, defs, consumer, held=held.__contains__)


async def _claimed_unrun(h: Harness, owner: str) -> tuple[str, streams.Delivery]:
    """An instance `owner` read and claimed, as a batch that failed after its claim commit
    leaves it: RUNNING under `owner`, its entry pending, no run."""
    row = await h.trigger(TASKS, "quick")
    [delivery] = await streams.read(h.redis, h.keys, owner, count=1, block_ms=10)
    won = await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner=owner)
    assert won[row.id].token == 1
    return row.id, delivery


async def test_an_own_claim_that_no_run_holds_is_adopted(h: Harness) -> None:
    instance_id, delivery = await _claimed_unrun(h, "c1")
    [run] = await (await _intake(h, "c1")).admit([delivery])
    assert (run.row.id, run.token, run.row.status) == (instance_id, 1, Status.RUNNING)
    assert run.delivery == delivery
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.RUNNING) == 1  # no second claim


async def test_a_claim_held_here_or_made_elsewhere_is_not_adopted(h: Harness) -> None:
    instance_id, delivery = await _claimed_unrun(h, "c1")
    assert await (await _intake(h, "c1", held=frozenset({instance_id}))).admit([delivery]) == []
    assert await (await _intake(h, "c2")).admit([delivery]) == []
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt, row.lease_owner) == (
        Status.RUNNING,
        1,
        "c1",
    )


async def _lock_waiter(conn: AsyncConnection) -> int:
    waiting: list[int] = []

    async def found() -> bool:
        waiting[:] = [int(i) for (i,) in (await conn.execute(_LOCK_WAITERS)).all()]
        return bool(waiting)

    await until(found)
    [thread_id] = waiting
    return thread_id


async def test_entries_read_before_the_store_failed_run_once_it_answers(
    h: Harness, db_url: str
) -> None:
    """The executor's connection is killed while its claim waits for a row lock: the entries
    of that batch are in its pending list, unclaimed. They are claimed and run when the store
    answers again, by the executor alone (no sweeper redelivers them)."""
    if not db_url.startswith("mysql"):
        pytest.skip("needs a server whose connections can be killed")
    row = await h.trigger(TASKS, "quick")
    async with h.store.engine.connect() as conn:
        await conn.execute(
            text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE"), {"id": row.id}
        )
        ex = Running(h.executor("c1"))
        try:
            waiter = await _lock_waiter(conn)
            await conn.execute(text(f"KILL CONNECTION {waiter:d}"))
            await conn.rollback()

            async def done() -> bool:
                found = await h.store.get_instance(row.id)
                return found is not None and found.status is Status.SUCCESS

            await until(done)
        finally:
            await ex.close()
    history = await h.store.history(row.id)
    assert [(x.to_status, x.owner) for x in history if x.to_status is Status.RUNNING] == [
        (Status.RUNNING, "c1")
    ]
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0
