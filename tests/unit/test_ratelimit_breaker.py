"""The pure circuit breaker: scripted scenarios from a table, the HTTP classification, and
properties over random sequences. Times are integers of milliseconds; no clock, no sleeps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.errors import ConfigError
from taskstream.ratelimit.breaker import (
    BreakerState,
    BreakerStatus,
    Outcome,
    Transition,
    admit,
    classify_http,
    fresh,
    record,
    transition,
)
from taskstream.ratelimit.breaker_config import BreakerConfig

CFG = BreakerConfig()
CLOSED, OPEN, HALF = BreakerStatus.CLOSED, BreakerStatus.OPEN, BreakerStatus.HALF_OPEN
S, F, IG = Outcome.SUCCESS, Outcome.FAILURE, Outcome.IGNORE

# A step is (at_ms, what) where `what` is an outcome to record or "+" / "-" for an admission
# expected to be allowed / rejected. The expected status is checked after the last step.
Step = tuple[int, Outcome | str]


def _run(steps: list[Step], cfg: BreakerConfig = CFG) -> BreakerState:
    state = BreakerState()
    for at_ms, what in steps:
        if isinstance(what, Outcome):
            state = record(state, what, at_ms, cfg, probe_round=state.since_ms)
            continue
        decision, state = admit(state, at_ms, cfg)
        assert decision.allowed == (what == "+"), (at_ms, what, state)
    return state


_CODES = {"S": S, "F": F, "I": IG}


def _each(outcomes: str, at_ms: int = 0) -> list[Step]:
    """One step per letter of `outcomes` (S, F, I), all at `at_ms`."""
    return [(at_ms, _CODES[c]) for c in outcomes]


OPENED_AT_0 = _each("FFFFF")
RATE = BreakerConfig(failure_threshold=100, min_calls=4, failure_rate=0.5, window_ms=1_000)
TWO_PROBES = BreakerConfig(probes=2)


@pytest.mark.parametrize(
    ("steps", "cfg", "status"),
    [
        pytest.param([(0, "+")], CFG, CLOSED, id="new-breaker-admits"),
        pytest.param(_each("FFFF"), CFG, CLOSED, id="four-failures-stay-closed"),
        pytest.param(OPENED_AT_0, CFG, OPEN, id="five-failures-open"),
        pytest.param(_each("FFFFSFFFF"), CFG, CLOSED, id="success-resets-the-run"),
        pytest.param(_each("FFFFIF"), CFG, OPEN, id="ignore-does-not-reset-the-run"),
        pytest.param(_each("I" * 50), CFG, CLOSED, id="ignores-never-open"),
        pytest.param(_each("SFS"), RATE, CLOSED, id="rate-below-min-calls"),
        pytest.param(_each("SFSF"), RATE, OPEN, id="rate-at-min-calls-opens"),
        pytest.param(_each("SSSF"), RATE, CLOSED, id="rate-under-threshold"),
        pytest.param([*_each("FFF"), (1_000, F)], RATE, CLOSED, id="window-rolls-over"),
        pytest.param([*OPENED_AT_0, (29_999, "-")], CFG, OPEN, id="open-during-cool-down"),
        pytest.param([*OPENED_AT_0, (30_000, "+")], CFG, HALF, id="half-open-after-cool-down"),
        pytest.param([*OPENED_AT_0, *_each("SSS", 10)], CFG, OPEN, id="open-ignores-outcomes"),
        pytest.param([*OPENED_AT_0, (30_000, "+"), (30_001, "-")], CFG, HALF, id="one-probe"),
        pytest.param([*OPENED_AT_0, (30_000, "+"), (30_001, S)], CFG, CLOSED, id="probe-ok"),
        pytest.param([*OPENED_AT_0, (30_000, "+"), (30_001, F)], CFG, OPEN, id="probe-fails"),
        pytest.param(
            [*OPENED_AT_0, (30_000, "+"), (30_001, IG), (30_002, "+")], CFG, HALF, id="probe-4xx"
        ),
        pytest.param(
            [*OPENED_AT_0, (30_000, "+"), (89_999, "-"), (90_000, "+")], CFG, HALF, id="lost-probe"
        ),
        pytest.param(
            [*OPENED_AT_0, (30_000, "+"), (30_000, "+"), (30_000, "-"), (30_001, S)],
            TWO_PROBES,
            HALF,
            id="two-probes-one-ok",
        ),
        pytest.param(
            [*OPENED_AT_0, (30_000, "+"), (30_000, "+"), *_each("SS", 30_001)],
            TWO_PROBES,
            CLOSED,
            id="two-probes-both-ok",
        ),
        pytest.param(
            [*OPENED_AT_0, (30_000, "+"), (30_000, "+"), *_each("SF", 30_001)],
            TWO_PROBES,
            OPEN,
            id="two-probes-one-fails",
        ),
    ],
)
def test_scenarios(steps: list[Step], cfg: BreakerConfig, status: BreakerStatus) -> None:
    assert _run(steps, cfg).status is status


def test_open_rejects_with_the_rest_of_the_cool_down() -> None:
    decision, _ = admit(fresh(OPEN, 1_000), 21_000, CFG)
    assert (decision.allowed, decision.retry_after_ms, decision.transition) == (False, 10_000, None)


def test_half_opening_is_reported_once() -> None:
    first, state = admit(fresh(OPEN, 0), 30_000, CFG)
    second, state = admit(state, 30_005, CFG)
    assert (first.allowed, first.probe, first.transition) == (True, True, Transition.HALF_OPENED)
    assert (second.allowed, second.retry_after_ms, second.transition) == (False, 59_995, None)


def test_every_change_starts_fresh() -> None:
    opened = record(replace(fresh(CLOSED, 0), consecutive_failures=4), F, 7, CFG, probe_round=None)
    assert opened == fresh(OPEN, 7)
    closed = record(replace(fresh(HALF, 7), probes_admitted=1), S, 9, CFG, probe_round=7)
    assert closed == fresh(CLOSED, 9)


def _half_open_with_probe(cfg: BreakerConfig = CFG) -> tuple[BreakerState, int]:
    """A breaker half-opened at 30 s with one probe out; and that probe's round."""
    decision, state = admit(fresh(OPEN, 0), 30_000, cfg)
    assert decision.probe_round == 30_000
    return state, decision.probe_round


