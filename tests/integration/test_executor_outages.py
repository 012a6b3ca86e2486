"""An executor across store failures, on real Redis and a real store: entries it read before a
failure are admitted when the store answers again, its own claims that no run holds are
adopted instead of waiting for their leases to expire, and a finished run whose commit failed
is committed when the store answers again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from random import Random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache, to_records
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.executor.heartbeat import Heartbeat
from taskstream.executor.intake import Intake
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from tests.agents import Params
from tests.integration.harness import Harness, Running, until
from tests.support.databases import temp_database

TASKS = """
tasks:
  - id: quick
    agent: slow
    retry: {max_attempts: 1}
    payload: {seconds: 0}
"""

GATED = """
tasks:
  - id: gated
    agent: gated
    retry: {max_attempts: 1}
    lease: 30s
"""

# The other connections of this test's database running a statement that starts with :head.
# PROCESSLIST, not INNODB_TRX: the latter is a cache that frequent polling never refreshes.
_RUNNING = text(
    "SELECT ID FROM information_schema.PROCESSLIST"
    " WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE :head"
)
_CLAIM_READ = "SELECT task_instances.%FOR UPDATE"
_FINISH_UPDATE = "UPDATE task_instances %"
_LEASE_READ = "SELECT task_instances.id, task_instances.attempt %FOR UPDATE"


async def _harness(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    return harness


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await _harness(store, redis, keys)


@pytest.fixture
async def server(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    """A harness on MariaDB only: the outages below kill the executor's server connections."""
    async with temp_database("mariadb") as url:
        store = await SqlStore.connect(url)
        try:
            yield await _harness(store, redis, keys)
        finally:
            await store.close()


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


async def _kill_waiter(
    conn: AsyncConnection, head: str, *, release: bool = True, spare: int | None = None
) -> int:
    """Kill the one other connection (not `spare`, one killed before) whose statement starts
    with `head` (it waits for a row lock `conn` holds), then release the lock unless told not
    to. Returns the killed connection's id."""
    waiting: list[int] = []

    async def found() -> bool:
        rows = (await conn.execute(_RUNNING, {"head": head})).all()
        waiting[:] = [int(i) for (i,) in rows if int(i) != spare]
        return bool(waiting)

    await until(found)
    [thread_id] = waiting
    await conn.execute(text(f"KILL CONNECTION {thread_id:d}"))
    if release:
        await conn.rollback()
    return thread_id


async def _lock(conn: AsyncConnection, instance_id: str) -> None:
    await conn.execute(
        text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE"), {"id": instance_id}
    )


async def _settled(h: Harness, instance_id: str) -> None:
    async def done() -> bool:
        found = await h.store.get_instance(instance_id)
        return found is not None and found.status is Status.SUCCESS

    await until(done)


async def test_entries_read_before_the_store_failed_run_once_it_answers(
    server: Harness,
) -> None:
    """The executor's connection is killed while its claim waits for a row lock: the entries
    of that batch are in its pending list, unclaimed. They are claimed and run when the store
    answers again, by the executor alone (no sweeper redelivers them)."""
    h = server
    row = await h.trigger(TASKS, "quick")
    async with h.store.engine.connect() as conn:
        await _lock(conn, row.id)
        ex = Running(h.executor("c1"))
        try:
            await _kill_waiter(conn, _CLAIM_READ)
            await _settled(h, row.id)
        finally:
            await ex.close()
    history = await h.store.history(row.id)
    assert [(x.to_status, x.owner) for x in history if x.to_status is Status.RUNNING] == [
        (Status.RUNNING, "c1")
    ]
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


