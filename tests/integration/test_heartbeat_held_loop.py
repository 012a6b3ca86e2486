"""An agent that holds the executor's event loop (CPU-bound work, a blocking call) on real
Redis and a real store: its process still looks alive throughout, so a sweeper does not take
its healthy runs, whose leases still run, for a lost owner's."""

from __future__ import annotations

import threading

import pytest
import redis

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.executor_cases import harness, reach
from tests.integration.harness import Harness, Running

HOG = """
tasks:
  - id: hog
    agent: hog
    timeout: 30s
    payload: {seconds: 2.5}
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


class KeyWatch:
    """Watches a key from a thread of its own (the event loop may be held): whether it was
    ever missing once first seen."""

    def __init__(self, url: str, key: str) -> None:
        self.seen = self.missed = False
        self._client = redis.Redis.from_url(url)
        self._key, self._done = key, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            there = bool(self._client.exists(self._key))
            self.missed |= self.seen and not there
            self.seen |= there

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self._client.close()


async def test_an_agent_holding_the_event_loop_keeps_its_process_alive(
    h: Harness, redis_url: str
) -> None:
    """The agent holds the loop 2.5 s, past the liveness TTL of 1 s: the liveness key must
    not expire meanwhile. It used to (the key was set only from the loop), and a sweeper then
    timed out every run of the process as its owner's, though their leases ran for minutes."""
    await h.apply(HOG)
    row = await h.trigger(HOG, "hog")
    watch = KeyWatch(redis_url, h.keys.alive("c1"))
    ex = Running(h.executor("c1", liveness_ttl_s=1.0))
    try:
        await reach(h, row.id, Status.SUCCESS)
    finally:
        watch.close()
        await ex.close()
    assert watch.seen
    assert not watch.missed, "the liveness key expired while the agent held the loop"
    done = await h.store.get_instance(row.id)
    assert done is not None and done.attempt == 1
