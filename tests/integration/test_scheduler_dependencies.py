"""Ticks that depend on a marker, on real Redis and a real store, clock passed in: a tick
waits for its marker and then runs (also when an agent sets it), is skipped when its window
closes first or when a schedule edit leaves it behind, and a tick waiting for long does not
hold back the ticks after it. A run that lost its claim sets no marker."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.retry import Failure
from taskstream.executor.runner import RunEnv, execute
from taskstream.scheduler import advance
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import intake
from tests.integration.scheduler_cases import DAY0, DEPS, M0, make

EVERY_SECOND_DEPS = """
tasks:
  - {id: w, agent: echo, schedule: {every: 1s}, window: 1h, depends_on: [raw.ready]}
"""


async def test_a_tick_waits_for_its_marker_then_runs(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    await s.run_pass()
    assert await store.list_instances() == []
    decisions = [d.decision for d in await store.decisions("report")]
    assert decisions == ["wait_dep"]
    await store.mark_ready("raw.ready", "2026-05-28")
    h.clock.advance(5_000)
    await s.run_pass()
    [row] = await store.list_instances()
    assert row.scheduled_for_ms == M0 + 60_000
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep", "should_run"]


async def test_a_marker_that_never_comes_skips_the_tick_at_window_close(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    h.clock.advance(10 * 60_000 + 1)
    await s.run_pass()
    first = [d for d in await store.decisions("report") if d.fire_time_ms == M0 + 60_000]
    assert [d.decision for d in first] == ["wait_dep", "skip_dep"]
    assert "raw.ready" in str(first[-1].details)


async def test_an_agent_marking_ready_releases_a_waiting_tick(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS + "  - {id: collect, agent: producer}\n")
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep"]
    producer = await h.trigger(DEPS + "  - {id: collect, agent: producer}\n", "collect", M0)
    ex = Running(h.executor())
    try:

        async def produced() -> bool:
            row = await store.get_instance(producer.id)
            return row is not None and row.status is Status.SUCCESS

        await until(produced)
    finally:
        await ex.close()
    await s.run_pass()
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep", "should_run"]


async def test_a_run_whose_claim_was_taken_over_sets_no_marker(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A producer's lease lapsed while it was paused and the sweeper timed its attempt out:
    when it resumes and marks its data ready, the marker is refused (`ClaimLost`), so the
    waiting tick is not released by a run whose result will not be committed."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    tasks = DEPS + "  - {id: collect, agent: producer, retry: {max_attempts: 3}}\n"
    await h.apply(tasks)
    producer = await h.trigger(tasks, "collect", M0)
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    moved = await store.transition(
        producer.id, Status.RUNNING, Status.TIMEOUT, reason="lease_expired", attempt=run.token
    )
    assert moved.ok
    end = await execute(run, RunEnv(store, h.clock, max_payload_bytes=1 << 20))
    assert end.failure is Failure.RETRIABLE
    assert "ClaimLost" in (end.error or "") and "no longer held" in (end.error or "")
    assert producer.business_date is not None
    assert await store.ready_markers(["raw.ready"], producer.business_date) == set()


async def test_a_tick_left_waiting_by_a_schedule_edit_is_closed_and_nothing_spins(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tick F (every 1m) waits for its marker; the schedule is then changed to a cron that
    does not fire at F. F is closed as skip_window (nothing else would decide it again), and
    the pass's next wake-up is in the future, not F's past re-check time (a busy loop)."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    [waiting] = await store.decisions("report")
    assert waiting.decision == "wait_dep"
    await h.apply(DEPS.replace("every: 1m", "cron: '30 * * * *', timezone: UTC"))
    h.clock.advance(3 * 3_600_000)
    nexts = [await s.run_pass() for _ in range(2)]
    assert all(n is not None and n > h.clock.now_ms() for n in nexts)
    at_f = [d for d in await store.decisions("report") if d.fire_time_ms == waiting.fire_time_ms]
    assert [d.decision for d in at_f] == ["wait_dep", "skip_window"]


async def test_a_tick_waiting_for_long_does_not_hold_back_the_ticks_after_it(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Yesterday's last ticks (every 1s, window 1h) wait for yesterday's marker, which never
    comes, so the cursor stays before them; today's marker is set. With at most 20 ticks per
    pass, today's ticks keep running pass after pass: decided ticks beyond the cursor do not
    use up the bound."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0 - 3_000))
    await h.apply(EVERY_SECOND_DEPS)
    await store.mark_ready("raw.ready", "2026-05-29")
    s = make(h)
    await s.run_pass()
    for _ in range(10):
        h.clock.advance(10_000)
        await s.run_pass()
    newest = max(r.scheduled_for_ms for r in await store.list_instances(limit=1000))
    assert newest == h.clock.now_ms() - h.clock.now_ms() % 1000


async def test_ticks_past_more_waiting_ticks_than_a_pass_decides_are_still_decided(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More ticks waiting than a pass's bound (a day's marker late, a short `every` with a
    long window): each pass listed only those, never the ticks after them, and asked to be
    woken at a time already past, so the scheduler ran passes back to back. Bound of 5
    here for 1000."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 5)
    task = (
        "tasks:\n  - {id: w, agent: echo, schedule: {every: 1m}, window: 1d, depends_on: [raw]}\n"
    )
    h = Harness(store, redis, keys, FixedClock(DAY0 - 8 * 60_000 - 1))
    await h.apply(task)
    s = make(h)
    await s.run_pass()
    h.clock.set(DAY0 - 1)
    await s.run_pass()  # 23:52 .. 23:59 of 2026-05-28 wait
    await store.mark_ready("raw", "2026-05-29")
    h.clock.set(DAY0 + 2 * 60_000 + 1)
    wakes = [await s.run_pass() for _ in range(3)]  # a pass may leave some for the next
    ran = sorted(r.scheduled_for_ms for r in await store.list_instances())
    assert ran == [DAY0, DAY0 + 60_000, DAY0 + 2 * 60_000]
    assert wakes[-1] == DAY0 + 3 * 60_000