@pytest.mark.parametrize("outcome", [S, F, IG])
def test_a_probe_of_an_ended_round_changes_nothing(outcome: Outcome) -> None:
    state, stale = _half_open_with_probe()
    # Its slot timed out and went to a new probe, which is still out.
    newer, state = admit(state, 30_000 + CFG.probe_timeout_ms, CFG)
    assert newer.probe_round == 30_000 + CFG.probe_timeout_ms != stale
    assert record(state, outcome, 95_000, CFG, probe_round=stale) == state
    refused, _ = admit(state, 95_001, CFG)  # one probe at a time, not the stale one's freed slot
    assert not refused.allowed


def test_the_new_rounds_probe_still_decides() -> None:
    state, _ = _half_open_with_probe()
    newer, state = admit(state, 90_000, CFG)
    assert record(state, S, 90_001, CFG, probe_round=newer.probe_round).status is CLOSED


def test_a_probe_from_an_earlier_half_open_does_not_close_a_later_one() -> None:
    state, early = _half_open_with_probe()
    state = record(state, F, 30_001, CFG, probe_round=state.since_ms)  # another probe failed
    later, state = admit(state, 60_001, CFG)  # cool-down over: a new half-open round
    assert later.probe_round == 60_001 != early
    assert record(state, S, 60_002, CFG, probe_round=early) == state
    assert record(state, S, 60_002, CFG, probe_round=later.probe_round).status is CLOSED


def test_a_probe_taking_a_slot_given_back_gets_its_whole_timeout() -> None:
    """`probes` 1: probe A's call is ignored (a 404), which frees its slot; B takes it late in
    the round. B is not presumed lost when the round is a timeout old, only when B is: a
    third caller is refused meanwhile, and B's failure still re-opens the breaker."""
    state, first = _half_open_with_probe()
    state = record(state, IG, 30_010, CFG, probe_round=first)
    late, state = admit(state, 89_999, CFG)
    assert late.probe_round == first  # the same round
    third, state = admit(state, 90_000, CFG)
    assert (third.allowed, third.retry_after_ms) == (False, CFG.probe_timeout_ms - 1)
    assert record(state, F, 90_500, CFG, probe_round=late.probe_round).status is OPEN
    again, _ = admit(state, 89_999 + CFG.probe_timeout_ms, CFG)  # now B is presumed lost
    assert again.probe and again.probe_round != first


