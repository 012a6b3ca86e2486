"""Holding a tick back behind an open upstream breaker, from plain integers: `hold_back` and
friends (pure), the cool-down left of a breaker state, and the adapter over the in-memory
breakers on an injected clock. No Redis, no clock reads, no sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.core.clock import FixedClock
from taskstream.core.spec import TaskSpec
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome, cooldown_left_ms
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.memory import MemoryBreakers
from taskstream.runtime.upstream_holds import BreakerHolds
from taskstream.scheduler.catchup import plan_catchup
from taskstream.scheduler.decide import decide_tick
from taskstream.scheduler.hold import (
    HELD_BACK_BY,
    HELD_BY,
    WAITED_FOR_MAINTENANCE,
    held_upstreams,
    hold_back,
    hold_until,
    is_held,
    released,
)
from taskstream.scheduler.trail import rule_of
from taskstream.scheduler.verdict import (
    COALESCED,
    DEFERRED,
    MISSED,
    SHOULD_RUN,
    SKIP_DUPLICATED,
    SKIP_WINDOW,
    WAIT_DEP,
    Decision,
    TickFacts,
)

NOW = 1_780_000_000_000
FIRE = NOW - 5_000
RUN = Decision(SHOULD_RUN, "every rule passed", {"fire_time_ms": FIRE, "late_ms": 5_000})
NOT_BEFORE = Decision(DEFERRED, "not before 09:05", {"deferral": {"until_ms": NOW}}, NOW + 1)
HELD = hold_back(RUN, {"llm": NOW + 30_000})


def spec(**fields: Any) -> TaskSpec:
    base = {"id": "ask", "agent": "echo", "schedule": {"every": "1m"}, "window": "1m"}
    return TaskSpec.model_validate(base | fields)


# --- hold_back --------------------------------------------------------------------------------


def test_a_tick_that_would_run_is_deferred_until_the_earliest_cool_down_ends() -> None:
    got = hold_back(RUN, {"search": NOW + 9_000, "llm": NOW + 4_000})
    assert got.decision == DEFERRED
    assert not got.final and not got.runs
    assert got.until_ms == NOW + 4_000
    assert got.reason == "upstream breaker open: llm, search"
    assert got.details[HELD_BY] == {"llm": NOW + 4_000, "search": NOW + 9_000}
    assert got.details["late_ms"] == 5_000  # every value the rules saw is kept


@pytest.mark.parametrize(
    "decision",
    [
        Decision(SKIP_WINDOW, "trigger window closed"),
        Decision(WAIT_DEP, "waiting for raw.ready", until_ms=NOW + 60_000),
        Decision(MISSED, "catch-up is disabled"),
        Decision(COALESCED, "coalesced"),
        NOT_BEFORE,
    ],
)
def test_only_a_run_is_held_back(decision: Decision) -> None:
    assert hold_back(decision, {"llm": NOW + 1}) is decision


def test_nothing_open_holds_nothing() -> None:
    assert hold_back(RUN, {}) is RUN


def test_the_whole_chain_then_the_hold() -> None:
    decided = decide_tick(TickFacts(FIRE), spec(upstreams=["llm"]), NOW)
    assert decided.runs
    held = hold_back(decided, {"llm": NOW + 1_000})
    assert (held.decision, held.until_ms) == (DEFERRED, NOW + 1_000)
    assert held.details["open_until_ms"] == FIRE + 60_000


# --- which decisions are holds, and what is recorded again ------------------------------------


def test_a_hold_is_told_apart_from_a_not_before_deferral() -> None:
    assert is_held(HELD)
    assert not is_held(NOT_BEFORE)
    assert not is_held(RUN)
    assert not is_held(None)
    assert held_upstreams(HELD) == ("llm",)
    assert held_upstreams(NOT_BEFORE) == ()


@pytest.mark.parametrize(
    ("left", "expected"),
    [
        ({}, {}),
        ({"llm": 25_000}, {"llm": NOW + 25_000}),
        ({"llm": 0, "db": -5}, {"db": NOW + 1, "llm": NOW + 1}),  # never re-check "now": no spin
    ],
)
def test_cool_downs_left_become_instants_on_the_scheduler_clock(
    left: dict[str, int], expected: dict[str, int]
) -> None:
    assert hold_until(left, NOW) == expected


# --- released ---------------------------------------------------------------------------------


def test_the_final_decision_of_a_held_tick_says_it_was_held() -> None:
    got = released(HELD, RUN)
    assert got.runs
    assert got.reason == "every rule passed (after being held back by the open breaker of llm)"
    assert got.details[HELD_BACK_BY] == {"llm": NOW + 30_000}
    dropped = released(HELD, Decision(MISSED, "catch-up is disabled", {"late_ms": 70_000}))
    assert dropped.decision == MISSED
    assert dropped.reason.startswith("catch-up is disabled (after being held back")
    duplicate = released(HELD, Decision(SKIP_DUPLICATED, "exists"))
    assert duplicate.details[HELD_BACK_BY] == {"llm": NOW + 30_000}


@pytest.mark.parametrize("previous", [None, NOT_BEFORE, Decision(WAIT_DEP, "waiting")])
def test_ticks_that_were_not_held_are_unchanged(previous: Decision | None) -> None:
    assert released(previous, RUN) is RUN


def test_the_final_decision_of_a_tick_that_waited_for_maintenance_says_so() -> None:
    calendar = {"rule": "maintenance", "maintenance": "01:00-02:00", "until_ms": NOW}
    waited = Decision(DEFERRED, "calendar: inside maintenance window", {"calendar": calendar}, NOW)
    got = released(waited, RUN)
    assert got.reason == "every rule passed (after waiting for maintenance window 01:00-02:00)"
    assert got.details[WAITED_FOR_MAINTENANCE] == {"maintenance": "01:00-02:00", "until_ms": NOW}
    folded = released(waited, Decision(COALESCED, "coalesced into a newer tick that is on time"))
    assert folded.reason.endswith("(after waiting for maintenance window 01:00-02:00)")
    assert released(waited, waited) is waited  # still waiting: not final


def test_a_still_waiting_tick_is_not_released() -> None:
    again = hold_back(RUN, {"llm": NOW + 60_000})
    assert released(HELD, again) is again


# --- a held tick that turned late follows the catch-up policy ---------------------------------


@pytest.mark.parametrize(
    ("catchup", "late_ms", "expected"),
    [
        ({}, 2 * 60_000, SHOULD_RUN),
        ({"enabled": False}, 2 * 60_000, MISSED),
        ({"max_delay": "10m"}, 11 * 60_000, MISSED),
    ],
)
def test_a_late_held_tick_is_planned_like_any_late_tick(
    catchup: dict[str, Any], late_ms: int, expected: str
) -> None:
    task = spec(upstreams=["llm"], catchup=catchup)
    [(_, planned)] = plan_catchup([NOW - late_ms], NOW, task).entries
    assert planned.decision == expected
    assert released(HELD, planned).details[HELD_BACK_BY] == {"llm": NOW + 30_000}


# --- explain ----------------------------------------------------------------------------------


def test_explain_names_the_breaker_rule_for_a_hold() -> None:
    assert rule_of(HELD.decision, HELD.details) == (
        "upstream breaker (open)",
        {HELD_BY: {"llm": NOW + 30_000}},
    )
    assert rule_of(NOT_BEFORE.decision, NOT_BEFORE.details)[0] == "not_before / off_peak"


# --- the breaker side: cool-down left, read on the breaker's own clock ------------------------

COOL = BreakerConfig(failure_threshold=1, cooldown_ms=30_000)


@pytest.mark.parametrize(
    ("state", "now_ms", "left"),
    [
        (BreakerState(), NOW, 0),
        (BreakerState(BreakerStatus.HALF_OPEN, since_ms=NOW - 1), NOW, 0),
        (BreakerState(BreakerStatus.OPEN, since_ms=NOW), NOW, 30_000),
        (BreakerState(BreakerStatus.OPEN, since_ms=NOW), NOW + 29_999, 1),
        (BreakerState(BreakerStatus.OPEN, since_ms=NOW), NOW + 30_000, 0),  # probes may run
        (BreakerState(BreakerStatus.OPEN, since_ms=NOW), NOW + 90_000, 0),
    ],
)
def test_cooldown_left(state: BreakerState, now_ms: int, left: int) -> None:
    assert cooldown_left_ms(state, now_ms, COOL) == left


async def test_the_adapter_reports_open_breakers_until_their_cool_down_ends() -> None:
    clock = FixedClock(NOW)
    breakers = MemoryBreakers(clock)
    holds = BreakerHolds(breakers, COOL)
    assert await holds.held(["llm", "db"]) == {}
    await breakers.record("llm", Outcome.FAILURE, COOL, probe_round=None)
    clock.advance(10_000)
    assert await holds.held(["llm", "db", "llm"]) == {"llm": 20_000}
    assert await holds.held([]) == {}
    clock.advance(20_000)
    assert await holds.held(["llm"]) == {}
    state = await breakers.state("llm")
    assert state.status is BreakerStatus.OPEN  # reading changed nothing
