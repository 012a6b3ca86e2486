"""Shared parts of the outage tests: a harness with a quick task, a gated agent the test
finishes when it wants, and real store failures on MariaDB (the test holds a row lock, finds the
statement waiting for it in PROCESSLIST and kills that connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from random import Random
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache, to_records
from taskstream.core.protocol import Keys
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest
from taskstream.core.store.sql import SqlStore
from taskstream.executor.intake import Intake
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from tests.agents import Params
from tests.integration.harness import Harness, Running, until

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
    timeout: 1h  # tests move the clock on by whole lease thirds; the run must not overrun
"""

# The other connections of this test's database running a statement that starts with :head.
# PROCESSLIST, not INNODB_TRX: the latter is a cache that frequent polling never refreshes.
RUNNING = text(
    "SELECT ID FROM information_schema.PROCESSLIST"
    " WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE :head"
)
CLAIM_READ = "SELECT task_instances.%FOR UPDATE"
FINISH_UPDATE = "UPDATE task_instances %"
LEASE_READ = "SELECT task_instances.id, task_instances.attempt %FOR UPDATE"


async def harness(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    return harness


async def intake(
    h: Harness, consumer: str, held: frozenset[tuple[str, int]] = frozenset()
) -> Intake:
    """An intake for `consumer` whose process holds the claims `held` ((instance id, token))."""
    defs = DefinitionCache(h.store)
    await defs.refresh()
    registry = default_registry(h.registry_modules)
    return Intake(
        h.store, h.redis, h.keys, registry, defs, consumer, held=lambda i, t: (i, t) in held
    )


def intake_of(h: Harness, defs: DefinitionCache) -> Intake:
    """An intake reading as consumer `c1`, holding no run."""
    return Intake(
        h.store,
        h.redis,
        h.keys,
        default_registry(h.registry_modules),
        defs,
        "c1",
        held=lambda _i, _t: False,
    )


async def claimed_unrun(h: Harness, owner: str) -> tuple[str, streams.Delivery]:
    """An instance `owner` read and claimed, as a batch that failed after its claim commit
    leaves it: RUNNING under `owner`, its entry pending, no run."""
    row = await h.trigger(TASKS, "quick")
    [delivery] = await streams.read(h.redis, h.keys, owner, count=1, block_ms=10)
    won = await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner=owner)
    assert won[row.id].token == 1
    return row.id, delivery


async def waiting(conn: AsyncConnection, head: str) -> bool:
    """Another connection is running a statement that starts with `head` (waiting for a row
    lock `conn` holds)."""
    return bool((await conn.execute(RUNNING, {"head": head})).all())


async def kill_waiter(
    conn: AsyncConnection, head: str, *, release: bool = True, spare: int | None = None
) -> int:
    """Kill the one other connection (not `spare`, one killed before) whose statement starts
    with `head` (it waits for a row lock `conn` holds), then release the lock unless told not
    to. Returns the killed connection's id."""
    waiting: list[int] = []

    async def found() -> bool:
        rows = (await conn.execute(RUNNING, {"head": head})).all()
        waiting[:] = [int(i) for (i,) in rows if int(i) != spare]
        return bool(waiting)

    await until(found)
    [thread_id] = waiting
    await conn.execute(text(f"KILL CONNECTION {thread_id:d}"))
    if release:
        await conn.rollback()
    return thread_id


_UNBOUNDED = {
    "mysql": "SET @unbounded = 1 /*M!100300 , SESSION idle_transaction_timeout = 0*/",
    "postgresql": "SET idle_in_transaction_session_timeout = 0",
}
"""Lifts the store's idle transaction bound (`sql_engine.IDLE_TRANSACTION_S`) off a session."""


async def unbounded(conn: AsyncConnection) -> None:
    """Exempt `conn`'s session from the store's idle transaction bound: it stands for another
    program's, whose locks a slow test step must not see the server drop."""
    if (setup := _UNBOUNDED.get(conn.dialect.name)) is not None:
        await conn.execute(text(setup))


async def lock(conn: AsyncConnection, instance_id: str) -> None:
    """Lock the instance's row in `conn`'s transaction until the test ends it, the session
    `unbounded`: a test step slower than the bound (a role's stop under load) must not see
    the lock dropped."""
    await unbounded(conn)
    await conn.execute(
        text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE"), {"id": instance_id}
    )


async def settled(h: Harness, instance_id: str) -> None:
    async def done() -> bool:
        found = await h.store.get_instance(instance_id)
        return found is not None and found.status is Status.SUCCESS

    await until(done)


