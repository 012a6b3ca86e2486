"""Dead letters Redis lost (restored from an older snapshot, restarted without its data,
flushed): the store still shows their instances FAILED `poison`. `dead list` lists them as
lost, `dead replay INSTANCE_ID` and `dead replay --all` requeue them, and `status` counts
them; real Redis, real store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import update

from taskstream.cli import ops_cmds
from taskstream.core import lost_letters, operations, streams
from taskstream.core.errors import TaskstreamError
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import task_instances
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness, until
from tests.integration.test_operations import _Cluster, _poisoned_unclaimed
from tests.support.keyspace import drop_keys

TASKS = """
tasks:
  - id: late-agent
    agent: flaky
  - id: steady
    agent: flaky
  - id: other
    agent: flaky
  - id: dated
    agent: flaky
    deadline: 1h
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    return harness


@pytest.fixture
async def emptied(h: Harness) -> AsyncIterator[Harness]:
    """The same store over a Redis that lost everything: a key prefix nothing wrote to."""
    keys = Keys(prefix=h.keys.prefix, namespace=h.keys.namespace + "e")
    again = Harness(h.store, h.redis, keys, clock=h.clock)
    await streams.ensure_groups(again.redis, keys)
    yield again
    await drop_keys(h.redis, keys)


async def _poisoned_by_an_unknown_agent(h: Harness, task_id: str = "late-agent") -> InstanceRow:
    """An executor that does not know the task's agent fails the instance as poison and
    dead-letters its entry (the agent is deployed later: the harness's executors know it)."""
    row = await h.trigger(TASKS, task_id)
    h.registry_modules = ()
    try:
        await h.run_until(row.id, Status.FAILED)
    finally:
        h.registry_modules = ("tests.agents",)

    async def lettered() -> bool:
        return await h.redis.xlen(h.keys.dead) == 1

    await until(lettered)
    failed = await h.store.get_instance(row.id)
    assert failed is not None and failed.fail_class is FailClass.POISON
    return failed


async def _lost(h: Harness, **kwargs: Any) -> list[lost_letters.LostLetter]:
    return [x async for x in lost_letters.lost_letters(h.store, h.redis, h.keys.dead, **kwargs)]


@pytest.mark.parametrize("how", ["xdel", "emptied"])
async def test_a_lost_letter_is_listed_and_its_replay_runs_the_instance(
    h: Harness, emptied: Harness, db_url: str, redis_url: str, how: str
) -> None:
    row = await _poisoned_by_an_unknown_agent(h)
    if how == "xdel":
        [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
        await h.redis.xdel(h.keys.dead, letter.dead_id)
    else:
        h = emptied
    assert await operations.dead_letters(h.redis, h.keys.dead, limit=10) == []

    [lost] = await _lost(h)
    assert (lost.row.id, lost.row.attempt, lost.reason) == (row.id, row.attempt, "unknown_agent")
    listed = await run_cli(h, db_url, redis_url, "dead", "list", "--json")
    assert listed.exit_code == 0, listed.output
    [shown] = json.loads(listed.stdout)
    assert (shown["lost"], shown["dead_id"], shown["instance_id"]) == (True, None, row.id)
    assert (shown["reason"], shown["task_id"], shown["failed_at_ms"]) == (
        "unknown_agent",
        "late-agent",
        row.updated_at_ms,
    )
    human = await run_cli(h, db_url, redis_url, "dead", "list")
    assert "lost" in human.stdout and row.id in human.stdout
    status = await run_cli(h, db_url, redis_url, "status", "--json")
    assert (json.loads(status.stdout)["dead"], json.loads(status.stdout)["lost_letters"]) == (0, 1)

    replayed = await run_cli(h, db_url, redis_url, "dead", "replay", row.id)

    assert replayed.exit_code == 0, replayed.output
    assert replayed.stdout == f"{row.id} (lost letter): requeued\n"
    await h.run_until(row.id, Status.SUCCESS)
    assert await _lost(h) == []
    history = await h.store.history(row.id)
    assert [x.note for x in history if x.reason == "requeued"] == ["replay of a lost dead letter"]


async def test_only_a_failure_no_letter_records_is_lost(h: Harness) -> None:
    """A letter on the stream records its instance's failure; one of an earlier life (the
    instance was retried by hand since, and failed as poison again) records none of this
    one, and a failure of another class never had a letter."""
    recorded = await h.trigger(TASKS, "steady")
    await _poisoned_unclaimed(h, recorded.id, attempt=0)
    assert await _lost(h) == []
    now_ms = h.clock.now_ms()
    await operations.requeue(h.outbox, recorded.id, who="ops", why="fixed", now_ms=now_ms)
    await _poisoned_unclaimed(h, recorded.id, attempt=1)
    assert await _lost(h) == []
    _, new = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    await h.redis.xdel(h.keys.dead, new.dead_id)
    fatal = await h.trigger(TASKS, "other")
    assert fatal.id in await h.store.claim_many([ClaimRequest(fatal.id, 0, 60)], owner="c2")
    failed = await h.store.finish(
        fatal.id, token=1, dst=Status.FAILED, reason="failed", fail_class=FailClass.FATAL
    )
    assert failed.ok

    [lost] = await _lost(h)
    assert (lost.row.id, lost.row.attempt) == (recorded.id, 1)
    with pytest.raises(TaskstreamError, match=r"failed fatal, not as poison: .*`taskstream retry"):
        await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, fatal.id)
    assert await lost_letters.replay_lost(h.outbox, lost, who="ops", now_ms=now_ms) == "requeued"
    after = await h.store.get_instance(recorded.id)
    assert after is not None and (after.status, after.attempt) == (Status.DISPATCHED, 2)


