"""An executor across store failures, on real Redis and a real store: entries it read before a
failure are admitted when the store answers again, its own claims that no run holds are
adopted instead of waiting for their leases to expire, and a finished run whose commit failed
is committed when the store answers again (at stop, after one more try, it is given up), and a
commit that was applied but whose answer was lost is recognised by its retry and acked."""

from __future__ import annotations

import asyncio
from random import Random
from typing import Any

import redis.asyncio as aioredis

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import to_records
from taskstream.core.errors import StoreUnavailable
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.executor.outcome import COMMIT_REFUSED
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from tests.agents import Params
from tests.integration import outages
from tests.integration.executor_cases import reach
from tests.integration.harness import T0, Harness, Running, until
from tests.integration.outages import (
    CLAIM_READ,
    FINISH_UPDATE,
    GATED,
    LEASE_READ,
    TASKS,
    Gate,
    claimed_unrun,
    finishing_under_lock,
    intake,
    kill_blocked,
    kill_waiter,
    lock,
    settled,
    waiting,
)


async def test_an_own_claim_that_no_run_holds_is_adopted(outage: Harness) -> None:
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    [run] = await (await intake(h, "c1")).admit([delivery])
    assert (run.row.id, run.token, run.row.status) == (instance_id, 1, Status.RUNNING)
    assert run.delivery == delivery


async def test_a_run_of_an_earlier_attempt_does_not_stop_the_adoption_of_a_newer_claim(
    outage: Harness,
) -> None:
    """Runs are tracked by claim: a run this process holds at another token of the instance
    does not hold the unrun claim at token 1, so that claim is adopted."""
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    [run] = await (await intake(h, "c1", held=frozenset({(instance_id, 2)}))).admit([delivery])
    assert (run.row.id, run.token) == (instance_id, 1)
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.RUNNING) == 1  # no second claim


async def test_a_claim_held_here_or_made_elsewhere_is_not_adopted(outage: Harness) -> None:
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    assert await (await intake(h, "c1", held=frozenset({(instance_id, 1)}))).admit([delivery]) == []
    assert await (await intake(h, "c2")).admit([delivery]) == []
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt, row.lease_owner) == (
        Status.RUNNING,
        1,
        "c1",
    )


async def test_entries_read_before_the_store_failed_run_once_it_answers(
    outage_server: Harness,
) -> None:
    """The executor's connection is killed while its claim waits for a row lock: the entries
    of that batch are in its pending list, unclaimed. They are claimed and run when the store
    answers again, by the executor alone (no sweeper redelivers them)."""
    h = outage_server
    row = await h.trigger(TASKS, "quick")
    async with h.store.engine.connect() as conn:
        await lock(conn, row.id)
        ex = Running(h.executor("c1"))
        try:
            await kill_waiter(conn, CLAIM_READ)
            await settled(h, row.id)
        finally:
            await ex.close()
    history = await h.store.history(row.id)
    assert [(x.to_status, x.owner) for x in history if x.to_status is Status.RUNNING] == [
        (Status.RUNNING, "c1")
    ]
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


async def test_an_entry_whose_read_reply_was_lost_is_found_in_the_pending_list(
    outage: Harness, redis_url: str
) -> None:
    """Redis delivered an entry to the executor but the reply never arrived: the entry sits in
    its pending list, unseen. After its next Redis error (its blocked read's connection is
    killed) the executor reads its own pending list and runs the entry, without a sweeper."""
    h = outage
    row = await h.trigger(TASKS, "quick")
    [lost] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)  # the lost reply
    name = f"tstest-executor-{h.keys.namespace}"
    client = aioredis.Redis.from_url(redis_url, client_name=name)
    registry = default_registry(h.registry_modules)
    deps = ExecutorDeps(h.store, client, h.keys, registry, h.clock, Random(7))
    ex = Running(Executor(deps, ExecutorConfig(consumer="c1", block_ms=2000)))
    try:
        await kill_blocked(h.redis, name)
        await settled(h, row.id)
    finally:
        await ex.close()
        await client.aclose()
    history = await h.store.history(row.id)
    assert [x.owner for x in history if x.to_status is Status.RUNNING] == ["c1"]
    assert (await h.redis.xpending(lost.stream, GROUP))["pending"] == 0


