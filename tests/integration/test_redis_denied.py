"""A Redis whose ACL denies a role a command or a key (NOPERM) it needs to move an entry to
the dead-letter stream: the executor and the sweeper log `redis.denied` naming the command,
leave the entry pending (neither acked nor lost), go on with the other work, and move it once
the permission is given back. Each test makes an ACL user of its own on the real server."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from random import Random
from typing import Any

import pytest
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.definitions import to_records
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest
from taskstream.executor.sweeper import Sweeper, SweeperConfig
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import TASKS
from tests.support.acl import acl, acl_user, namespace_rules

WAIT_S = 10.0


def no_xadd(keys: Keys) -> tuple[list[str], list[str], str]:
    """The rules denying XADD, those that give it back, and the command a denial names."""
    return [*namespace_rules(keys), "-xadd"], ["+xadd"], "XADD"


def no_dead_key(keys: Keys) -> tuple[list[str], list[str], str]:
    """The rules allowing every key of the namespace but the dead-letter stream, those that
    give it back, and the command a denial names: the script's, whose keys are refused."""
    allowed = [f"~{keys.base}:{kind}:*" for kind in ("stream", "alive", "released")]
    return [*allowed, f"&{keys.control}", "+@all"], [f"~{keys.dead}"], "EVALSHA"


RULES = [no_xadd, no_dead_key]


async def junk_pending(h: Harness, consumer: str = "gone") -> str:
    """An entry that does not decode, delivered to `consumer` and pending there."""
    stream = h.keys.stream(Priority.DEFAULT)
    entry_id = streams.as_text(await h.redis.xadd(stream, {"v": "99", "junk": "x"}))
    await h.redis.xreadgroup(GROUP, consumer, {stream: ">"}, count=1)
    return entry_id


async def settled_pending(h: Harness) -> str:
    """The entry of an instance that has SUCCEEDED, still pending for a gone consumer."""
    row = await h.trigger(TASKS, "quick")
    [delivery] = await streams.read(h.redis, h.keys, "gone", count=1, block_ms=10)
    await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner="gone")
    moved = await h.store.transition(row.id, Status.RUNNING, Status.SUCCESS, reason="t", attempt=1)
    assert moved.ok
    return delivery.entry_id


async def pending_ids(h: Harness) -> set[str]:
    found = await admin.pending(h.redis, h.keys.stream(Priority.DEFAULT), count=100)
    return {p.entry_id for p in found}


def denials(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "redis.denied"]


@pytest.mark.parametrize("rules", RULES, ids=lambda r: r.__name__)
async def test_a_denied_dead_letter_leaves_the_entry_and_the_sweeper_sweeps_on(
    outage: Harness, redis_url: str, rules: Any
) -> None:
    h = outage
    deny, grant, command = rules(h.keys)
    junk = await junk_pending(h)
    settled = await settled_pending(h)
    async with acl_user(h.redis, redis_url, deny) as (user, client):
        sweeper = Sweeper(
            h.store,
            client,
            h.keys,
            h.clock,
            SweeperConfig(interval_s=0.05, min_idle_ms=0),
            Random(7),
        )
        stop = asyncio.Event()
        with capture_logs() as logs:
            sweeping = asyncio.create_task(sweeper.run(stop))
            try:

                async def settled_acked() -> bool:
                    return settled not in await pending_ids(h) or sweeping.done()

                await until(settled_acked, WAIT_S)
                assert not sweeping.done(), sweeping.exception()
                assert junk in await pending_ids(h)  # neither acked nor lost
                assert await h.redis.xlen(h.keys.dead) == 0
                [denied, *_] = denials(logs)
                assert denied["log_level"] == "error" and denied["entry_id"] == junk
                assert denied["command"] == command and "NOPERM" in denied["reply"]

                await acl(h.redis, "SETUSER", user, *grant)
                h.clock.advance(120_000)  # past the longest pause of a denied entry

                async def dead_lettered() -> bool:
                    return bool(await h.redis.xlen(h.keys.dead)) or sweeping.done()

                await until(dead_lettered, WAIT_S)
                assert not sweeping.done(), sweeping.exception()
                assert junk not in await pending_ids(h)
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(sweeping, return_exceptions=True), 20)


@pytest.mark.parametrize("rules", RULES, ids=lambda r: r.__name__)
async def test_a_denied_dead_letter_leaves_the_entry_and_the_executor_runs_on(
    outage: Harness, redis_url: str, rules: Any
) -> None:
    h = outage
    deny, _grant, command = rules(h.keys)
    stream = h.keys.stream(Priority.DEFAULT)
    junk = streams.as_text(await h.redis.xadd(stream, {"v": "99", "junk": "x"}))
    row = await h.trigger(TASKS, "quick")
    async with acl_user(h.redis, redis_url, deny) as (_user, client):
        with capture_logs() as logs:
            running = Running(replace(h, redis=client).executor())
            try:

                async def done() -> bool:
                    found = await h.store.get_instance(row.id)
                    ended = found is not None and found.status is Status.SUCCESS
                    return (ended and not await pending_ids(h) - {junk}) or running.task.done()

                await until(done, WAIT_S)
                assert not running.task.done(), running.task.exception()
            finally:
                running.stop.set()
                await asyncio.wait_for(asyncio.gather(running.task, return_exceptions=True), 30)
        assert await pending_ids(h) == {junk}  # neither acked nor lost
        assert await h.redis.xlen(h.keys.dead) == 0
        [denied] = [e for e in denials(logs) if e.get("entry_id") == junk]
        assert denied["log_level"] == "error" and denied["command"] == command


HIGH = """
tasks:
  - id: urgent
    agent: slow
    priority: high
    retry: {max_attempts: 1}
    payload: {seconds: 0}
"""


async def test_entries_read_before_a_stream_the_read_is_denied_run(
    outage: Harness, redis_url: str
) -> None:
    """A read walks the streams one by one: the entry it was given from `high` before Redis
    denied it `default` (an ACL changed under the running executor) is this consumer's,
    pending for it, and must run, not wait for the sweeper, which would count it as a
    delivery never claimed (and in the end fail its instance as poison)."""
    h = outage
    high = h.keys.stream(Priority.HIGH)
    await h.store.upsert_definitions(to_records(parse_task_file_text(HIGH, "t.yaml")))
    allowed = [f"~{high}", f"~{h.keys.base}:alive:*", f"~{h.keys.base}:released:*"]
    async with acl_user(h.redis, redis_url, namespace_rules(h.keys)) as (user, client):
        with capture_logs() as logs:
            running = Running(replace(h, redis=client).executor())
            try:

                async def started() -> bool:
                    return any(e["event"] == "executor.started" for e in logs)

                await until(started, WAIT_S)
                await acl(h.redis, "SETUSER", user, "resetkeys", *allowed)
                row = await h.trigger(HIGH, "urgent")

                async def done() -> bool:
                    found = await h.store.get_instance(row.id)
                    return (found is not None and found.status is Status.SUCCESS) or (
                        running.task.done()
                    )

                await until(done, WAIT_S)
                assert not running.task.done(), running.task.exception()
            finally:
                running.stop.set()
                await asyncio.wait_for(asyncio.gather(running.task, return_exceptions=True), 30)
    assert (await h.redis.xpending(high, GROUP))["pending"] == 0
    assert any(e["command"] == "XREADGROUP" for e in denials(logs))  # still told