async def test_replaying_an_instance_whose_letter_is_there_names_the_letter(h: Harness) -> None:
    row = await h.trigger(TASKS, "steady")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    with pytest.raises(TaskstreamError, match=f"its dead letter {letter.dead_id} is on the stream"):
        await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, row.id)
    with pytest.raises(TaskstreamError, match="no instance with id 'i_nobody'"):
        await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, "i_nobody")
    running = await h.trigger(TASKS, "other")
    with pytest.raises(TaskstreamError, match="is DISPATCHED: only an instance FAILED poison"):
        await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, running.id)


async def test_a_lost_letter_requeued_meanwhile_is_left_as_it_is(h: Harness) -> None:
    row = await h.trigger(TASKS, "steady")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    await h.redis.delete(h.keys.dead)
    lost = await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, row.id)
    now_ms = h.clock.now_ms()
    await operations.requeue(h.outbox, row.id, who="ops", why="by hand", now_ms=now_ms)

    said = await lost_letters.replay_lost(h.outbox, lost, who="ops", now_ms=now_ms)

    assert said == "requeued meanwhile (DISPATCHED), left as it is"
    history = await h.store.history(row.id)
    assert [x.note for x in history if x.reason == "requeued"] == ["by hand"]


async def _failed_at(store: SqlStore, instance_id: str, at_ms: int) -> None:
    async with store.engine.begin() as conn:
        stmt = update(task_instances).where(task_instances.c.id == instance_id)
        await conn.execute(stmt.values(updated_at_ms=at_ms))


async def test_lost_letters_come_latest_failure_first_up_to_a_time(h: Harness) -> None:
    rows = [await h.trigger(TASKS, task) for task in ("late-agent", "steady", "other")]
    for n, row in enumerate(rows):
        await _poisoned_unclaimed(h, row.id, attempt=0)
        await _failed_at(h.store, row.id, 1_000 * (n + 1))
    await h.redis.delete(h.keys.dead)
    assert [x.row.id for x in await _lost(h)] == [r.id for r in reversed(rows)]
    assert [x.row.id for x in await _lost(h, failed_until_ms=2_000)] == [rows[1].id, rows[0].id]
    latest = lost_letters.latest_lost
    two = await latest(h.store, h.redis, h.keys.dead, examine=2)
    assert ([x.row.id for x in two.lost], two.examined, two.all_examined) == (
        [rows[2].id, rows[1].id],
        2,
        False,
    )
    every = await latest(h.store, h.redis, h.keys.dead, examine=5)
    assert (len(every.lost), every.examined, every.all_examined) == (3, 3, True)
    first = await latest(h.store, h.redis, h.keys.dead, examine=5, count=1)
    assert ([x.row.id for x in first.lost], first.examined, first.all_examined) == (
        [rows[2].id],
        1,
        False,
    )


async def test_replay_all_requeues_the_lost_letters_too(
    h: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--all` replays the letters on the stream, then requeues each instance whose letter
    was lost, judged the same way: a failure a letter still records is the letter's."""
    kept = await h.trigger(TASKS, "steady")
    await _poisoned_unclaimed(h, kept.id, attempt=0)
    lost = await h.trigger(TASKS, "other")
    await _poisoned_unclaimed(h, lost.id, attempt=0)
    [_, gone] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    await h.redis.xdel(h.keys.dead, gone.dead_id)

    await ops_cmds._replay_all(_Cluster(h.store, h.redis, h.keys))  # type: ignore[arg-type]

    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"{lost.id} (lost letter): requeued"]
    assert lines[0].endswith(": requeued")
    for row in (kept, lost):
        after = await h.store.get_instance(row.id)
        assert after is not None and after.status is Status.DISPATCHED
    assert await h.redis.xlen(h.keys.dead) == 0


async def test_replay_all_counts_the_lost_letters_it_cannot_requeue(
    h: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """An instance past its deadline is left FAILED (its new attempt would time out before
    it starts): `--all` says so on its line, goes on, and exits 1 at the end."""
    late = await h.trigger(TASKS, "dated")
    assert late.deadline_ms is not None and late.deadline_ms < h.clock.now_ms()
    await _poisoned_unclaimed(h, late.id, attempt=0)
    lost = await h.trigger(TASKS, "other")
    await _poisoned_unclaimed(h, lost.id, attempt=0)
    await _failed_at(h.store, late.id, 1_000)
    await _failed_at(h.store, lost.id, 2_000)
    await h.redis.delete(h.keys.dead)

    with pytest.raises(TaskstreamError, match=r"^1 of 2 lost letters not replayed$"):
        await ops_cmds._replay_all(_Cluster(h.store, h.redis, h.keys))  # type: ignore[arg-type]

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{lost.id} (lost letter): requeued"
    assert lines[1].startswith(f"{late.id} (lost letter): not replayed: instance {late.id} is")
    assert "past its deadline" in lines[1]
    after = await h.store.get_instance(late.id)
    assert after is not None and after.status is Status.FAILED
