"""Fixtures for the store contract suite: every test runs once per reachable database kind,
each time on a fresh, migrated database that is dropped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import NewInstance
from taskstream.core.store.sql import SqlStore
from tests.support.databases import available_kinds, temp_database

MakeNew = Callable[[str], NewInstance]
Advance = Callable[[str, Status], Awaitable[None]]


async def trail(store: SqlStore, instance_id: str) -> list[tuple[object, ...]]:
    """An instance's history as (from, to, attempt, owner, reason), without ids and times."""
    return [
        (h.from_status, h.to_status, h.attempt, h.owner, h.reason)
        for h in await store.history(instance_id)
    ]


# One allowed path from PENDING to every status, as (src, dst) steps.
_PATHS: dict[Status, list[tuple[Status, Status]]] = {
    Status.PENDING: [],
    Status.DISPATCHED: [(Status.PENDING, Status.DISPATCHED)],
    Status.SKIPPED: [(Status.PENDING, Status.SKIPPED)],
}
_PATHS[Status.RUNNING] = [*_PATHS[Status.DISPATCHED], (Status.DISPATCHED, Status.RUNNING)]
_PATHS[Status.TIMEOUT] = [*_PATHS[Status.DISPATCHED], (Status.DISPATCHED, Status.TIMEOUT)]
_PATHS[Status.FAILED] = [*_PATHS[Status.DISPATCHED], (Status.DISPATCHED, Status.FAILED)]
_PATHS[Status.RETRYING] = [*_PATHS[Status.RUNNING], (Status.RUNNING, Status.RETRYING)]
_PATHS[Status.SUCCESS] = [*_PATHS[Status.RUNNING], (Status.RUNNING, Status.SUCCESS)]


@pytest.fixture(params=available_kinds())
async def db_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The URL of a fresh, migrated database of one kind ("sqlite", "mariadb", "postgres")."""
    kind: str = request.param
    async with temp_database(kind) as url:
        yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[SqlStore]:
    """A connected `SqlStore` on `db_url`, closed after the test."""
    opened = await SqlStore.connect(db_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def make_new() -> MakeNew:
    """`make_new(name)`: a `NewInstance` of task "report" whose id and dedupe key derive from
    `name`, scheduled at 1_700_000_000_000 ms."""

    def make(name: str) -> NewInstance:
        return NewInstance(
            id=f"inst-{name}",
            task_id="report",
            agent="echo",
            dedupe_key=f"report:{name}",
            scheduled_for_ms=1_700_000_000_000,
            payload={"name": name, "n": [1, 2.5, None]},
            max_attempts=3,
            trace_id=f"trace-{name}",
        )

    return make


@pytest.fixture
def advance(store: SqlStore) -> Advance:
    """`await advance(instance_id, status)`: move a fresh PENDING instance to `status` through
    allowed transitions (plain `transition` calls, so the attempt stays 0)."""

    async def walk(instance_id: str, status: Status) -> None:
        for src, dst in _PATHS[status]:
            fail_class = FailClass.FATAL if dst is Status.FAILED else None
            outcome = await store.transition(
                instance_id, src, dst, reason="setup", fail_class=fail_class
            )
            assert outcome.ok, (src, dst, outcome)

    return walk
