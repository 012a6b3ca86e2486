"""One benchmark's private cluster state: its own Redis namespace and MariaDB database, migrated,
with its task file applied and the consumer groups made; both are removed afterwards (SCAN
MATCH + DEL on its own keys, DROP DATABASE)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from bench.common import Services, apply_tasks, delete_keys, temp_database, unique
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.migrate import upgrade
from taskstream.core.store.sql import SqlStore


@dataclass(frozen=True, slots=True)
class Stage:
    database: str
    keys: Keys
    redis: streams.Redis
    store: SqlStore

    @property
    def namespace(self) -> str:
        return self.keys.namespace


@asynccontextmanager
async def staged(
    svc: Services, letter: str, tasks: str, agent_modules: Sequence[str] = ()
) -> AsyncIterator[Stage]:
    """A fresh stage named `bench-<letter>-<hex>` with `tasks` (a task file's text) applied."""
    keys = Keys(namespace=unique(f"bench-{letter}-"))
    redis = streams.connect(svc.redis_url)
    try:
        async with temp_database(svc) as database:
            await upgrade(svc.database_url(database))
            store = await SqlStore.connect(svc.database_url(database))
            try:
                await streams.ensure_groups(redis, keys)
                await apply_tasks(store, tasks, agent_modules)
                yield Stage(database, keys, redis, store)
            finally:
                await store.close()
    finally:
        await delete_keys(redis, f"{keys.base}:*")
        await redis.aclose()
