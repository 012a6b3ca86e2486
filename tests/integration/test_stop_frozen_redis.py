"""A stop while Redis has stopped answering (frozen, or cut off without a reset): the roles'
loops cut the step under way off, but the calls they make on the way out (the scheduler's
lease release and unsubscribe, the executor's liveness key) waited for Redis until the
client's read timeout, so the stop overran a supervisor's or container runtime's kill
deadline. Redis here is a private server of the test, stopped with SIGSTOP."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

import pytest
import redis.asyncio as aioredis

from taskstream.core.notify import Wakeups
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.runtime.embedded import EmbeddedValkey
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.executor_cases import harness
from tests.integration.harness import Harness, until

READ_TIMEOUT_S = 60.0
"""The roles' Redis read timeout here (a `socket_timeout` in the URL): long, as the store's."""
STOP_BOUND_S = 30.0
"""Bounds a broken stop only, which waits for the read timeout (`READ_TIMEOUT_S`). A stop's
own waits add up to about 4 s (`futures.STEP_END_S` and `CANCEL_WAIT_S` for the step under
way, `STEP_END_S` for each call on the way out); on a quiet host it takes 1-4 s, and a full
suite on two cores once stretched one past 10 s."""


class Role(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def _scheduler(h: Harness) -> Role:
    lease = LeaderLease(h.redis, h.keys, "s1", lease_ms=15_000)
    return Scheduler(
        h.store,
        h.outbox,
        h.clock,
        SchedulerConfig(),
        leader=lease,
        wakeups=Wakeups(h.redis, h.keys),
    )


ROLES: dict[str, Callable[[Harness], Role]] = {
    "executor": lambda h: h.executor(),
    "scheduler": _scheduler,
}


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[tuple[aioredis.Redis, int]]:
    """A client of a private server, and the server's pid."""
    valkey = EmbeddedValkey(tmp_path / "home")
    url = valkey.start(timeout_s=15.0)
    client = aioredis.Redis.from_url(url, socket_timeout=READ_TIMEOUT_S)
    proc = valkey._proc  # the test freezes it
    assert proc is not None
    try:
        yield client, proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        await client.aclose(close_connection_pool=True)
        valkey.stop()


@pytest.mark.parametrize("role", sorted(ROLES))
async def test_a_stop_does_not_wait_for_a_redis_that_stopped_answering(
    store: SqlStore, keys: Keys, private: tuple[aioredis.Redis, int], role: str
) -> None:
    redis, pid = private
    h = await harness(store, redis, keys)
    stop = asyncio.Event()
    task = asyncio.create_task(ROLES[role](h).run(stop))
    try:
        await until(lambda: _holds(redis, keys, role))
        os.kill(pid, signal.SIGSTOP)
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_BOUND_S)
    finally:
        os.kill(pid, signal.SIGCONT)
        if not task.done():
            await asyncio.wait({task}, timeout=READ_TIMEOUT_S * 3)
    assert task in done, f"the {role} was still running {STOP_BOUND_S:g} s after its stop"


async def _holds(redis: aioredis.Redis, keys: Keys, role: str) -> bool:
    """The role has set what it removes at its stop: the lease, the liveness key."""
    if role == "scheduler":
        return bool(await redis.exists(keys.leader))
    return bool([k async for k in redis.scan_iter(match=keys.alive("*"))])