class _Gate:
    """An agent that signals it has started and finishes when the test lets it."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def run(self, ctx: AgentContext, p: Params) -> dict[str, Any]:
        self.started.set()
        await self.release.wait()
        return {"attempt": ctx.attempt}


async def _gated_executor(h: Harness, gate: _Gate, **config: Any) -> tuple[str, Running]:
    """One `gated` instance and an executor `c1` that runs it with `gate`."""
    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="gated", params_model=Params, fn=gate.run))
    taskfile = parse_task_file_text(GATED, "gated.yaml", known_agents=registry.names())
    await h.store.upsert_definitions(to_records(taskfile))
    row = await h.trigger(GATED, "gated")
    deps = ExecutorDeps(h.store, h.redis, h.keys, registry, h.clock, Random(7))
    executor = Executor(deps, ExecutorConfig(consumer="c1", block_ms=20, **config))
    return row.id, Running(executor)


async def test_a_finished_run_whose_commit_failed_is_committed_once_the_store_answers(
    server: Harness,
) -> None:
    """The executor's connection is killed while its final CAS waits for a row lock: the run's
    end is written again when the store answers (one run, one SUCCESS), instead of being
    dropped and left RUNNING until its lease expires."""
    h = server
    gate = _Gate()
    instance_id, ex = await _gated_executor(h, gate)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        async with h.store.engine.connect() as conn:
            await _lock(conn, instance_id)
            gate.release.set()
            await _kill_waiter(conn, _FINISH_UPDATE)
        await _settled(h, instance_id)
    finally:
        await ex.close()
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.RUNNING) == 1
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


async def test_at_stop_a_commit_the_store_keeps_refusing_gets_one_more_try_then_exits(
    server: Harness,
) -> None:
    """The final CAS fails, stop is asked, and the one more try fails too: the executor gives
    the commit up and exits instead of waiting for the store; the run stays RUNNING for the
    sweeper to recover."""
    h = server
    gate = _Gate()
    instance_id, ex = await _gated_executor(h, gate)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        async with h.store.engine.connect() as conn:
            await _lock(conn, instance_id)
            gate.release.set()
            first = await _kill_waiter(conn, _FINISH_UPDATE, release=False)
            ex.stop.set()
            await _kill_waiter(conn, _FINISH_UPDATE, release=False, spare=first)
            await asyncio.wait_for(ex.task, timeout=20)
            await conn.rollback()
    finally:
        await ex.close()
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)


async def test_a_lease_extension_the_store_refused_is_tried_again_at_the_next_beat(
    server: Harness,
) -> None:
    """A third of the lease (30 s) has passed, and the heartbeat's extension fails (its
    connection is killed while it waits for a row lock): the next beat extends the lease,
    rather than a third of a lease later."""
    h = server
    gate = _Gate()
    instance_id, ex = await _gated_executor(h, gate, liveness_ttl_s=0.6)  # a beat every 0.2 s
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        h.clock.advance(11_000)
        async with h.store.engine.connect() as conn:
            await _lock(conn, instance_id)
            await _kill_waiter(conn, _LEASE_READ)
        before = await _lease_end(h, instance_id)

        async def extended() -> bool:
            return await _lease_end(h, instance_id) > before

        await until(extended)
        gate.release.set()
        await _settled(h, instance_id)
    finally:
        gate.release.set()
        await ex.close()


async def _lease_end(h: Harness, instance_id: str) -> int:
    row = await h.store.get_instance(instance_id)
    assert row is not None and row.lease_expires_at_ms is not None
    return row.lease_expires_at_ms


async def test_the_heartbeat_fences_a_running_run_but_not_one_whose_end_is_committing(
    h: Harness,
) -> None:
    """Runs stay tracked until their end is committed. Both rows below have left RUNNING at
    their tokens: the run whose agent still runs is fenced and cancelled; the run whose agent
    returned is left to its commit, which decides (and logs) the outcome."""
    for i in range(2):
        await h.trigger(TASKS, "quick", fire_ms=h.clock.now_ms() + i)
    deliveries = await streams.read(h.redis, h.keys, "c1", count=2, block_ms=10)
    running, committing = await (await _intake(h, "c1")).admit(deliveries)
    await h.store.finish_many(
        [
            FinishRequest(r.row.id, r.token, Status.SUCCESS, "done", owner="c1")
            for r in (running, committing)
        ]
    )
    returned = asyncio.create_task(asyncio.sleep(0))
    await returned
    busy = asyncio.create_task(_forever())
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    heartbeat.track(running, busy)
    heartbeat.track(committing, returned)
    await heartbeat.extend(30)
    assert (running.fenced, committing.fenced) == (True, False)
    with pytest.raises(asyncio.CancelledError):
        await busy


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_poison_entry_whose_dead_letter_failed_is_moved_there_by_the_sweeper(
    h: Harness,
) -> None:
    """The executor committed FAILED `poison`, then Redis failed before the entry moved to the
    dead-letter stream: the sweeper moves it there instead of acknowledging it."""
    instance_id, delivery = await _claimed_unrun(h, "c1")
    poison = FinishRequest(
        instance_id, 1, Status.FAILED, "payload_too_large", fail_class=FailClass.POISON
    )
    assert (await h.store.finish_many([poison]))[instance_id].ok
    counts = await h.sweeper().sweep_once()  # "c1" has no liveness key: taken at once
    assert counts.get("dead_letter") == 1
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [(f[b"reason"], f[b"source_id"].decode()) for _, f in dead] == [
        (b"poison", delivery.entry_id)
    ]
    assert (await h.redis.xpending(delivery.stream, GROUP))["pending"] == 0