def test_successes_of_a_round_stay_when_its_slots_are_handed_out_again() -> None:
    state, first = _half_open_with_probe(TWO_PROBES)
    second, state = admit(state, 30_000, TWO_PROBES)
    state = record(state, S, 30_001, TWO_PROBES, probe_round=first)
    third, state = admit(state, 90_000, TWO_PROBES)  # the second probe's slot timed out
    assert third.probe_round == 90_000 and state.probe_successes == 1
    assert record(state, S, 90_001, TWO_PROBES, probe_round=second.probe_round) == state
    assert record(state, S, 90_001, TWO_PROBES, probe_round=90_000).status is CLOSED


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        (CLOSED, OPEN, Transition.OPENED),
        (HALF, OPEN, Transition.OPENED),
        (OPEN, HALF, Transition.HALF_OPENED),
        (HALF, CLOSED, Transition.CLOSED),
        (CLOSED, CLOSED, None),
        (OPEN, OPEN, None),
    ],
)
def test_transitions(before: BreakerStatus, after: BreakerStatus, want: Transition | None) -> None:
    assert transition(before, after) == want


@pytest.mark.parametrize(
    ("status", "timed_out", "want"),
    [
        (200, False, S),
        (204, False, S),
        (302, False, S),
        (399, False, S),
        (400, False, IG),
        (404, False, IG),
        (409, False, IG),
        (429, False, F),
        (499, False, IG),
        (500, False, F),
        (503, False, F),
        (599, False, F),
        (None, False, F),
        (None, True, F),
        (200, True, F),
        (100, False, IG),
        (600, False, IG),
    ],
)
def test_classify_http(status: int | None, timed_out: bool, want: Outcome) -> None:
    assert classify_http(status, timed_out) is want


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": 0},
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"window_ms": 0},
        {"min_calls": 0},
        {"cooldown_ms": 0},
        {"probes": 0},
        {"probe_timeout_ms": 0},
    ],
)
def test_config_out_of_range(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]


events = st.lists(
    st.tuples(st.integers(min_value=0, max_value=20_000), st.sampled_from(["admit", *Outcome])),
    max_size=120,
)
configs = st.builds(
    BreakerConfig,
    failure_threshold=st.integers(min_value=1, max_value=6),
    failure_rate=st.sampled_from([0.25, 0.5, 1.0]),
    window_ms=st.integers(min_value=1, max_value=50_000),
    min_calls=st.integers(min_value=1, max_value=12),
    cooldown_ms=st.integers(min_value=1, max_value=50_000),
    probes=st.integers(min_value=1, max_value=3),
    probe_timeout_ms=st.integers(min_value=1, max_value=50_000),
)


def _check_invariants(state: BreakerState, cfg: BreakerConfig) -> None:
    if state.status is HALF:
        assert 0 <= state.probes_admitted <= cfg.probes
        assert 0 <= state.probe_successes < cfg.probes
    else:
        assert state.probes_admitted == state.probe_successes == 0
    if state.status is CLOSED:
        assert 0 <= state.consecutive_failures < cfg.failure_threshold
        assert 0 <= state.window_failures <= state.window_calls


@given(events=events, cfg=configs)
def test_random_sequences_keep_the_invariants(
    events: list[tuple[int, str]], cfg: BreakerConfig
) -> None:
    state, now = BreakerState(), 0
    for gap, what in events:
        now += gap
        if what != "admit":
            state = record(state, Outcome(what), now, cfg, probe_round=state.since_ms)
            _check_invariants(state, cfg)
            continue
        before = state
        decision, state = admit(state, now, cfg)
        _check_invariants(state, cfg)
        assert decision.allowed == (decision.retry_after_ms == 0)
        assert decision.status is state.status
        if before.status is OPEN and now < before.since_ms + cfg.cooldown_ms:
            assert not decision.allowed
        if state.status is CLOSED:
            assert decision.allowed and not decision.probe
        if state.status is HALF:
            # Every admission in half-open is a probe, and only a full set of slots rejects.
            assert decision.probe == decision.allowed
            assert decision.allowed or state.probes_admitted == cfg.probes
