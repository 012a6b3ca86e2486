"""A stop while the store has stopped answering: each role's loop checked the stop only
between steps, so a store call in flight held the stop up until the call's read timeout
(60 s). Under `up` or a container runtime the role was killed first, without releasing its
runs or its liveness key. The store stops answering here because another connection holds
the definitions table locked (a real MariaDB, the test's own database)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import pytest
from sqlalchemy import text

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.executor_cases import harness
from tests.integration.harness import Harness, until
from tests.integration.outages import unbounded, waiting

STOP_BOUND_S = 10.0
"""Bounds a broken stop only; a stop takes about 2 s here (`futures.STEP_END_S` and
`CANCEL_WAIT_S`)."""


class Role(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


ROLES: dict[str, Callable[[Harness], Role]] = {
    "executor": lambda h: h.executor(),
    "sweeper": lambda h: h.sweeper(interval_s=0.01),
    "scheduler": lambda h: h.scheduler(),
}


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


@pytest.mark.parametrize("role", sorted(ROLES))
async def test_a_stop_does_not_wait_for_a_store_that_stopped_answering(
    h: Harness, db_url: str, role: str
) -> None:
    if not db_url.startswith("mysql"):
        pytest.skip("locks a MariaDB table")
    async with h.store.engine.connect() as locker, h.store.engine.connect() as watcher:
        await unbounded(locker)
        await locker.execute(text("LOCK TABLES task_definitions WRITE"))
        stop = asyncio.Event()
        task = asyncio.create_task(ROLES[role](h).run(stop))
        try:
            await until(lambda: waiting(watcher, "%task_definitions%"))
            stop.set()
            done, _ = await asyncio.wait({task}, timeout=STOP_BOUND_S)
        finally:
            await locker.execute(text("UNLOCK TABLES"))
    assert task in done, f"the {role} was still running {STOP_BOUND_S:g} s after its stop"
    await task
