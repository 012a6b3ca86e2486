"""A schedule edited by `tasks apply` takes effect when it is applied: the fire times it would
have had before (between the old schedule's last decided tick and the edit) are not its ticks,
so no run is made for them, on time or by catch-up. Ticks that already wait stay due."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import Scheduler
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import DAY0, make

MIN = 60_000
TEN = DAY0 + 600 * MIN
"""2026-05-29T10:00:00Z."""

HOURLY = "tasks:\n  - {id: j, agent: echo, schedule: {every: 1h}, window: 5m}\n"
MINUTELY = "tasks:\n  - {id: j, agent: echo, schedule: {every: 1m}, window: 5m}\n"
MINUTELY_ALL = (
    "tasks:\n  - {id: j, agent: echo, schedule: {every: 1m}, window: 5m, catchup: {mode: all}}\n"
)
ON_DEMAND = "tasks:\n  - {id: j, agent: echo, window: 5m}\n"


async def _minutes(store: SqlStore) -> list[int]:
    """The fire times of every instance of `j`, as minutes since DAY0."""
    return sorted((r.scheduled_for_ms - DAY0) // MIN for r in await store.list_instances())


async def _hourly_ran_at_ten(h: Harness) -> None:
    await h.apply(HOURLY)
    s = make(h)
    await s.run_pass()  # first seen at 09:59:59
    h.clock.set(TEN + 500)
    await s.run_pass()  # 10:00 runs


@pytest.mark.parametrize("edited", [MINUTELY, MINUTELY_ALL], ids=["latest", "all"])
async def test_an_edited_schedule_makes_no_runs_for_fire_times_before_the_edit(
    store: SqlStore, redis: streams.Redis, keys: Keys, edited: str
) -> None:
    """Hourly, then every minute from 10:30: 10:01 to 10:30 ran five at once (those still in
    their window) or thirty (`mode: all`), and catch-up recorded the others."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await _hourly_ran_at_ten(h)
    h.clock.set(TEN + 30 * MIN + 500)
    await h.apply(edited)
    s = make(h)
    await s.run_pass()
    assert await _minutes(store) == [600]
    assert [d.fire_time_ms for d in await store.decisions("j")] == [TEN]
    h.clock.set(TEN + 32 * MIN + 500)
    await s.run_pass()
    assert await _minutes(store) == [600, 631, 632]


async def test_a_schedule_removed_and_restored_has_no_ticks_from_while_it_had_none(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """On demand from 10:30, hourly again from 11:20: 11:00 was no fire time of any schedule
    the task had, and is not run by catch-up."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await _hourly_ran_at_ten(h)
    s = make(h)
    h.clock.set(TEN + 30 * MIN)
    await h.apply(ON_DEMAND)
    await s.run_pass()
    h.clock.set(TEN + 60 * MIN + 500)
    await s.run_pass()
    h.clock.set(TEN + 80 * MIN)
    await h.apply(HOURLY)
    await s.run_pass()
    h.clock.set(TEN + 120 * MIN + 500)
    await s.run_pass()
    assert await _minutes(store) == [600, 720]


HOURLY_DEP = (
    "tasks:\n  - {id: j, agent: echo, schedule: {every: 1h}, window: 15m, depends_on: [raw]}\n"
)
MINUTELY_DEP = (
    "tasks:\n  - {id: j, agent: echo, schedule: {every: 1m}, window: 15m, depends_on: [raw]}\n"
)


async def _ten_waits(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> tuple[Harness, Scheduler]:
    """`HOURLY_DEP` applied before 10:00, whose 10:00 tick waits for its marker."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await h.apply(HOURLY_DEP)
    s = make(h)
    await s.run_pass()
    h.clock.set(TEN + 500)
    await s.run_pass()
    return h, s


async def test_a_tick_waiting_when_its_schedule_is_edited_still_runs_alone(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """10:00 waits for its marker when the schedule becomes every minute at 10:05; it is still
    a fire time, so it keeps waiting and runs once the marker comes, with the new schedule's
    ticks from the edit on, and nothing for 10:01 to 10:05."""
    h, s = await _ten_waits(store, redis, keys)
    h.clock.set(TEN + 5 * MIN + 500)
    await h.apply(MINUTELY_DEP)
    await s.run_pass()
    assert await store.list_instances() == []
    await store.mark_ready("raw", "2026-05-29")
    h.clock.set(TEN + 6 * MIN + 500)
    await s.run_pass()
    assert await _minutes(store) == [600, 606]
    fires = sorted({d.fire_time_ms for d in await store.decisions("j")})
    assert fires == [TEN, TEN + 6 * MIN]


ON_DEMAND_DEP = "tasks:\n  - {id: j, agent: echo, window: 15m, depends_on: [raw]}\n"


async def test_a_tick_waiting_when_its_schedule_is_removed_is_closed(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """10:00 waits for its marker when the task becomes on demand at 10:05: nothing would
    decide it again, and its record said `wait_dep` for ever. It is closed as
    `skip_window`, and does not run when the schedule and the marker come back."""
    h, s = await _ten_waits(store, redis, keys)
    h.clock.set(TEN + 5 * MIN)
    await h.apply(ON_DEMAND_DEP)
    await s.run_pass()
    assert [(d.decision, d.fire_time_ms) for d in await store.decisions("j")] == [
        ("wait_dep", TEN),
        ("skip_window", TEN),
    ]
    await store.mark_ready("raw", "2026-05-29")
    h.clock.set(TEN + 6 * MIN)
    await h.apply(HOURLY_DEP)
    await make(h).run_pass()
    assert await store.list_instances() == []


async def test_tasks_without_a_schedule_cost_a_pass_no_reads_unless_once_scheduled(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass looks for ticks a removed schedule left waiting: only in tasks that had a
    schedule (a cursor). Reading every on-demand task's cursor made a new leader's first pass
    as slow as its on-demand tasks were many, past its lease."""
    on_demand = "".join(f"  - {{id: od{i}, agent: echo}}\n" for i in range(20))
    h, s = await _ten_waits(store, redis, keys)
    await h.apply("tasks:\n" + on_demand + "  - {id: j, agent: echo, window: 15m}\n")
    read: list[str] = []
    get_cursor = store.get_cursor

    async def counted(task_id: str) -> int | None:
        read.append(task_id)
        return await get_cursor(task_id)

    monkeypatch.setattr(store, "get_cursor", counted)
    s = make(h)  # a new leader: nothing in memory
    await s.run_pass()
    await s.run_pass()
    assert read == ["j"]
    assert [d.decision for d in await store.decisions("j")] == ["wait_dep", "skip_window"]