class Gate:
    """An agent that signals it has started and finishes when the test lets it."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def run(self, ctx: AgentContext, p: Params) -> dict[str, Any]:
        self.started.set()
        await self.release.wait()
        return {"attempt": ctx.attempt}


def gated_runner(h: Harness, gate: Gate, consumer: str = "c1", **config: Any) -> Running:
    """An executor `consumer` whose `gated` agent runs with `gate`."""
    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="gated", params_model=Params, fn=gate.run))
    deps = ExecutorDeps(h.store, h.redis, h.keys, registry, h.clock, Random(7))
    return Running(Executor(deps, ExecutorConfig(consumer=consumer, block_ms=20, **config)))


async def gated_executor(h: Harness, gate: Gate, **config: Any) -> tuple[str, Running]:
    """One `gated` instance and an executor `c1` that runs it with `gate`."""
    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="gated", params_model=Params, fn=gate.run))
    taskfile = parse_task_file_text(GATED, "gated.yaml", known_agents=registry.names())
    await h.store.upsert_definitions(to_records(taskfile))
    row = await h.trigger(GATED, "gated")
    return row.id, gated_runner(h, gate, **config)


async def stopped_with_release_refused(h: Harness, gate: Gate) -> str:
    """A `gated` run on executor `c1` whose stop comes while the run is past the grace (0.1 s):
    the run is cancelled and its release (RETRYING, due now) queued, but the store fails that
    write (its connection is killed while it waits for a row lock the test holds). Returns
    the instance id once the executor has exited; the row is still RUNNING under `c1`."""
    return await _stopped_unwritten(h, gate, finished=False)


async def stopped_with_end_refused(h: Harness, gate: Gate) -> str:
    """A `gated` run on executor `c1` that finishes (its agent returns) just before a stop,
    but whose final commit the store fails (its connection is killed while it waits for a
    row lock the test holds), its last try at the stop too. Returns the instance id once the
    executor has exited; the row is still RUNNING under `c1`, its end written nowhere."""
    return await _stopped_unwritten(h, gate, finished=True)


async def _stopped_unwritten(h: Harness, gate: Gate, *, finished: bool) -> str:
    """A stop whose one write (the run's end when `finished`, else its release) the store
    fails, as the two above say."""
    instance_id, ex = await gated_executor(h, gate, grace_s=0.1, liveness_ttl_s=0.6)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        await _heartbeat_at_rest(h, instance_id)
        async with h.store.engine.connect() as conn:
            await lock(conn, instance_id)
            if finished:
                gate.release.set()
                await until(lambda: waiting(conn, FINISH_UPDATE))
            ex.stop.set()
            await kill_waiter(conn, FINISH_UPDATE, release=False)
            await asyncio.wait_for(asyncio.shield(ex.task), timeout=20)
            await conn.rollback()
    finally:
        await ex.close()
    return instance_id


async def _heartbeat_at_rest(h: Harness, instance_id: str) -> None:
    """Wait for the run's first lease extension, then leave the test's clock standing: no
    heartbeat is due after it, so the only write that waits for a row lock is the run's own."""
    claimed = await lease_end(h, instance_id)

    async def extended() -> bool:
        # An extension in the claim's own millisecond changes nothing, and the test's clock
        # would then never make another due: move it a third of the 30 s lease on until one
        # lands, then let it stand still.
        if await lease_end(h, instance_id) > claimed:
            return True
        h.clock.advance(10_000)
        return False

    await until(extended)


async def lease_end(h: Harness, instance_id: str) -> int:
    row = await h.store.get_instance(instance_id)
    assert row is not None and row.lease_expires_at_ms is not None
    return row.lease_expires_at_ms


@asynccontextmanager
async def finishing_under_lock(
    h: Harness, gate: Gate
) -> AsyncIterator[tuple[str, Running, AsyncConnection]]:
    """A gated run that has started, its row locked by the yielded connection, then its agent
    let go: the run's final CAS waits for the lock. The executor is closed on the way out."""
    instance_id, ex = await gated_executor(h, gate)
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        async with h.store.engine.connect() as conn:
            await lock(conn, instance_id)
            gate.release.set()
            yield instance_id, ex, conn
    finally:
        await ex.close()


async def kill_blocked(redis: streams.Redis, name: str) -> None:
    """Kill the connections of the client named `name` once one is blocked in a command
    (CLIENT LIST flag `b`): that command fails with a connection error."""
    await until(lambda: blocked_in_read(redis, name))
    for client_id in await _blocked(redis, name):
        await redis.client_kill_filter(_id=client_id)


async def blocked_in_read(redis: streams.Redis, name: str) -> bool:
    """Whether a connection of the client named `name` is blocked in a command."""
    return bool(await _blocked(redis, name))


async def _blocked(redis: streams.Redis, name: str) -> list[str]:
    listing: list[dict[str, str]] = await redis.client_list()
    return [c["id"] for c in listing if c.get("name") == name and "b" in c["flags"]]


async def forever() -> None:
    """A stand-in for a run whose agent is still running."""
    await asyncio.Event().wait()


async def no_dead_letters(delivery: streams.Delivery, reason: str, error: str) -> None:
    """A committer's dead-letter hook for tests that expect none."""
    raise AssertionError(f"unexpected dead letter: {reason}")


def fail_next_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next `streams.dead_letter` fails as Redis going away (after the store's move, so
    an entry owes its letter); the one after works again."""
    dead_letter = streams.dead_letter

    async def letter_fails_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(streams, "dead_letter", dead_letter)
        raise RedisConnectionError("redis: connection reset")

    monkeypatch.setattr(streams, "dead_letter", letter_fails_once)
