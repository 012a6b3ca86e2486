"""`explain --at` a fire time of a long outage that one `missed` record summarises, on real
Redis and a real store with the clock passed in."""

from __future__ import annotations

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.trail import decision_trail, nearest_decided_fire
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import M0, make

MINUTE = 60_000


async def test_a_fire_time_inside_a_summarised_outage_is_explained_by_its_summary(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A day of downtime of a per-minute task leaves one `missed` record, at the first missed
    fire time, standing for the ticks up to the catch-up horizon. Asked about one of those
    ticks, explain must show that record (the tick was missed), not the tick after the
    horizon that happens to be nearer and ran."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply("""
tasks:
  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 30s,
     catchup: {max_delay: 10m, mode: latest}}
""")
    s = make(h)
    await s.run_pass()
    h.clock.advance(24 * 60 * MINUTE)  # down for a day
    await s.run_pass()
    summary = next(
        d for d in await store.decisions("minutely", limit=1000) if d.decision == "missed"
    )
    first, last = summary.details["first_fire_ms"], summary.details["last_fire_ms"]
    assert summary.fire_time_ms == first == M0 + MINUTE and summary.details["count"] is None
    asked = last - 2 * MINUTE  # a missed tick much nearer the ticks after the horizon

    fire_ms = await nearest_decided_fire(store, "minutely", asked)

    assert fire_ms == first
    trail = await decision_trail(store, "minutely", fire_ms)
    assert [d.decision for d in trail] == ["missed"]
    assert trail[0].details["last_fire_ms"] >= asked
