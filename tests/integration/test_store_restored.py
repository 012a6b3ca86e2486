"""A store restored from a backup older than Redis's streams (in-process, clock passed in):
the store is the truth, so an entry of an attempt its row never reached is no run of it, and
must not keep the reconciler from publishing the row's own attempt again."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import Keys, Priority, decode, encode
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.executor_cases import TASKS, harness, run_until
from tests.integration.harness import Harness


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def test_an_entry_of_an_attempt_the_row_never_reached_is_acked_and_the_row_published(
    h: Harness,
) -> None:
    """The backup has the instance DISPATCHED at attempt 0; Redis has only the entry of its
    third attempt, read by a consumer that died. The sweeper acks that entry, and the
    reconciler publishes attempt 0, which then runs."""
    row = await h.trigger(TASKS, "slow")
    stream = h.keys.stream(Priority.DEFAULT)
    await h.redis.delete(stream)  # its entry of attempt 0 was acked after the backup
    await streams.ensure_groups(h.redis, h.keys)
    later = row_entry(row, h.clock.now_ms()).model_copy(update={"attempt": 2})
    await h.redis.xadd(stream, encode(later))  # type: ignore[arg-type]
    assert len(await streams.read(h.redis, h.keys, "gone", count=1, block_ms=10)) == 1
    h.clock.advance(60_000)  # the row is past the reconciler's grace

    counts = await h.sweeper().sweep_once()

    assert (counts.get("ack"), counts["republished"]) == (1, 1)
    entries: Any = await h.redis.xrange(stream)
    assert [(decode(f).instance_id, decode(f).attempt) for _, f in entries] == [(row.id, 0)]
    await run_until(h, h.executor(), [row.id], Status.SUCCESS)
