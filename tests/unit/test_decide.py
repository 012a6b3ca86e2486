"""`decide_tick` from a table: every rule in order, with an injected `now_ms` and no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from taskstream.core.spec import TaskSpec
from taskstream.scheduler.decide import START_GRACE_MS, decide_tick
from taskstream.scheduler.verdict import (
    COALESCED,
    DEFERRED,
    MISSED,
    SHOULD_RUN,
    SKIP_CALENDAR,
    SKIP_DEP,
    SKIP_DUPLICATED,
    SKIP_OVERLAP,
    SKIP_WINDOW,
    WAIT_DEP,
    ActiveInstance,
    Decision,
    TickFacts,
    held_for_maintenance,
    waits_for_maintenance,
)

BERLIN = "Europe/Berlin"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN = 60_000


def berlin(h: int, mi: int, d: int = 5) -> int:
    """UTC epoch ms of 2026-06-<d> h:mi in Berlin (CEST, UTC+2); the 5th is a Friday."""
    return (datetime(2026, 6, d, h, mi, tzinfo=ZoneInfo(BERLIN)) - EPOCH) // timedelta(
        milliseconds=1
    )


FIRE = berlin(9, 0)
WINDOW = 10 * MIN


def spec(**fields: Any) -> TaskSpec:
    base: dict[str, Any] = {
        "id": "report",
        "agent": "echo",
        "schedule": {"cron": "0 9 * * *", "timezone": BERLIN},
        "window": "10m",
    }
    return TaskSpec.model_validate(base | fields)


BASE = spec()
EXCLUDED = spec(calendar={"exclude_dates": ["2026-06-05"]})
MAINTENANCE = spec(calendar={"maintenance": [{"start": "09:05", "end": "10:00"}]})
MAINTENANCE_NO_CATCHUP = spec(
    calendar={"maintenance": [{"start": "09:05", "end": "10:00"}]}, catchup={"enabled": False}
)
NOT_BEFORE_905 = spec(not_before="09:05")
NOT_BEFORE_930 = spec(not_before="09:30")
NEVER = spec(not_before="07:30", off_peak={"start": "01:00", "end": "05:00"})
FORBID = spec(concurrency="forbid")
ALLOW = spec(concurrency="allow")
REPLACE = spec(concurrency="replace")
DEPS = spec(depends_on=["raw.ready"], preconditions=["quota", "source"])
CATCHUP = spec(depends_on=["raw.ready"], catchup={"max_delay": "1h"})
CATCHUP_READY = spec(depends_on=["raw.ready"], catchup={"max_delay": "1h", "only_if_ready": True})
NO_CATCHUP = spec(catchup={"enabled": False})
EVERYTHING = spec(
    calendar={"exclude_dates": ["2026-06-05"]},
    not_before="09:05",
    concurrency="forbid",
    preconditions=["quota"],
)
DEFER_AND_FORBID = spec(not_before="09:05", concurrency="forbid", preconditions=["quota"])
FORBID_AND_CHECK = spec(concurrency="forbid", preconditions=["quota"])

ACTIVE = ActiveInstance("i_previous", "running")
PASSING = {"quota": "pass", "source": "pass"}


def facts(**fields: Any) -> TickFacts:
    return TickFacts(fire_ms=fields.pop("fire_ms", FIRE), **fields)


@pytest.mark.parametrize(
    ("task", "tick", "now_ms", "decision"),
    [
        # 1. window
        pytest.param(BASE, facts(), FIRE, SHOULD_RUN, id="on-time"),
        pytest.param(BASE, facts(), FIRE - 1_000, SHOULD_RUN, id="decided-early"),
        pytest.param(BASE, facts(), FIRE + WINDOW, SHOULD_RUN, id="last-ms-of-window"),
        pytest.param(BASE, facts(), FIRE + WINDOW + 1, SKIP_WINDOW, id="window-closed"),
        # 2. calendar, at the fire time and at a later start
        pytest.param(EXCLUDED, facts(), FIRE, SKIP_CALENDAR, id="excluded-date"),
        pytest.param(MAINTENANCE, facts(), FIRE, SHOULD_RUN, id="fire-before-maintenance"),
        pytest.param(MAINTENANCE, facts(), FIRE + 6 * MIN, DEFERRED, id="start-in-maint-waits"),
        pytest.param(
            MAINTENANCE_NO_CATCHUP, facts(), FIRE + 6 * MIN, SKIP_CALENDAR, id="start-in-maint"
        ),
        # 3. deferral
        pytest.param(NOT_BEFORE_905, facts(), FIRE, DEFERRED, id="held-inside-window"),
        pytest.param(NOT_BEFORE_905, facts(), FIRE + 5 * MIN, SHOULD_RUN, id="hold-over"),
        pytest.param(NOT_BEFORE_930, facts(), FIRE, SKIP_WINDOW, id="held-past-window"),
        pytest.param(NEVER, facts(), FIRE, SKIP_WINDOW, id="held-forever"),
        # 4. overlap
        pytest.param(FORBID, facts(), FIRE, SHOULD_RUN, id="forbid-nothing-active"),
        pytest.param(FORBID, facts(active_instance=ACTIVE), FIRE, SKIP_OVERLAP, id="forbid"),
        pytest.param(ALLOW, facts(active_instance=ACTIVE), FIRE, SHOULD_RUN, id="allow"),
        pytest.param(REPLACE, facts(active_instance=ACTIVE), FIRE, SHOULD_RUN, id="replace"),
        # 5. dependencies
        pytest.param(DEPS, facts(preconditions=PASSING), FIRE, SHOULD_RUN, id="ready"),
        pytest.param(
            DEPS,
            facts(preconditions={"quota": "fail", "source": "pass"}),
            FIRE,
            SKIP_DEP,
            id="precondition-fails",
        ),
        pytest.param(
            DEPS,
            facts(missing_markers=("raw.ready",), preconditions=PASSING),
            FIRE,
            WAIT_DEP,
            id="marker-missing",
        ),
        pytest.param(
            DEPS,
            facts(preconditions={"quota": "unavailable", "source": "pass"}),
            FIRE,
            WAIT_DEP,
            id="check-unavailable",
        ),
        pytest.param(DEPS, facts(preconditions={"quota": "pass"}), FIRE, WAIT_DEP, id="unreported"),
        pytest.param(
            DEPS,
            facts(missing_markers=("raw.ready",), previous=WAIT_DEP),
            FIRE + WINDOW + 1,
            SKIP_DEP,
            id="waited-until-window-closed",
        ),
        pytest.param(
            DEPS,
            facts(preconditions=PASSING, previous=WAIT_DEP),
            FIRE + WINDOW + 1,
            SKIP_WINDOW,
            id="ready-but-too-late",
        ),
        pytest.param(
            DEPS,
            facts(missing_markers=("raw.ready",)),
            FIRE + WINDOW + 1,
            SKIP_WINDOW,
            id="late-first-decision",
        ),
        # catch-up ticks: bounded by max_delay; dependencies only under only_if_ready
        pytest.param(CATCHUP, facts(catchup=True), FIRE + 30 * MIN, SHOULD_RUN, id="catchup"),
        pytest.param(
            CATCHUP,
            facts(catchup=True, missing_markers=("raw.ready",)),
            FIRE + 30 * MIN,
            SHOULD_RUN,
            id="catchup-deps-not-checked",
        ),
        pytest.param(
            CATCHUP_READY,
            facts(catchup=True, missing_markers=("raw.ready",)),
            FIRE + 30 * MIN,
            SKIP_DEP,
            id="catchup-only-if-ready",
        ),
        pytest.param(CATCHUP_READY, facts(catchup=True), FIRE + 30 * MIN, SHOULD_RUN, id="c-ready"),
        pytest.param(CATCHUP, facts(catchup=True), FIRE + 61 * MIN, MISSED, id="catchup-too-old"),
        pytest.param(NO_CATCHUP, facts(catchup=True), FIRE + 30 * MIN, MISSED, id="no-catchup"),
        # a tick failing several rules reports the first
        pytest.param(
            EVERYTHING,
            facts(active_instance=ACTIVE, preconditions={"quota": "fail"}),
            FIRE + WINDOW + 1,
            SKIP_WINDOW,
            id="first-window",
        ),
        pytest.param(
            EVERYTHING,
            facts(active_instance=ACTIVE, preconditions={"quota": "fail"}),
            FIRE,
            SKIP_CALENDAR,
            id="first-calendar",
        ),
        pytest.param(
            DEFER_AND_FORBID,
            facts(active_instance=ACTIVE, preconditions={"quota": "fail"}),
            FIRE,
            DEFERRED,
            id="first-deferral",
        ),
        pytest.param(
            FORBID_AND_CHECK,
            facts(active_instance=ACTIVE, preconditions={"quota": "fail"}),
            FIRE,
            SKIP_OVERLAP,
            id="first-overlap",
        ),
    ],
)
def test_decide_tick(task: TaskSpec, tick: TickFacts, now_ms: int, decision: str) -> None:
    got = decide_tick(tick, task, now_ms)
    assert got.decision == decision, got.reason
    assert got.reason
    assert got.details["fire_time_ms"] == tick.fire_ms
    assert got.details["now_ms"] == now_ms


def test_deferred_names_when_to_decide_again() -> None:
    got = decide_tick(facts(), NOT_BEFORE_905, FIRE)
    assert (got.decision, got.until_ms, got.final) == (DEFERRED, berlin(9, 5), False)
    assert got.details["deferral"]["not_before"] == "09:05"
    assert got.details["deferral"]["until_local"] == "2026-06-05T09:05:00.000+02:00"
    again = decide_tick(facts(previous=DEFERRED), NOT_BEFORE_905, berlin(9, 5))
    assert again.runs and again.final


def test_a_start_held_until_the_window_closes_still_runs_when_decided_just_after() -> None:
    """Window 10 min and `not_before: 09:10`: deferred to the window's last instant. The
    scheduler decides it again a little after 09:10; it runs, within `START_GRACE_MS`."""
    task = spec(not_before="09:10")
    held = decide_tick(facts(), task, FIRE)
    assert (held.decision, held.until_ms) == (DEFERRED, FIRE + WINDOW)
    again = facts(previous=DEFERRED, previous_until_ms=held.until_ms)
    assert decide_tick(again, task, FIRE + WINDOW + 20).runs
    assert decide_tick(again, task, FIRE + WINDOW + START_GRACE_MS).runs
    late = decide_tick(again, task, FIRE + WINDOW + START_GRACE_MS + 1)
    assert late.decision == SKIP_WINDOW
    # Without the deferral the same instant is late.
    assert decide_tick(facts(), spec(), FIRE + WINDOW + 20).decision == SKIP_WINDOW


def test_wait_dep_holds_until_the_window_closes() -> None:
    tick = facts(missing_markers=("raw.ready",), preconditions=PASSING)
    got = decide_tick(tick, DEPS, FIRE + MIN)
    assert (got.decision, got.until_ms, got.final) == (WAIT_DEP, FIRE + WINDOW, False)
    assert got.details["markers_missing"] == ["raw.ready"]
    assert got.details["preconditions"] == PASSING
    assert "raw.ready" in got.reason


def test_replace_names_the_instance_to_cancel() -> None:
    got = decide_tick(facts(active_instance=ACTIVE, earlier_active=("i_previous",)), REPLACE, FIRE)
    assert got.runs
    assert got.details["replace"] == ["i_previous"]
    assert got.details["overlap"] == {
        "policy": "replace",
        "active_id": "i_previous",
        "active_status": "running",
    }
    assert "replace" not in decide_tick(facts(active_instance=ACTIVE), ALLOW, FIRE).details


def test_replace_names_every_earlier_active_instance() -> None:
    tick = facts(active_instance=ACTIVE, earlier_active=("i_older", "i_previous"))
    got = decide_tick(tick, REPLACE, FIRE)
    assert got.runs
    assert got.details["replace"] == ["i_older", "i_previous"]
    assert got.reason == "every rule passed; replaces i_older, i_previous"


def test_replace_keeps_a_later_run_and_skips_the_older_tick() -> None:
    """A tick decided after a later run started (a manual trigger, or a later tick that ran
    while this one waited for its dependencies) must not cancel that newer run."""
    later = ActiveInstance("i_later", "running", FIRE + MIN)
    got = decide_tick(facts(active_instance=later), REPLACE, FIRE)
    assert got.decision == SKIP_OVERLAP
    assert "replace" not in got.details
    assert got.details["overlap"]["active_fire_ms"] == FIRE + MIN
    assert "i_later" in got.reason and "newest" in got.reason
    earlier = ActiveInstance("i_earlier", "running", FIRE - MIN)
    replacing = facts(active_instance=earlier, earlier_active=("i_earlier",))
    assert decide_tick(replacing, REPLACE, FIRE).details["replace"] == ["i_earlier"]
    assert decide_tick(facts(active_instance=later), ALLOW, FIRE).runs


def test_skip_calendar_says_which_instant_it_checked() -> None:
    late_start = decide_tick(facts(), MAINTENANCE_NO_CATCHUP, FIRE + 6 * MIN)
    assert late_start.details["calendar"]["checked"] == "start"
    assert late_start.details["calendar"]["maintenance"] == "09:05-10:00"
    on_date = decide_tick(facts(), EXCLUDED, FIRE)
    assert on_date.details["calendar"]["checked"] == "fire"
    assert on_date.details["calendar"]["excluded_date"] == "2026-06-05"


def maintenance(start: str, end: str, **fields: Any) -> TaskSpec:
    return spec(calendar={"maintenance": [{"start": start, "end": end}]}, **fields)


def test_a_start_inside_maintenance_waits_for_its_end_with_catchup() -> None:
    """09:00 fire inside 08:30-09:40 (window 10 min, max_delay 1 h by default): held until
    09:40, past the trigger window but within the catch-up reach; decided again then."""
    task = maintenance("08:30", "09:40")
    held = decide_tick(facts(), task, FIRE)
    assert (held.decision, held.until_ms, held.final) == (DEFERRED, berlin(9, 40), False)
    assert held.details["calendar"] | {"at_ms": 0} == {
        "at_ms": 0,
        "timezone": BERLIN,
        "local_time": "2026-06-05T09:00:00.000+02:00",
        "maintenance": "08:30-09:40",
        "window_started": "2026-06-05",
        "until_ms": berlin(9, 40),
        "until_local": "2026-06-05T09:40:00.000+02:00",
        "rule": "maintenance",
        "checked": "fire",
    }
    assert held.reason == (
        "calendar: inside maintenance window 08:30-09:40, start held until its end"
    )
    assert waits_for_maintenance(held)
    assert not waits_for_maintenance(decide_tick(facts(), NOT_BEFORE_905, FIRE))
    # Its window has closed by then: it is decided again as a catch-up tick, and runs.
    again = facts(catchup=True, previous=DEFERRED, previous_until_ms=held.until_ms)
    assert decide_tick(again, task, berlin(9, 40)).runs


@pytest.mark.parametrize(
    ("task", "decision"),
    [
        pytest.param(maintenance("08:30", "10:00"), DEFERRED, id="ends-at-the-reach"),
        pytest.param(maintenance("08:30", "10:01"), SKIP_CALENDAR, id="ends-past-the-reach"),
        pytest.param(
            maintenance("08:30", "10:01", catchup={"max_delay": "2h"}), DEFERRED, id="longer-reach"
        ),
        pytest.param(
            maintenance("08:30", "10:01", window="2h", catchup={"max_delay": "5m"}),
            DEFERRED,
            id="the-window-is-the-reach",
        ),
        pytest.param(
            maintenance("08:30", "09:40", catchup={"enabled": False}),
            SKIP_CALENDAR,
            id="catchup-off-skips",
        ),
    ],
)
def test_a_maintenance_wait_is_bounded_by_the_catchup_reach(task: TaskSpec, decision: str) -> None:
    got = decide_tick(facts(), task, FIRE)
    assert got.decision == decision, got.reason
    assert got.details["calendar"]["rule"] == "maintenance"


def test_a_held_start_at_the_reach_still_runs_when_decided_just_after() -> None:
    """Maintenance ends exactly at fire + max_delay: the scheduler wakes a little later."""
    task = maintenance("08:30", "10:00")
    held = decide_tick(facts(), task, FIRE)
    again = facts(catchup=True, previous=DEFERRED, previous_until_ms=held.until_ms)
    assert decide_tick(again, task, berlin(10, 0) + START_GRACE_MS).runs
    late = decide_tick(again, task, berlin(10, 0) + START_GRACE_MS + 1)
    assert late.decision == MISSED
    assert decide_tick(facts(catchup=True), task, berlin(10, 0) + 20).decision == MISSED


def test_a_maintenance_wait_keeps_the_weekend_and_excluded_dates() -> None:
    """Only maintenance windows wait: an excluded date still skips, at the fire or the start."""
    task = spec(
        calendar={
            "exclude_dates": ["2026-06-05"],
            "maintenance": [{"start": "08:00", "end": "10:00"}],
        }
    )
    assert decide_tick(facts(), task, FIRE).decision == SKIP_CALENDAR
    nights = spec(calendar={"maintenance": [{"start": "23:00", "end": "01:00"}]}, window="3h")
    late = berlin(23, 30)
    got = decide_tick(facts(fire_ms=late), nights, late)
    assert (got.decision, got.until_ms) == (DEFERRED, berlin(1, 0, d=6))


def test_should_run_carries_every_value_seen() -> None:
    got = decide_tick(facts(preconditions=PASSING), DEPS, FIRE + 2 * MIN)
    assert got.details == {
        "fire_time_ms": FIRE,
        "now_ms": FIRE + 2 * MIN,
        "timezone": BERLIN,
        "fire_local": "2026-06-05T09:00:00.000+02:00",
        "now_local": "2026-06-05T09:02:00.000+02:00",
        "late_ms": 2 * MIN,
        "window_ms": WINDOW,
        "open_until_ms": FIRE + WINDOW,
        "catchup": False,
        "previous": None,
        "calendar": None,
        "deferral": None,
        "overlap": None,
        "depends_on": ["raw.ready"],
        "markers_missing": [],
        "preconditions": PASSING,
    }


def test_a_catchup_tick_is_open_until_max_delay() -> None:
    got = decide_tick(facts(catchup=True), CATCHUP, FIRE + 30 * MIN)
    assert got.details["open_until_ms"] == FIRE + 60 * MIN
    assert got.details["dependencies_checked"] is False
    ready = decide_tick(facts(catchup=True), CATCHUP_READY, FIRE + 30 * MIN)
    assert ready.details["markers_missing"] == []


def test_a_tick_late_only_for_maintenance_checks_readiness_whatever_only_if_ready() -> None:
    """Its readiness was never checked (the calendar rule comes first): it is checked now,
    and not being ready skips it at once, as its window has closed."""
    held = facts(catchup=True, after_maintenance=True, missing_markers=("raw.ready",))
    got = decide_tick(held, CATCHUP, FIRE + 30 * MIN)
    assert got.decision == SKIP_DEP
    assert got.reason.startswith("raw.ready not ready once the maintenance window ended")
    assert got.details["markers_missing"] == ["raw.ready"]
    assert got.details["after_maintenance"] is True
    ready = decide_tick(facts(catchup=True, after_maintenance=True), CATCHUP, FIRE + 30 * MIN)
    assert ready.runs and ready.details["markers_missing"] == []
    missed = facts(catchup=True, missing_markers=("raw.ready",))
    assert decide_tick(missed, CATCHUP, FIRE + 30 * MIN).runs  # downtime: only_if_ready rules
    assert "after_maintenance" not in decide_tick(missed, CATCHUP, FIRE + 30 * MIN).details


def test_held_for_maintenance_follows_a_wait_of_an_on_time_tick_through_later_holds() -> None:
    wait = decide_tick(facts(), MAINTENANCE, FIRE + 6 * MIN)
    assert wait.decision == DEFERRED and held_for_maintenance(wait)
    missed = decide_tick(facts(catchup=True), MAINTENANCE, FIRE + 6 * MIN)
    assert missed.decision == DEFERRED and waits_for_maintenance(missed)
    assert not held_for_maintenance(missed)  # a missed tick the window then held
    later = Decision(DEFERRED, "not_before", {"after_maintenance": True}, FIRE + 2 * WINDOW)
    assert held_for_maintenance(later)
    assert not held_for_maintenance(Decision(DEFERRED, "not_before", {}, FIRE + WINDOW))
    assert not held_for_maintenance(None)


@pytest.mark.parametrize(
    ("decision", "final"),
    [
        (SHOULD_RUN, True),
        (SKIP_WINDOW, True),
        (SKIP_CALENDAR, True),
        (SKIP_OVERLAP, True),
        (SKIP_DEP, True),
        (SKIP_DUPLICATED, True),
        (MISSED, True),
        (COALESCED, True),
        (DEFERRED, False),
        (WAIT_DEP, False),
    ],
)
def test_final(decision: str, final: bool) -> None:
    assert Decision(decision, "r").final is final


@pytest.mark.parametrize(
    "fields",
    [
        {"preconditions": {"quota": "maybe"}},
        {"previous": SHOULD_RUN},
    ],
)
def test_facts_reject_unknown_values(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        TickFacts(fire_ms=FIRE, **fields)