async def test_after_a_redis_error_duplicates_left_in_the_pending_list_do_not_stall_reading(
    outage: Harness, redis_url: str
) -> None:
    """Three duplicates of runs another consumer holds sit in c1's pending list, older than
    its one running entry. After a Redis error c1 reads its own list: intake leaves the
    duplicates, and c1 goes back to reading new work instead of offering them again for ever
    (no sweeper runs here to ack them)."""
    h = outage
    dups = [await h.trigger(TASKS, "quick", T0 + i) for i in range(3)]
    claims = [ClaimRequest(r.id, 0, 60) for r in dups]
    assert len(await h.store.claim_many(claims, owner="other")) == 3
    assert len(await streams.read(h.redis, h.keys, "c1", count=3, block_ms=10)) == 3
    gate = Gate()
    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="gated", params_model=Params, fn=gate.run))
    taskfile = parse_task_file_text(GATED, "gated.yaml", known_agents=registry.names())
    await h.store.upsert_definitions(to_records(taskfile))
    held = await h.trigger(GATED, "gated")
    name = f"tstest-executor-{h.keys.namespace}"
    client = aioredis.Redis.from_url(redis_url, client_name=name)
    deps = ExecutorDeps(h.store, client, h.keys, registry, h.clock, Random(7))
    ex = Running(Executor(deps, ExecutorConfig(consumer="c1", block_ms=2000, concurrency=2)))
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        await kill_blocked(h.redis, name)
        fresh = await h.trigger(TASKS, "quick", T0 + 10)
        await settled(h, fresh.id)
        gate.release.set()
        await settled(h, held.id)
    finally:
        gate.release.set()
        await ex.close()
        await client.aclose()
    for row in dups:
        found = await h.store.get_instance(row.id)
        assert found is not None and (found.status, found.lease_owner) == (Status.RUNNING, "other")


async def test_a_finished_run_whose_commit_failed_is_committed_once_the_store_answers(
    outage_server: Harness,
) -> None:
    """The executor's connection is killed while its final CAS waits for a row lock: the run's
    end is written again when the store answers (one run, one SUCCESS), instead of being
    dropped and left RUNNING until its lease expires."""
    h = outage_server
    async with finishing_under_lock(h, Gate()) as (instance_id, _, conn):
        await kill_waiter(conn, FINISH_UPDATE)
        await settled(h, instance_id)
    history = await h.store.history(instance_id)
    assert [x.to_status for x in history].count(Status.RUNNING) == 1
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


async def test_at_stop_a_commit_the_store_keeps_refusing_gets_one_more_try_then_exits(
    outage_server: Harness,
) -> None:
    """The final CAS fails, stop is asked, and the one more try fails too: the executor gives
    the commit up and exits instead of waiting for the store; the run stays RUNNING for the
    sweeper to recover."""
    h = outage_server
    async with finishing_under_lock(h, Gate()) as (instance_id, ex, conn):
        # The heartbeat's lease extension, due at once on this clock, waits for the lock too:
        # the exit must not wait for it (nothing kills it; the lock is held to the end).
        h.clock.advance(60_000)
        await until(lambda: waiting(conn, LEASE_READ))
        first = await kill_waiter(conn, FINISH_UPDATE, release=False)
        ex.stop.set()
        await kill_waiter(conn, FINISH_UPDATE, release=False, spare=first)
        await asyncio.wait_for(ex.task, timeout=20)
        await conn.rollback()
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)


async def test_at_stop_a_commit_the_store_holds_up_does_not_hold_the_exit_up(
    outage_server: Harness,
) -> None:
    """A finished run's final CAS waits for a row lock (InnoDB would wait 50 s) when the stop
    comes, and no error ends the wait: the executor gives the commit `STEP_END_S`, cancels
    it and exits; the run stays RUNNING for the sweeper to recover."""
    h = outage_server
    async with finishing_under_lock(h, Gate()) as (instance_id, ex, conn):
        await until(lambda: waiting(conn, FINISH_UPDATE))
        ex.stop.set()
        stopped, _ = await asyncio.wait({ex.task}, timeout=15)
        await conn.rollback()
    assert ex.task in stopped, "the stop waited for the row lock"
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)


