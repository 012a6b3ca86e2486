"""Catch-up after downtime, from plain integers: what runs, what is missed, what is coalesced."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.core.spec import TaskSpec
from taskstream.scheduler.catchup import (
    DEFAULT_MAX_BURST,
    Backlog,
    backlog_after,
    bound_missed,
    catchup_horizon_ms,
    newer_on_time,
    plan_catchup,
)
from taskstream.scheduler.decide import START_GRACE_MS
from taskstream.scheduler.instances import trigger_of
from taskstream.scheduler.verdict import COALESCED, MISSED, SHOULD_RUN, SKIP_CALENDAR

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
T0 = 1_780_000_000_000 - 1_780_000_000_000 % DAY  # a UTC midnight (2026-05-28)


def spec(**catchup: Any) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "id": "poll",
            "agent": "echo",
            "schedule": {"every": "1m", "timezone": "UTC"},
            "window": "1m",
            "catchup": catchup,
        }
    )


def minutes(first_ms: int, count: int) -> list[int]:
    return [first_ms + i * MIN for i in range(count)]


def decisions(missed: list[int], now_ms: int, task: TaskSpec, **kw: Any) -> list[str]:
    return [d.decision for _, d in plan_catchup(missed, now_ms, task, **kw).entries]


@pytest.mark.parametrize(
    ("task", "down_min", "expected"),
    [
        # Ticks at T0+0..T0+4 min, decided 10 minutes after the first one.
        (spec(mode="all"), 5, [SHOULD_RUN] * 5),
        (spec(mode="latest"), 5, [COALESCED] * 4 + [SHOULD_RUN]),
        (spec(mode="all", max_delay="8m"), 5, [MISSED] * 2 + [SHOULD_RUN] * 3),
        (spec(mode="latest", max_delay="8m"), 5, [MISSED] * 2 + [COALESCED] * 2 + [SHOULD_RUN]),
        (spec(mode="all", max_delay="5m"), 5, [MISSED] * 5),
        (spec(mode="all", max_delay=0), 5, [MISSED] * 5),
        (spec(enabled=False, mode="all"), 5, [MISSED] * 5),
        (spec(enabled=False), 5, [MISSED] * 5),
    ],
)
def test_policy_table(task: TaskSpec, down_min: int, expected: list[str]) -> None:
    assert decisions(minutes(T0, down_min), T0 + 10 * MIN, task) == expected


def test_max_delay_boundary_is_inclusive() -> None:
    task = spec(mode="all", max_delay="10m")
    now = T0 + 10 * MIN
    assert decisions([T0 - 1, T0], now, task) == [MISSED, SHOULD_RUN]


def test_latest_keeps_the_newest_ticks_own_time_and_names_it() -> None:
    missed = minutes(T0, 3)
    got = plan_catchup(missed, T0 + 5 * MIN, spec(mode="latest"))
    assert got.runs == [missed[-1]]
    coalesced = [d for _, d in got.entries if d.decision == COALESCED]
    assert all(d.details["coalesced_into_ms"] == missed[-1] for d in coalesced)
    fire_ms, run = got.entries[-1]
    assert (fire_ms, run.details["fire_time_ms"], run.details["late_ms"]) == (
        missed[-1],
        missed[-1],
        3 * MIN,
    )


def tokyo(**fields: Any) -> TaskSpec:
    base = {
        "id": "nightly",
        "agent": "echo",
        "schedule": {"every": "1h", "timezone": "Asia/Tokyo"},
        "window": "1m",
        "catchup": {"max_delay": "1d"},
    }
    return TaskSpec.model_validate(base | fields)


def test_the_calendar_decides_before_latest_picks() -> None:
    task = tokyo(calendar={"exclude_dates": ["2026-05-28"]})
    # T0 - 1 h is 2026-05-28 08:00 in Tokyo (excluded); T0 - 10 h is 05-27 23:00 (allowed).
    missed = [T0 - 10 * HOUR, T0 - HOUR]
    got = plan_catchup(missed, T0 + 2 * HOUR, task)
    assert [d.decision for _, d in got.entries] == [SHOULD_RUN, SKIP_CALENDAR]
    assert got.entries[1][1].details["calendar"]["excluded_date"] == "2026-05-28"


def test_a_newer_tick_the_calendar_skips_is_nothing_to_coalesce_into() -> None:
    task = tokyo(calendar={"exclude_dates": ["2026-05-28"]})
    # T0 - 1 h (05-28 08:00 in Tokyo) is excluded; T0 + 15 h (05-29 00:00) is allowed.
    assert newer_on_time(task, [T0 - HOUR, T0 + 15 * HOUR], Backlog()) == T0 + 15 * HOUR
    assert newer_on_time(task, [T0 - HOUR], Backlog(on_time_ms=T0 + 15 * HOUR)) == T0 + 15 * HOUR
    assert newer_on_time(task, [T0 - HOUR], Backlog()) is None
    # Past a chunk: the first tick on time whose date the calendar allows.
    hourly = tokyo(calendar={"exclude_dates": ["2026-05-28"]}, window="20h")
    trigger = trigger_of(hourly)
    assert trigger is not None
    # On time at T0 + 15 h + 1 min: T0 - 5 h .. T0 + 15 h, all but the last on 05-28 in Tokyo.
    later = backlog_after(trigger, T0 - 30 * HOUR, T0 + 15 * HOUR + MIN, hourly)
    assert later.on_time_ms == T0 + 15 * HOUR


def test_a_maintenance_window_does_not_skip_a_catchup_tick() -> None:
    """T0 is 09:00 in Tokyo, inside maintenance: with catch-up the run waits for the window's
    end (`decide_tick` holds its start), so `latest` still picks the newest tick."""
    task = tokyo(calendar={"maintenance": [{"start": "09:00", "end": "10:00"}]})
    got = plan_catchup([T0 - HOUR, T0], T0 + 2 * HOUR, task)
    assert [d.decision for _, d in got.entries] == [COALESCED, SHOULD_RUN]
    off = tokyo(
        calendar={"maintenance": [{"start": "09:00", "end": "10:00"}]}, catchup={"enabled": False}
    )
    assert decisions([T0 - HOUR, T0], T0 + 2 * HOUR, off) == [MISSED, MISSED]


def test_a_start_held_to_max_delay_is_not_missed_when_decided_just_after() -> None:
    task = spec(max_delay="10m")
    fire = T0
    reach = fire + 10 * MIN
    late = reach + START_GRACE_MS
    assert decisions([fire], late, task) == [MISSED]
    assert decisions([fire], late, task, starts_held={fire: reach}) == [SHOULD_RUN]
    assert decisions([fire], late + 1, task, starts_held={fire: reach}) == [MISSED]
    # A hold that ended past max_delay gives no grace.
    assert decisions([fire], late, task, starts_held={fire: reach + 1}) == [MISSED]


def test_the_grace_follows_the_reach_when_the_window_is_longer_than_max_delay() -> None:
    task = TaskSpec.model_validate(
        {
            "id": "poll",
            "agent": "echo",
            "schedule": {"every": "1m", "timezone": "UTC"},
            "window": "2h",
            "catchup": {"max_delay": "5m"},
        }
    )
    held = T0 + 2 * HOUR  # the end of the window: the reach
    late = held + START_GRACE_MS
    assert decisions([T0], late, task, starts_held={T0: held}) == [SHOULD_RUN]
    assert decisions([T0], late + 1, task, starts_held={T0: held}) == [MISSED]
    assert decisions([T0], late, task) == [MISSED]


def test_only_if_ready_is_recorded_with_the_tick_it_runs() -> None:
    ready = plan_catchup(minutes(T0, 2), T0 + 5 * MIN, spec(only_if_ready=True))
    assert ready.entries[-1][1].details["require_ready"] is True
    plain = plan_catchup(minutes(T0, 2), T0 + 5 * MIN, spec())
    assert plain.entries[-1][1].details["require_ready"] is False


def test_mode_all_runs_at_most_the_burst_newest_first_kept() -> None:
    missed = minutes(T0, 10)
    got = plan_catchup(missed, T0 + 20 * MIN, spec(mode="all"), max_burst=3)
    assert got.runs == missed[-3:]
    over = [d for _, d in got.entries if d.decision == COALESCED]
    assert len(over) == 7
    assert over[0].details["max_burst"] == 3
    assert over[0].details["oldest_run_ms"] == missed[-3]


def test_a_week_of_per_minute_ticks_does_not_flood() -> None:
    week = minutes(T0, 7 * 24 * 60)
    now = week[-1] + 2 * MIN
    every = plan_catchup(week, now, spec(mode="all", max_delay="8d"))
    assert len(every.entries) == len(week)
    assert len(every.runs) == DEFAULT_MAX_BURST
    assert every.runs == week[-DEFAULT_MAX_BURST:]
    latest = plan_catchup(week, now, spec(mode="latest"))
    assert latest.runs == [week[-1]]
    counts = {
        name: sum(d.decision == name for _, d in latest.entries)
        for name in (MISSED, COALESCED, SHOULD_RUN)
    }
    # max_delay 1h: ticks at most 60 minutes old are catchable, the newest one runs.
    assert counts == {MISSED: len(week) - 59, COALESCED: 58, SHOULD_RUN: 1}


def test_the_horizon_lets_the_caller_skip_enumerating_old_ticks() -> None:
    week = minutes(T0, 7 * 24 * 60)
    now = week[-1] + 2 * MIN
    task = spec(mode="latest")
    horizon = catchup_horizon_ms(task, now)
    assert horizon == now - HOUR
    old = [t for t in week if t < horizon]
    recent = [t for t in week if t >= horizon]
    assert len(recent) == 59
    full = dict(plan_catchup(week, now, task).entries)
    assert all(full[t].decision == MISSED for t in old)
    assert dict(plan_catchup(recent, now, task).entries) == {t: full[t] for t in recent}
    summary = bound_missed(old[0], old[-1], len(old))
    assert summary.decision == MISSED
    assert summary.details == {"first_fire_ms": old[0], "last_fire_ms": old[-1], "count": 10021}


@pytest.mark.parametrize(
    ("catchup", "window_s", "reach_ms"),
    [
        ({}, 60, HOUR),
        ({"enabled": False}, 60, MIN),
        ({"max_delay": 30}, 120, 2 * MIN),
    ],
)
def test_horizon(catchup: dict[str, Any], window_s: int, reach_ms: int) -> None:
    task = spec(**catchup).model_copy(update={"window": float(window_s)})
    assert catchup_horizon_ms(task, T0) == T0 - reach_ms


def test_nothing_missed_is_an_empty_plan() -> None:
    got = plan_catchup([], T0, spec())
    assert (got.entries, got.runs) == ((), [])


@pytest.mark.parametrize(
    ("missed", "max_burst", "message"),
    [
        ([T0, T0], 100, "ascending"),
        ([T0 + MIN, T0], 100, "ascending"),
        ([T0 + 9 * MIN], 100, "on time"),
        ([T0], 0, "max_burst"),
    ],
)
def test_bad_input_is_rejected(missed: list[int], max_burst: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_catchup(missed, T0 + 10 * MIN, spec(), max_burst=max_burst)


@pytest.mark.parametrize(("first", "last", "count"), [(T0, T0 - 1, 1), (T0, T0, 0)])
def test_bound_missed_rejects_an_empty_range(first: int, last: int, count: int) -> None:
    with pytest.raises(ValueError, match="first_ms"):
        bound_missed(first, last, count)


def test_latest_coalesces_everything_into_a_newer_tick_that_is_on_time() -> None:
    newer = T0 + 4 * MIN
    late = plan_catchup(minutes(T0, 3), T0 + 5 * MIN, spec(), newer_on_time=newer)
    assert late.runs == []
    assert {d.decision for _, d in late.entries} == {"coalesced"}
    for _, coalesced in late.entries:  # the explain log names the tick it was folded into
        assert coalesced.details["coalesced_into_ms"] == newer
        assert coalesced.reason == f"coalesced into the newer tick {newer}, which is on time"
    every = plan_catchup(minutes(T0, 3), T0 + 5 * MIN, spec(mode="all"), newer_on_time=newer)
    assert len(every.runs) == 3
