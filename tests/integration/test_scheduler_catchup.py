"""Catch-up after downtime on real Redis and a real store, clock passed in: `latest` runs
only the newest tick and `all` the newest burst, however many chunks the backlog takes,
`only_if_ready` waits for the marker, and an older tick still waiting is not a newer tick on
time."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import advance, manual
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import DAY0, M0, make


async def test_downtime_catch_up_latest_runs_only_the_newest(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply("""
tasks:
  - {id: latest, agent: echo, schedule: {every: 1m}, window: 30s,
     catchup: {max_delay: 10m, mode: latest}}
  - {id: all, agent: echo, schedule: {every: 1m}, window: 30s,
     catchup: {max_delay: 10m, mode: all}}
""")
    s = make(h)
    await s.run_pass()
    h.clock.advance(15 * 60_000)  # down for 15 minutes
    await s.run_pass()
    latest = [d.decision for d in await store.decisions("latest", limit=100)]
    every = [d.decision for d in await store.decisions("all", limit=100)]
    assert latest.count("missed") == 5 and every.count("missed") == 5
    # 5 missed (older than max_delay), 9 caught up per mode, the 15th tick is on time.
    assert latest.count("should_run") == 1 and latest.count("coalesced") == 9
    assert every.count("should_run") == 10
    runs = await store.list_instances(task_id="latest", status=Status.DISPATCHED)
    assert [r.scheduled_for_ms for r in runs] == [M0 + 15 * 60_000]
    h.clock.advance(45_000)  # the 15th tick's window closes; nothing new was missed
    await s.run_pass()
    assert len(await store.list_instances(task_id="latest", status=Status.DISPATCHED)) == 1
    skipped = await store.list_instances(task_id="latest", status=Status.SKIPPED)
    assert len(skipped) == 5
    spec = next(t for t in (await h.definitions()) if t.id == "latest")
    done = await manual.backfill(
        h.outbox, spec, from_ms=M0 + 60_000, to_ms=M0 + 5 * 60_000, now_ms=h.clock.now_ms()
    )
    assert done.published == 5  # a missed tick can still be run on purpose


READY_CATCHUP = """
tasks:
  - id: ready
    agent: echo
    schedule: {every: 1m}
    window: 30s
    depends_on: [raw.ready]
    catchup: {max_delay: 1h, mode: latest, only_if_ready: true}
"""


@pytest.mark.parametrize("marked", [True, False])
async def test_catch_up_only_if_ready_with_a_marker_set_late(
    store: SqlStore, redis: streams.Redis, keys: Keys, marked: bool
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(READY_CATCHUP)
    s = make(h)
    await s.run_pass()
    h.clock.advance(10 * 60_000 - 1)  # down for ten minutes; the last tick's window closed
    h.clock.advance(45_000)
    if marked:  # the data arrived late, while no scheduler ran
        await store.mark_ready("raw.ready", "2026-05-28")
    await s.run_pass()
    last = [d for d in await store.decisions("ready", limit=100)][-1]
    runs = await store.list_instances(task_id="ready", status=Status.DISPATCHED)
    if marked:
        assert last.decision == "should_run"
        assert [r.scheduled_for_ms for r in runs] == [M0 + 10 * 60_000]
    else:
        assert last.decision == "skip_dep"
        assert runs == []


async def chunked_backlog(h: Harness, mode: str, down_s: int, passes: int) -> list[int]:
    """`every: 1s` task `sec` (window 1 s, catch-up `mode`) whose scheduler was down for
    `down_s` seconds after its first pass; `passes` passes later, the fire times (s after
    DAY0) that have an instance. The caller bounds the ticks per pass."""
    h.clock.set(DAY0 - 500)
    await h.apply(
        "tasks:\n  - {id: sec, agent: echo, schedule: {every: 1s}, window: 1s,"
        f" concurrency: allow, catchup: {{enabled: true, max_delay: 1h, mode: {mode}}}}}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(DAY0 + down_s * 1000 + 500)
    for _ in range(passes):
        await s.run_pass()
    rows = await h.store.list_instances(limit=1000)
    return sorted((r.scheduled_for_ms - DAY0) // 1000 for r in rows)


async def test_latest_catch_up_runs_once_however_many_chunks_the_backlog_takes(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for 50 s with `every: 1s`, at most 20 ticks per pass: the backlog takes three
    chunks, and `mode: latest` still runs one tick (the newest, on time), not one per chunk."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0))
    assert await chunked_backlog(h, "latest", down_s=50, passes=5) == [50]


async def test_an_older_tick_still_waiting_is_not_a_newer_tick_on_time(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tick H waits for its marker; the scheduler is then down until H + 1h45m. Tick H + 1h
    (window 30m) is 45 min late, inside `max_delay`: with `mode: latest` and no newer tick
    on time, catch-up runs it. The older waiting tick H does not count as on time."""
    h = Harness(store, redis, keys, FixedClock(DAY0 - 1_000))
    await h.apply(
        "tasks:\n  - {id: hourly, agent: echo, schedule: {every: 1h}, window: 30m,"
        " depends_on: [raw.ready], catchup: {mode: latest, max_delay: 1h}}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(DAY0 + 1_000)
    await s.run_pass()
    h.clock.set(DAY0 + 105 * 60_000)
    await s.run_pass()
    assert [r.scheduled_for_ms for r in await store.list_instances()] == [DAY0 + 3_600_000]


async def test_all_catch_up_runs_the_newest_burst_of_the_whole_backlog_across_chunks(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for 150 s with `every: 1s`, at most 20 ticks per pass: `mode: all` runs the
    newest 100 missed ticks of the whole backlog (and the tick on time), not 100 per chunk."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0))
    assert await chunked_backlog(h, "all", down_s=150, passes=10) == list(range(50, 151))
    coalesced = await store.decisions("sec", since_ms=DAY0, limit=60)
    first = next(d for d in coalesced if d.fire_time_ms == DAY0)
    assert (first.decision, first.details["max_burst"]) == ("coalesced", 100)
    assert first.details["oldest_run_ms"] == DAY0 + 50_000
