"""Redis emptied (FLUSHDB) while instances are queued, running and waiting to retry: the store
is the source of truth, so every instance still reaches SUCCESS, once.

The test runs its own Valkey server so that FLUSHDB touches nothing another test uses.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskstream.core.states import SETTLED, Status
from taskstream.runtime.embedded import EmbeddedValkey
from tests.fault.conftest import Cluster, RecordProperty, rows_to, running_rows

log = logging.getLogger(__name__)

SLOW = 15
FLAKY = 15
RECONCILER_GRACE_S = 15
"""Rows whose entry vanished are published again once untouched this long (the default)."""

TASKS = """
tasks:
  - id: slow
    agent: slow
    payload: {seconds: 0.5}
  - id: flaky
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s, factor: 1}, jitter: 0}
    payload: {fail_until: 1}
"""


@pytest.fixture
def roles_redis_url(tmp_path: Path) -> Iterator[str]:
    """A Valkey server of this test's own."""
    with EmbeddedValkey(tmp_path / "valkey") as url:
        yield url


@pytest.mark.timeout(180)
async def test_redis_emptied_in_flight_loses_nothing(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    await cluster.apply(TASKS)
    cluster.start("scheduler")
    cluster.start("sweeper")
    cluster.start("executor")
    cluster.start("executor")
    await cluster.ready()
    instances = [await cluster.emit("slow", i) for i in range(SLOW)]
    instances += [await cluster.emit("flaky", i) for i in range(FLAKY)]

    async def some_done() -> bool:
        return bool(await cluster.settled(instances))

    await cluster.until(some_done, timeout_s=30, what="a first instance settled")
    await cluster.redis.flushdb()
    at_flush = Counter(
        str(row.status)
        for row in [await cluster.store.get_instance(i) for i in instances]
        if row is not None
    )
    record_property("status_at_flush", dict(at_flush))
    log.info("redis.flushed status_at_flush=%s", dict(at_flush))
    assert sum(n for s, n in at_flush.items() if Status(s) not in SETTLED) > 0

    async def all_settled() -> bool:
        return len(await cluster.settled(instances)) == len(instances)

    await cluster.until(all_settled, timeout_s=RECONCILER_GRACE_S + 75, what="all settled")

    for instance in instances:
        row = await cluster.store.get_instance(instance)
        assert row is not None and row.status is Status.SUCCESS, (instance, row)
        history = await cluster.store.history(instance)
        assert len(rows_to(history, Status.SUCCESS)) == 1
        assert len(running_rows(history)) == row.attempt
    assert all(r.alive for r in cluster.roles)
    await cluster.drained()
