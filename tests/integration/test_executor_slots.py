"""An executor never runs more than `--concurrency` runs, on a real store and on both servers
it meets (the shared Redis and the embedded Valkey of `taskstream up`): not even when its
blocking read, which waits on every priority stream at once, wakes with an entry on each
(Valkey answers such a wake-up with every stream that has entries). The entries beyond its
free slots go back to their streams at once, not left pending for it, and run, one by one,
as slots free up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
import redis.asyncio as aioredis

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import Registry, default_registry
from taskstream.core import streams
from taskstream.core.definitions import to_records
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import GROUP, Keys, Priority, WorkEntry, encode
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.runtime.embedded import EmbeddedValkey
from taskstream.scheduler.service import new_instance
from tests.agents import Params
from tests.integration import outages
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import blocked_in_read
from tests.support.acl import acl_user, as_user, namespace_rules
from tests.support.keyspace import drop_keys

TASKS = """
tasks:
  - {id: t-high, agent: counted, priority: high, lease: 30s}
  - {id: t-default, agent: counted, priority: default, lease: 30s}
  - {id: t-low, agent: counted, priority: low, lease: 30s}
"""


class Counted:
    """An agent that counts the runs inside it at once; each waits until the test lets it."""

    def __init__(self) -> None:
        self.inside = self.most = self.ended = 0
        self.release = asyncio.Semaphore(0)
        """One release lets one run end."""

    async def run(self, ctx: AgentContext, p: Params) -> dict[str, Any]:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            await self.release.acquire()
        finally:
            self.inside -= 1
            self.ended += 1
        return {}


@pytest.fixture(params=["redis", "valkey"])
def server_url(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[str]:
    if request.param == "redis":
        yield redis_url
        return
    with EmbeddedValkey(tmp_path) as url:
        yield url


@pytest.fixture
async def on_server(server_url: str, store: SqlStore, keys: Keys) -> AsyncIterator[Harness]:
    client = streams.connect(server_url)
    try:
        yield await outages.harness(store, client, keys)
    finally:
        await drop_keys(client, keys)
        await client.aclose()


async def test_a_read_that_wakes_on_every_stream_starts_no_more_runs_than_free_slots(
    on_server: Harness, server_url: str
) -> None:
    h = on_server
    agent, registry, entries = await _one_task_per_stream(h)
    client, ex = await _one_slot_executor(h, server_url, registry)
    try:
        await _publish_at_once(h, entries)

        await until(lambda: _is(agent.inside > 0))
        # Only the running entry is this consumer's: the surplus is back on its streams,
        # readable by any consumer, neither idling towards the sweeper's unclaimed timeout
        # nor left behind by a stop.
        assert await _pending_for(h, "c1") == 1
        for ended in range(1, 4):  # each run, then the next, one at a time
            await until(lambda: _is(agent.inside > 0))
            # A slot frees when its run returns, before its end is committed: the next run
            # can start while the last one's row is still RUNNING. Once that commit lands,
            # only the running one is claimed; the surplus entries are not.
            await until(lambda n=ended: _is_count(h, Status.SUCCESS, n - 1))  # type: ignore[misc]
            assert await _count(h, Status.RUNNING) == 1
            agent.release.release()
            await until(lambda n=ended: _is(agent.ended == n))  # type: ignore[misc]
        await until(lambda: _is_count(h, Status.SUCCESS, 3))
    finally:
        await ex.close()
        await client.aclose()
    assert agent.most == 1
    for priority in Priority:
        assert (await h.redis.xpending(h.keys.stream(priority), GROUP))["pending"] == 0


async def test_entries_beyond_free_slots_whose_move_redis_denies_run_as_slots_free(
    on_server: Harness, server_url: str
) -> None:
    """The move that puts the surplus back is denied (an ACL without EVALSHA): the entries
    stay pending for this consumer, and it runs them as slots free, the first at once; none
    waits for the sweeper, which would count it as a delivery never claimed."""
    h = on_server
    agent, registry, entries = await _one_task_per_stream(h)
    async with acl_user(h.redis, server_url, [*namespace_rules(h.keys), "-evalsha"]) as (u, _):
        client, ex = await _one_slot_executor(h, as_user(server_url, u), registry)
        try:
            await _publish_at_once(h, entries)
            for ended in range(1, 4):
                await until(lambda: _is(agent.inside > 0))
                agent.release.release()
                await until(lambda n=ended: _is(agent.ended == n))  # type: ignore[misc]
            await until(lambda: _is_count(h, Status.SUCCESS, 3))
        finally:
            await ex.close()
            await client.aclose()
    assert agent.most == 1


async def _one_slot_executor(
    h: Harness, url: str, registry: Registry
) -> tuple[aioredis.Redis, Running]:
    """Consumer c1 with one slot on its own client to `url`, blocked in its read."""
    name = f"tstest-executor-{h.keys.namespace}"
    client = aioredis.Redis.from_url(url, client_name=name)
    deps = ExecutorDeps(h.store, client, h.keys, registry, h.clock, Random(7))
    ex = Running(Executor(deps, ExecutorConfig(consumer="c1", block_ms=2000, concurrency=1)))
    try:
        await until(lambda: blocked_in_read(h.redis, name))
    except BaseException:
        await ex.close()
        await client.aclose()
        raise
    return client, ex


async def _publish_at_once(h: Harness, entries: list[tuple[Priority, WorkEntry]]) -> None:
    """XADD every entry in one MULTI: one wake-up of a read blocked on all three streams."""
    async with h.redis.pipeline(transaction=True) as pipe:
        for priority, entry in entries:
            pipe.xadd(h.keys.stream(priority), encode(entry))  # type: ignore[arg-type]
        await pipe.execute()


async def _one_task_per_stream(
    h: Harness,
) -> tuple[Counted, Registry, list[tuple[Priority, WorkEntry]]]:
    """The `counted` agent, a registry with it, and one instance of each task of `TASKS`
    (one per priority stream) made in the store, with the entry each would be published as."""
    agent = Counted()
    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="counted", params_model=Params, fn=agent.run))
    taskfile = parse_task_file_text(TASKS, "t.yaml", known_agents=registry.names())
    await h.store.upsert_definitions(to_records(taskfile))
    entries = []
    for spec in taskfile.tasks:
        created = await h.store.create_instance(new_instance(spec, h.clock.now_ms()))
        row = await h.store.get_instance(created.instance_id)
        assert row is not None
        entries.append((spec.priority, row_entry(row, h.clock.now_ms())))
    return agent, registry, entries


async def _is(value: bool) -> bool:
    return value


async def _count(h: Harness, status: Status) -> int:
    return len(await h.store.list_instances(status=status))


async def _is_count(h: Harness, status: Status, n: int) -> bool:
    return await _count(h, status) == n


async def _pending_for(h: Harness, consumer: str) -> int:
    total = 0
    for priority in Priority:
        summary: Any = await h.redis.xpending(h.keys.stream(priority), GROUP)
        for c in summary["consumers"]:
            total += int(c["pending"]) if streams.as_text(c["name"]) == consumer else 0
    return total