async def test_a_release_at_stop_that_the_store_keeps_refusing_does_not_hold_the_exit_up(
    outage_server: Harness,
) -> None:
    """Stop is asked while a run is past the grace: it is cancelled and its release (RETRYING,
    due now) is queued after the grace, but the store fails that write. The release is not
    retried until the store answers: the executor exits, and the run stays RUNNING for the
    sweeper to release, as the executor noted in Redis."""
    h = outage_server
    instance_id = await outages.stopped_with_release_refused(h, Gate())
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)
    assert await h.redis.get(h.keys.released(instance_id, 1)) == b"c1"


class _AnswerLost(SqlStore):
    """The real store, except that its next `finish_many` is applied and committed, then
    answered with `StoreUnavailable`: the link dropped after the server's COMMIT, before its
    reply reached the executor."""

    lose = 1

    async def finish_many(self, requests: list[FinishRequest]) -> dict[str, CasResult]:
        results = await super().finish_many(requests)
        if self.lose > 0:
            self.lose -= 1
            raise StoreUnavailable("store: connection lost after COMMIT")
        return results


async def test_a_commit_applied_but_unanswered_is_recognised_and_acked(
    db_url: str, redis: streams.Redis, keys: Keys
) -> None:
    """The retry of such a commit loses its CAS to the run's own earlier try: the history
    shows the run's own move, so the run counts as committed and its entry is acked at once
    (not left pending for the sweeper, logged as fenced)."""
    store = await _AnswerLost.connect(db_url)
    try:
        h = await outages.harness(store, redis, keys)
        row = await h.trigger(outages.TASKS, "quick")
        ex = Running(h.executor())
        stream = h.keys.stream(Priority.DEFAULT)

        async def acked() -> bool:
            return int((await h.redis.xpending(stream, GROUP))["pending"]) == 0

        try:
            await outages.settled(h, row.id)
            await until(acked)
        finally:
            await ex.close()
        assert store.lose == 0
        history = await store.history(row.id)
        assert [(x.from_status, x.to_status) for x in history][-1] == (
            Status.RUNNING,
            Status.SUCCESS,
        )
        assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    finally:
        await store.close()


REFUSED = """
tasks:
  - {id: good, agent: both-started}
  - {id: refused, agent: both-started, payload: {effect: refused}}
"""


async def test_a_finish_the_store_refuses_does_not_fail_the_runs_batched_with_it(
    outage_server: Harness,
) -> None:
    """Two runs end together, in one commit batch; MariaDB refuses one of them (a
    side-effect key longer than its column, recorded past `once`): the other is committed on
    its own, and the refused one ends FAILED `fatal`, its error naming the refusal, instead
    of staying RUNNING until its lease lapses and its agent runs again."""
    h = outage_server
    started: list[str] = []
    together = asyncio.Event()

    async def both_started(ctx: AgentContext, p: Params) -> dict[str, Any]:
        started.append(ctx.instance_id)
        if len(started) == 2:
            together.set()
        await together.wait()
        if p.effect:
            ctx.side_effects.append("x" * 300)
        return {}

    registry = default_registry(h.registry_modules)
    registry.register(FunctionAgent(name="both-started", params_model=Params, fn=both_started))
    taskfile = parse_task_file_text(REFUSED, "t.yaml", known_agents=registry.names())
    await h.store.upsert_definitions(to_records(taskfile))
    good = await h.trigger(REFUSED, "good")
    refused = await h.trigger(REFUSED, "refused")
    deps = ExecutorDeps(h.store, h.redis, h.keys, registry, h.clock, Random(7))
    ex = Running(Executor(deps, ExecutorConfig(consumer="c1", block_ms=20, concurrency=2)))
    try:
        await settled(h, good.id)
        await reach(h, refused.id, Status.FAILED)
    finally:
        await ex.close()
    ended = await h.store.get_instance(refused.id)
    assert ended is not None
    assert (ended.status, ended.fail_class) == (Status.FAILED, FailClass.FATAL)
    assert ended.last_error is not None and "the store refused this run's end" in ended.last_error
    assert (await h.store.history(refused.id))[-1].reason == COMMIT_REFUSED
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0
