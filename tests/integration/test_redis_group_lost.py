"""The consumer group of one work stream disappears (XGROUP DESTROY, the stream key deleted or
evicted) under a live executor: entries it has already been delivered from the other streams
are run, not left in its pending list for the sweeper to find idle and deliver again."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import Status
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import TASKS


async def test_an_entry_read_before_a_missing_group_is_run(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `low` stream's group is destroyed right after the executor made the groups. Its
    first read walks `high`, then `default`, which delivers the instance's entry, then `low`,
    which Redis answers NOGROUP. The executor makes the group again and runs the entry it was
    delivered (no sweeper runs here: an entry left pending would never run)."""
    h = outage
    row = await h.trigger(TASKS, "quick")
    ensure = streams.ensure_groups
    calls: list[int] = []

    async def then_lost(redis: streams.Redis, keys: Keys) -> None:
        await ensure(redis, keys)
        calls.append(1)
        if len(calls) == 1:  # the executor's own start
            await redis.xgroup_destroy(keys.stream(Priority.LOW), GROUP)

    monkeypatch.setattr(streams, "ensure_groups", then_lost)
    running = Running(h.executor(concurrency=4))
    try:

        async def done() -> bool:
            found = await h.store.get_instance(row.id)
            return found is not None and found.status is Status.SUCCESS

        await until(done, timeout_s=10)
        assert len(calls) >= 2  # the executor met NOGROUP and made the groups again
    finally:
        await running.close()
    pending: Any = await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP)
    assert pending["pending"] == 0
