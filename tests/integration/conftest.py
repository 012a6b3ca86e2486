"""Integration fixtures: a real Redis client scoped to a per-test namespace (its keys are
deleted afterwards; nothing else is touched) and a real store on a fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration import outages
from tests.integration.harness import Harness
from tests.support.databases import available_kinds, temp_database
from tests.support.keyspace import drop_keys


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix="tstest", namespace=namespace)


@pytest.fixture
async def redis(redis_url: str, keys: Keys) -> AsyncIterator[streams.Redis]:
    client = streams.connect(redis_url)
    yield client
    await drop_keys(client, keys)
    await client.aclose()


@pytest.fixture(params=["sqlite", "mariadb"])
async def db_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async with temp_database(str(request.param)) as url:
        yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[SqlStore]:
    s = await SqlStore.connect(db_url)
    yield s
    await s.close()


@pytest.fixture
async def outage(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    """The outage tests' harness (`tests.integration.outages`), on every dialect."""
    return await outages.harness(store, redis, keys)


@pytest.fixture
async def outage_server(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    """The outage tests' harness on MariaDB only, for outages that kill the executor's
    server connections."""
    async with _outage_on("mariadb", redis, keys) as h:
        yield h


@pytest.fixture
async def outage_pg(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    """The outage tests' harness on PostgreSQL (the test skips when it does not answer)."""
    if "postgres" not in available_kinds():
        pytest.skip("no PostgreSQL")
    async with _outage_on("postgres", redis, keys) as h:
        yield h


@asynccontextmanager
async def _outage_on(kind: str, redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    async with temp_database(kind) as url:
        store = await SqlStore.connect(url)
        try:
            yield await outages.harness(store, redis, keys)
        finally:
            await store.close()
