"""Readiness markers an agent sets (`ctx.mark_ready`), on real Redis and a real store, clock
passed in: a marker named or dated as no `depends_on` can wait for (`taskstream mark` refuses
the same) is refused with an error naming it, and nothing is stored; an explicit date in the
form the scheduler reads is set."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.outcome import RunEnd
from taskstream.executor.retry import Failure
from taskstream.executor.runner import RunEnv, execute
from tests.integration.harness import Harness
from tests.integration.outages import intake
from tests.integration.scheduler_cases import M0


async def _produce(h: Harness, payload: str) -> RunEnd:
    """Run the `producer` agent once with `payload` (YAML flow mapping) and say how it ended."""
    tasks = f"tasks:\n  - {{id: collect, agent: producer, payload: {payload}}}\n"
    await h.apply(tasks)
    await h.trigger(tasks, "collect", M0)
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    return await execute(run, RunEnv(h.store, h.clock, max_payload_bytes=1 << 20))


@pytest.mark.parametrize(
    ("marker", "day"),
    [
        ("raw.ready", "2026-5-28"),  # the scheduler looks for 2026-05-28
        ("raw.ready", "2026-05-28T00:00:00Z"),
        ("raw.ready", "28.05.2026"),
        ("raw ready", "2026-05-28"),  # no `depends_on` may name it
        ("", "2026-05-28"),
        ("r" * 101, "2026-05-28"),
    ],
)
async def test_a_marker_no_task_could_wait_for_is_refused_and_not_stored(
    store: SqlStore, redis: streams.Redis, keys: Keys, marker: str, day: str
) -> None:
    """It used to be stored (SQLite) or refused by the database with its own words (a date
    too long for the column), and `mark_ready` said True: the agent took its dependants for
    released, and they waited until their windows closed."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    end = await _produce(h, f'{{marker: "{marker}", marker_date: "{day}"}}')
    assert end.failure is Failure.RETRIABLE
    assert (end.error or "").startswith("ValueError: ")
    assert repr(marker if day == "2026-05-28" else day) in (end.error or "")
    assert await store.ready_markers([marker], day) == set()


async def test_a_marker_for_an_explicit_business_date_is_set(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    end = await _produce(h, '{marker: "raw.ready", marker_date: "2026-05-27"}')
    assert end.failure is None and end.result == {"marked": True}
    assert await store.ready_markers(["raw.ready"], "2026-05-27") == {"raw.ready"}
