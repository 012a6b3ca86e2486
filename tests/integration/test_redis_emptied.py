"""Redis losing its data (FLUSHDB, a restart empty) or its role (a failover demoting it) under
a live executor: healthy runs are not taken for lost, and the executor waits the outage out.

The module runs its own Valkey server: FLUSHDB and REPLICAOF touch nothing another test uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.states import Status
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.runtime.embedded import EmbeddedValkey
from tests.integration.harness import T0, Harness, Running, until
from tests.integration.outages import GATED, TASKS, Gate, gated_executor


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey server of this module's own."""
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("valkey"))) as url:
        yield url


async def _status(h: Harness, instance_id: str) -> Status | None:
    row = await h.store.get_instance(instance_id)
    return None if row is None else row.status


async def _left_running(h: Harness, gate: Gate, instance_id: str) -> None:
    """Run a sweep while the executor runs `instance_id`; it must stay RUNNING."""
    await until(lambda: _is(h, instance_id, Status.RUNNING))
    counts = await h.sweeper().sweep_once()
    after = await h.store.get_instance(instance_id)
    assert after is not None
    assert after.status is Status.RUNNING, (counts, after.status, after.last_error)


async def _is(h: Harness, instance_id: str, status: Status) -> bool:
    return await _status(h, instance_id) is status


async def test_a_run_claimed_right_after_flushdb_is_not_taken_for_lost(outage: Harness) -> None:
    """Redis is emptied (no connection error anywhere) while c1 runs. New work arrives: c1
    makes the group again, reads and claims it. Its liveness key went with the flush; the
    read set it again, so a sweep does not time the run out as `owner_lost`."""
    h = outage
    gate = Gate()
    _first, ex = await gated_executor(h, gate)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        await h.redis.flushdb()
        row = await h.trigger(GATED, "gated", fire_ms=T0 + 1)
        await _left_running(h, gate, row.id)
    finally:
        gate.release.set()
        await ex.close()


async def test_a_run_read_from_a_group_the_sweeper_made_again_is_not_taken_for_lost(
    outage: Harness,
) -> None:
    """As above, but c1 never sees NOGROUP: its one slot is busy when Redis is emptied, and
    the sweeper's reconciler makes the groups again first."""
    h = outage
    gate = Gate()
    _first, ex = await gated_executor(h, gate, concurrency=1)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        await h.redis.flushdb()
        await h.sweeper().sweep_once()
        row = await h.trigger(GATED, "gated", fire_ms=T0 + 1)
        gate.release.set()  # the first run ends; the second then waits for the gate again
        gate.release.clear()
        await _left_running(h, gate, row.id)
    finally:
        gate.release.set()
        await ex.close()


async def test_an_idle_executor_waits_out_its_redis_turning_replica(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """A failover demotes the executor's Redis while the executor waits in a blocking read:
    Redis ends the read with `UNBLOCKED ... instance state changed (master -> replica?)`
    and refuses writes from then on. That is an outage: the executor does not exit, and runs
    new work once the server takes writes again."""
    h = outage
    read, failed_reads = streams.read, []

    async def counted_read(*args: Any, **kwargs: Any) -> Any:
        try:
            return await read(*args, **kwargs)
        except Exception as exc:
            failed_reads.append(exc)
            raise

    monkeypatch.setattr(streams, "read", counted_read)
    registry = default_registry(h.registry_modules)
    deps = ExecutorDeps(h.store, h.redis, h.keys, registry, h.clock, Random(7))
    running = Running(Executor(deps, ExecutorConfig(consumer="c1", block_ms=1000)))
    admin = streams.connect(redis_url)
    try:
        await until(lambda: _blocked(admin))
        await admin.replicaof("127.0.0.1", 1)
        # The unblocked read, then a read refused by the replica (or the executor's exit).
        await until(lambda: _true(running.task.done() or len(failed_reads) >= 2))
        await _replicaof_no_one(admin)
        assert not running.task.done(), repr(running.task.exception())
        row = await h.trigger(TASKS, "quick")
        await until(lambda: _is(h, row.id, Status.SUCCESS))
    finally:
        await _replicaof_no_one(admin)
        await admin.aclose()
        if not running.task.done():
            await running.close()


async def _blocked(admin: streams.Redis) -> bool:
    return any("b" in c["flags"] for c in await admin.client_list())


async def _true(value: bool) -> bool:
    return value


async def _replicaof_no_one(admin: streams.Redis) -> None:
    """Make the server a primary again; it drops its clients as its role changes."""
    for _ in range(50):
        try:
            await admin.replicaof("NO", "ONE")
            return
        except streams.DRIVER_ERRORS:
            await asyncio.sleep(0.1)
