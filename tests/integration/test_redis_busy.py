"""A Redis busy running a long script (another client's, past its `busy-reply-threshold`)
answers every other command `BUSY` until the script ends: an outage like any other to an
executor, waited out, on a private Valkey server so that no other test is held up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from taskstream.core import streams
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.reader import Reader
from taskstream.runtime.embedded import EmbeddedValkey
from tests.integration.executor_cases import TASKS, harness, reach
from tests.integration.harness import Harness, Running

BUSY_AFTER_MS = 50
HELD_US = 1_500_000
SPIN = """
local started = redis.call('TIME')
while true do
  local now = redis.call('TIME')
  if (now[1] - started[1]) * 1000000 + (now[2] - started[2]) > tonumber(ARGV[1]) then
    return 1
  end
end
"""
"""A script that holds the server `ARGV[1]` microseconds."""


@pytest.fixture
def busy_url(tmp_path: Path) -> Iterator[str]:
    with EmbeddedValkey(tmp_path, [f"busy-reply-threshold {BUSY_AFTER_MS}"]) as url:
        yield url


@pytest.fixture
async def h(busy_url: str, store: SqlStore, keys: Keys) -> AsyncIterator[Harness]:
    client = streams.connect(busy_url)
    try:
        yield await harness(store, client, keys)
    finally:
        await client.aclose()


async def _held(url: str) -> threading.Thread:
    """`_hold_server`, returned once the script holds the server (every command meets BUSY)."""
    spinning = _hold_server(url)
    with redis.Redis.from_url(url) as probe:
        while True:  # bounded by the test's timeout
            try:
                probe.ping()
            except redis.exceptions.ResponseError:
                return spinning


def _hold_server(url: str) -> threading.Thread:
    """Run `SPIN` from a thread of its own (its client waits for the whole script)."""

    def spin() -> None:
        with redis.Redis.from_url(url) as client:
            client.eval(SPIN, 0, HELD_US)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread


async def test_an_executor_waits_out_a_redis_busy_running_a_script(
    h: Harness, busy_url: str
) -> None:
    """The executor starts, and reads, while the server is held by a script for 1.5 s: every
    command meets `BUSY`. It used to take the reply for a defect of its own and stop (exit
    code 1), where it waits out a READONLY or an OOM reply. It waits, then runs the work."""
    row = await h.trigger(TASKS, "slow")
    spinning = await _held(busy_url)
    ex = Running(h.executor())
    try:
        await asyncio.to_thread(spinning.join, 20)
        assert not ex.task.done(), "the executor stopped on a BUSY reply"
        await reach(h, row.id, Status.SUCCESS)
    finally:
        if not ex.task.done():
            await ex.close()


async def test_a_recheck_of_own_entries_waits_out_busy(h: Harness, busy_url: str) -> None:
    """After a Redis error an executor reads its own pending list before anything new: a read
    whose reply was lost delivered entries to it. A BUSY reply to that XPENDING used to read
    as an empty list, which ended the recheck, and the entry waited for the sweeper. It is an
    outage: the recheck is tried again once the server answers, and finds the entry."""
    await h.trigger(TASKS, "slow")
    lost = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)  # a reply lost
    reader = Reader(h.redis, h.keys, "c1", 10, set, get_logger(), 6000, h.clock.now_ms)
    reader.redis_failed()
    spinning = await _held(busy_url)
    with pytest.raises(streams.ScriptBusyError):
        await reader.next(4)
    await asyncio.to_thread(spinning.join, 20)
    found = await reader.next(4)
    assert [d.entry_id for d in found] == [d.entry_id for d in lost]
