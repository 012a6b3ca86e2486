"""A Redis that answers, but serves nothing for a while: BUSY (another client's script has run
past `busy-reply-threshold`) or NOREPLICAS (`min-replicas-to-write` is set and too few replicas
are connected). Like READONLY or LOADING, an outage the roles wait out, not a bug that ends
them.

The module runs its own Valkey server: its config and scripts touch nothing another test uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from taskstream.core import streams, streams_admin
from taskstream.core.states import Status
from taskstream.runtime.embedded import EmbeddedValkey
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import TASKS

Refusal = Callable[[str], AbstractAsyncContextManager[None]]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey server of this module's own."""
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("valkey"))) as url:
        yield url


@asynccontextmanager
async def no_replicas(url: str) -> AsyncIterator[None]:
    """The server refuses every write with NOREPLICAS: it wants a replica it does not have."""
    admin = streams.connect(url)
    await admin.config_set("min-replicas-to-write", 1)
    try:
        yield
    finally:
        await admin.config_set("min-replicas-to-write", 0)
        await admin.aclose()


@asynccontextmanager
async def busy_script(url: str) -> AsyncIterator[None]:
    """Another client runs a script that never ends: past 10 ms the server answers every
    other command BUSY, until the script is killed."""
    admin = streams.connect(url)
    await admin.config_set("busy-reply-threshold", 10)
    runner = aioredis.Redis.from_url(url, socket_timeout=None)
    script: asyncio.Future[Any] = asyncio.ensure_future(runner.eval("while true do end", 0))
    try:
        await until(lambda: _busy(admin))
        yield
    finally:
        await until(lambda: _killed(admin))
        await asyncio.gather(script, return_exceptions=True)
        await admin.config_set("busy-reply-threshold", 5000)
        await runner.aclose()
        await admin.aclose()


async def _busy(admin: streams.Redis) -> bool:
    try:
        await admin.ping()
    except ResponseError as exc:
        return "BUSY" in str(exc)
    return False


async def _killed(admin: streams.Redis) -> bool:
    try:
        await admin.script_kill()
    except ResponseError as exc:
        return "NOTBUSY" in str(exc)
    return True


REFUSALS = [no_replicas, busy_script]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.__name__)
async def test_the_executor_waits_out_a_server_that_serves_nothing(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, redis_url: str, refusal: Refusal
) -> None:
    h = outage
    failed_reads: list[Exception] = []
    # New entries, or after a failure the executor's own pending list (`Reader`).
    for module, name in ((streams, "read"), (streams_admin, "read_own")):
        monkeypatch.setattr(module, name, _counted(getattr(module, name), failed_reads))
    running = Running(h.executor())
    try:
        first = await h.trigger(TASKS, "quick")
        await until(lambda: _is(h, first.id, Status.SUCCESS))
        async with refusal(redis_url):
            await until(lambda: _true(running.task.done() or len(failed_reads) >= 2))
        assert not running.task.done(), repr(running.task.exception())
        row = await h.trigger(TASKS, "quick", fire_ms=first.scheduled_for_ms + 1)
        await until(lambda: _is(h, row.id, Status.SUCCESS))
    finally:
        if not running.task.done():
            await running.close()


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.__name__)
async def test_the_sweeper_waits_out_a_server_that_serves_nothing(
    outage: Harness, redis_url: str, refusal: Refusal
) -> None:
    h = outage
    sweeper = h.sweeper(interval_s=0.05)
    sweep_once, failed, swept = sweeper.sweep_once, [], []

    async def counted() -> dict[str, int]:
        try:
            counts = await sweep_once()
        except Exception as exc:
            failed.append(exc)
            raise
        swept.append(counts)
        return counts

    sweeper.sweep_once = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    sweeping = asyncio.create_task(sweeper.run(stop))
    try:
        async with refusal(redis_url):
            await until(lambda: _true(sweeping.done() or len(failed) >= 2))
        assert not sweeping.done(), repr(sweeping.exception())
        passes = len(swept)
        await until(lambda: _true(sweeping.done() or len(swept) > passes))
        assert not sweeping.done(), repr(sweeping.exception())
    finally:
        stop.set()
        await asyncio.wait_for(sweeping, timeout=20)


def _counted(
    read: Callable[..., Awaitable[Any]], failed: list[Exception]
) -> Callable[..., Awaitable[Any]]:
    """`read`, noting each error it raises in `failed`."""

    async def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return await read(*args, **kwargs)
        except Exception as exc:
            failed.append(exc)
            raise

    return counted


async def _is(h: Harness, instance_id: str, status: Status) -> bool:
    row = await h.store.get_instance(instance_id)
    return row is not None and row.status is status


async def _true(value: bool) -> bool:
    return value
