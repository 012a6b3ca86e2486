"""The store's driver path on real MariaDB: hot-path writes skip the engine, and every way a
transaction on it can end leaves the pool and the rows right (commit, rollback, a refused
write, a killed connection, a cancelled statement, a server that is not there)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import bindparam, event, func, insert, select, text

from taskstream.core.errors import StoreUnavailable
from taskstream.core.states import Status
from taskstream.core.store import sql_queries as q
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.port import CasResult, ClaimRequest, DispatchRequest
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_driver import driver_enabled, driver_transaction
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_errors import ConstraintViolation
from taskstream.core.store.sql_prepared import DriverRunner, Template
from taskstream.core.store.tables import side_effects
from taskstream.core.store.tables import task_instances as inst
from taskstream.core.store.urls import normalize_url
from tests.integration.harness import until
from tests.integration.outages import CLAIM_READ, RUNNING, lock
from tests.support.databases import available_kinds, temp_database

pytestmark = pytest.mark.skipif(
    "mariadb" not in available_kinds(), reason="the driver path is MySQL / MariaDB only"
)

CONNECTION_ID = Template(select(func.connection_id().label("cid")))
ADD_KEY = Template(
    insert(side_effects).values(
        idempotency_key=bindparam("k"), instance_id="inst-a", attempt=1, created_at_ms=0
    )
)


@pytest.fixture
async def store() -> AsyncIterator[SqlStore]:
    async with temp_database("mariadb") as url:
        opened = await SqlStore.connect(url)
        try:
            yield opened
        finally:
            await opened.close()


async def _seed(store: SqlStore, *names: str) -> None:
    rows = [
        {
            "id": f"inst-{n}",
            "task_id": "report",
            "agent": "echo",
            "dedupe_key": f"report:{n}",
            "status": Status.DISPATCHED.value,
            "attempt": 0,
            "max_attempts": 3,
            "priority": "default",
            "scheduled_for_ms": 0,
            "payload": "{}",
            "context": "{}",
            "trace_id": "",
            "created_at_ms": 0,
            "updated_at_ms": 0,
        }
        for n in names
    ]
    async with store.engine.begin() as conn:
        await conn.execute(insert(inst), rows)


async def _status(store: SqlStore, name: str) -> Status:
    row = await store.get_instance(f"inst-{name}")
    assert row is not None
    return row.status


async def _connection_id(run: DriverRunner) -> int:
    [row] = await run.rows(CONNECTION_ID, {})
    return int(row["cid"])


def _claim_update(name: str) -> tuple[Template, dict[str, object]]:
    values = {"status": Status.RUNNING.value, "attempt": templates.NEXT}
    return templates.bind_update(Status.DISPATCHED, [(f"inst-{name}", 0)], [values])


async def test_hot_writes_skip_the_engine(store: SqlStore) -> None:
    assert driver_enabled(store.engine)
    await _seed(store, "a")
    by_engine: list[object] = []
    by_driver: list[str] = []
    event.listen(store.engine.sync_engine, "before_cursor_execute", lambda *a: by_engine.append(a))
    store.statement_listeners.append(by_driver.append)

    claimed = await store.claim_many([ClaimRequest("inst-a", 0, 30)], owner="x")

    assert claimed["inst-a"].token == 1
    assert [s.split()[0] for s in by_driver] == ["SELECT", "UPDATE", "INSERT"]
    assert by_engine == []


async def test_the_dispatch_locking_path_skips_the_engine(store: SqlStore) -> None:
    """A dispatch that finds one row of its batch moved on (claimed first) rolls back its
    update and decides each row under lock, on the driver too."""
    await _seed(store, "a", "b")
    async with store.engine.begin() as conn:
        await conn.execute(inst.update().values(status=Status.PENDING.value))
    await store.claim_many([ClaimRequest("inst-a", 0, 30)], owner="x")
    by_engine: list[object] = []
    by_driver: list[str] = []
    event.listen(store.engine.sync_engine, "before_cursor_execute", lambda *a: by_engine.append(a))
    store.statement_listeners.append(by_driver.append)

    requests = [DispatchRequest(f"inst-{n}", Status.PENDING, 0) for n in ("a", "b")]
    results = await store.dispatch_many(requests)

    assert results == {
        "inst-a": CasResult(ok=False, found=Status.RUNNING),
        "inst-b": CasResult(ok=True),
    }
    assert [s.split()[0] for s in by_driver] == ["UPDATE", "SELECT", "UPDATE", "INSERT"]
    assert by_engine == []
    assert await _status(store, "b") is Status.DISPATCHED


async def test_commit_keeps_the_connection_for_the_next_transaction(store: SqlStore) -> None:
    await _seed(store, "a")
    async with driver_transaction(store.engine, "db") as run:
        first = await _connection_id(run)
        assert await run.count(*_claim_update("a")) == 1
    async with driver_transaction(store.engine, "db") as run:
        assert await _connection_id(run) == first
    assert await _status(store, "a") is Status.RUNNING
    assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_an_error_of_the_body_rolls_back_and_passes_unchanged(store: SqlStore) -> None:
    await _seed(store, "a")
    with pytest.raises(q.RowsMoved):
        async with driver_transaction(store.engine, "db") as run:
            first = await _connection_id(run)
            await run.count(*_claim_update("a"))
            raise q.RowsMoved("test")
    assert await _status(store, "a") is Status.DISPATCHED
    async with driver_transaction(store.engine, "db") as run:
        assert await _connection_id(run) == first


async def test_a_refused_write_is_a_constraint_violation_and_rolls_back(
    store: SqlStore,
) -> None:
    await _seed(store, "a")
    with pytest.raises(ConstraintViolation, match="constraint violated"):
        async with driver_transaction(store.engine, "db") as run:
            first = await _connection_id(run)
            await run.count(*_claim_update("a"))
            await run.count(ADD_KEY, {"k": "once"})
            await run.count(ADD_KEY, {"k": "once"})
    assert await _status(store, "a") is Status.DISPATCHED
    assert not await store.side_effect_done("once")
    async with driver_transaction(store.engine, "db") as run:
        assert await _connection_id(run) == first


async def test_a_killed_connection_is_unavailable_and_replaced(store: SqlStore) -> None:
    await _seed(store, "a")
    with pytest.raises(StoreUnavailable, match="unavailable"):
        async with driver_transaction(store.engine, "db") as run:
            killed = await _connection_id(run)
            async with store.engine.connect() as other:
                await other.execute(text(f"KILL CONNECTION {killed:d}"))
            await run.count(*_claim_update("a"))
    async with driver_transaction(store.engine, "db") as run:
        assert await _connection_id(run) != killed
        assert await run.count(*_claim_update("a")) == 1


async def test_a_cancelled_statement_drops_its_connection_and_locks(store: SqlStore) -> None:
    await _seed(store, "a")
    async with store.engine.connect() as holder:
        await lock(holder, "inst-a")
        claim = asyncio.ensure_future(store.claim_many([ClaimRequest("inst-a", 0, 30)], owner="x"))

        async def waiting() -> bool:
            return bool((await holder.execute(RUNNING, {"head": CLAIM_READ})).all())

        await until(waiting)
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        await holder.rollback()

        async def gone() -> bool:
            return not (await holder.execute(RUNNING, {"head": CLAIM_READ})).all()

        await until(gone)
    claimed = await store.claim_many([ClaimRequest("inst-a", 0, 30)], owner="y")
    assert claimed["inst-a"].row.lease_owner == "y"
    assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_server_that_is_not_there_is_unavailable() -> None:
    engine = make_engine(normalize_url("mysql://root@127.0.0.1:1/nothing"))
    try:
        with pytest.raises(StoreUnavailable, match="unavailable"):
            async with driver_transaction(engine, "mysql://127.0.0.1:1/nothing"):
                pass
    finally:
        await engine.dispose()
