"""The `Breakers` contract, run over the in-memory twin and Redis.

Cool-downs that a test must outlast are 50 ms, and the backend's clock is moved past them with
`Rig.wait_until_ms` (the memory clock jumps; Redis's `TIME` is polled). Cool-downs a test must
stay inside are 60 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from taskstream.ratelimit.breaker import BreakerStatus, Outcome, Transition
from taskstream.ratelimit.breaker_config import BreakerConfig
from tests.ratelimit.rigs import KINDS, Rig, open_rig

LONG = BreakerConfig(failure_threshold=3, cooldown_ms=60_000, probe_timeout_ms=60_000)
SHORT = BreakerConfig(failure_threshold=3, cooldown_ms=50, probe_timeout_ms=60_000)
S, F, IGNORE = Outcome.SUCCESS, Outcome.FAILURE, Outcome.IGNORE


@pytest.fixture(params=KINDS)
async def rig(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    async with open_rig(request.param, redis_url, namespace) as opened:
        yield opened


async def _report(rig: Rig, cfg: BreakerConfig, *outcomes: Outcome) -> list[Transition | None]:
    """Record `outcomes` one by one, each as a probe of the round current when it is recorded
    (a closed breaker does not look at the round)."""
    transitions = []
    for outcome in outcomes:
        current = (await rig.breakers.state("api")).since_ms
        update = await rig.breakers.record("api", outcome, cfg, probe_round=current)
        transitions.append(update.transition)
    return transitions


async def _half_open(rig: Rig, cfg: BreakerConfig) -> int:
    """Open the breaker, outlast the cool-down, take the first probe; its round."""
    await _report(rig, cfg, *[F] * cfg.failure_threshold)
    opened = await rig.breakers.state("api")
    await rig.wait_until_ms(opened.since_ms + cfg.cooldown_ms)
    first = await rig.breakers.admit("api", cfg)
    assert (first.allowed, first.probe, first.transition) == (True, True, Transition.HALF_OPENED)
    assert first.probe_round == (await rig.breakers.state("api")).since_ms
    return first.probe_round


async def test_a_new_breaker_is_closed_and_admits(rig: Rig) -> None:
    decision = await rig.breakers.admit("api", LONG)
    assert (decision.allowed, decision.probe, decision.status) == (True, False, "closed")
    assert decision.transition is None
    assert (await rig.breakers.state("api")).status is BreakerStatus.CLOSED


async def test_consecutive_failures_open_it(rig: Rig) -> None:
    assert await _report(rig, LONG, F, F, S, F, F) == [None] * 5
    assert await _report(rig, LONG, F) == [Transition.OPENED]
    decision = await rig.breakers.admit("api", LONG)
    assert (decision.allowed, decision.status, decision.transition) == (False, "open", None)
    assert 55_000 < decision.retry_after_ms <= 60_000


async def test_a_failure_rate_over_min_calls_opens_it(rig: Rig) -> None:
    cfg = BreakerConfig(failure_threshold=100, min_calls=6, failure_rate=0.5, cooldown_ms=60_000)
    assert await _report(rig, cfg, S, F, S, F, S) == [None] * 5
    assert await _report(rig, cfg, F) == [Transition.OPENED]


@pytest.mark.parametrize(
    ("rate", "calls", "failures"), [(0.28, 25, 7), (0.56, 25, 14), (0.14, 50, 7), (0.5, 10, 5)]
)
async def test_exactly_the_failure_rate_opens_it(
    rig: Rig, rate: float, calls: int, failures: int
) -> None:
    """ "At least" the share: 7 failures of 25 calls at 0.28 open it, though 0.28 * 25 is
    7.000000000000001 in floating point."""
    cfg = BreakerConfig(failure_threshold=100, min_calls=calls, failure_rate=rate)
    transitions = await _report(rig, cfg, *[S] * (calls - failures), *[F] * failures)
    assert transitions[-1] is Transition.OPENED
    assert transitions[:-1] == [None] * (calls - 1)


async def test_ignored_outcomes_count_neither_way(rig: Rig) -> None:
    assert await _report(rig, LONG, F, F, IGNORE, IGNORE) == [None] * 4
    state = await rig.breakers.state("api")
    assert (state.consecutive_failures, state.window_calls, state.window_failures) == (2, 2, 2)
    assert await _report(rig, LONG, F) == [Transition.OPENED]


async def test_outcomes_while_open_change_nothing(rig: Rig) -> None:
    await _report(rig, LONG, F, F, F)
    before = await rig.breakers.state("api")
    assert await _report(rig, LONG, S, F, IGNORE) == [None] * 3
    assert await rig.breakers.state("api") == before


async def test_after_the_cool_down_one_probe_goes_and_others_wait(rig: Rig) -> None:
    await _half_open(rig, SHORT)
    second = await rig.breakers.admit("api", SHORT)
    assert (second.allowed, second.status, second.transition) == (False, "half_open", None)
    assert 55_000 < second.retry_after_ms <= 60_000


@pytest.mark.parametrize(
    ("outcome", "status", "transition"),
    [(S, "closed", Transition.CLOSED), (F, "open", Transition.OPENED)],
)
async def test_a_probe_outcome_closes_or_reopens(
    rig: Rig, outcome: Outcome, status: str, transition: Transition
) -> None:
    probe_round = await _half_open(rig, SHORT)
    update = await rig.breakers.record("api", outcome, SHORT, probe_round=probe_round)
    assert (update.state.status, update.transition) == (status, transition)
    assert update.state.consecutive_failures == update.state.probes_admitted == 0


async def test_an_ignored_probe_gives_its_slot_back(rig: Rig) -> None:
    probe_round = await _half_open(rig, SHORT)
    given = await rig.breakers.record("api", IGNORE, SHORT, probe_round=probe_round)
    assert given.transition is None
    assert (await rig.breakers.admit("api", SHORT)).probe


@pytest.mark.parametrize("outcome", [S, F, IGNORE])
async def test_while_half_open_only_the_probes_outcomes_count(rig: Rig, outcome: Outcome) -> None:
    """`probes` 1: a call admitted while the breaker was still closed reports once the probe
    is out. Its success must not close the breaker, its ignored outcome must not free the
    probe's slot for a second probe, its failure must not re-open it: the probe decides."""
    old = await rig.breakers.admit("api", SHORT)
    assert (old.allowed, old.probe) == (True, False)
    probe_round = await _half_open(rig, SHORT)
    update = await rig.breakers.record("api", outcome, SHORT, probe_round=None)
    assert (update.state.status, update.transition) == (BreakerStatus.HALF_OPEN, None)
    assert not (await rig.breakers.admit("api", SHORT)).allowed  # still the one probe out
    closed = await rig.breakers.record("api", S, SHORT, probe_round=probe_round)
    assert closed.transition is Transition.CLOSED


async def test_with_two_probes_both_must_succeed(rig: Rig) -> None:
    cfg = BreakerConfig(failure_threshold=3, cooldown_ms=50, probes=2)
    await _half_open(rig, cfg)
    assert (await rig.breakers.admit("api", cfg)).probe
    assert not (await rig.breakers.admit("api", cfg)).allowed
    assert await _report(rig, cfg, S, S) == [None, Transition.CLOSED]


async def test_a_lost_probe_slot_is_handed_out_again(rig: Rig) -> None:
    cfg = BreakerConfig(failure_threshold=3, cooldown_ms=50, probe_timeout_ms=50)
    await _half_open(rig, cfg)
    slots_given = await rig.breakers.state("api")
    await rig.wait_until_ms(slots_given.since_ms + cfg.probe_timeout_ms)
    again = await rig.breakers.admit("api", cfg)
    assert (again.allowed, again.probe, again.transition) == (True, True, None)


@pytest.mark.parametrize("outcome", [S, F, IGNORE])
async def test_a_probe_reporting_after_its_slot_was_handed_out_again_changes_nothing(
    rig: Rig, outcome: Outcome
) -> None:
    """`probes` 1: the first probe outlives `probe_timeout`, its slot goes to a second probe,
    then the first reports. It must not free the slot for a third concurrent probe, nor close
    or re-open the breaker: the second probe decides. The timeout is long enough that the
    second probe's slot is still out when the test asks for a third."""
    cfg = BreakerConfig(failure_threshold=3, cooldown_ms=50, probe_timeout_ms=500)
    stale = await _half_open(rig, cfg)
    await rig.wait_until_ms(stale + cfg.probe_timeout_ms)
    newer = await rig.breakers.admit("api", cfg)
    assert newer.probe and newer.probe_round != stale
    before = await rig.breakers.state("api")
    update = await rig.breakers.record("api", outcome, cfg, probe_round=stale)
    assert (update.state, update.transition) == (before, None)
    assert not (await rig.breakers.admit("api", cfg)).allowed
    closed = await rig.breakers.record("api", S, cfg, probe_round=newer.probe_round)
    assert closed.transition is Transition.CLOSED


async def test_exactly_one_probe_among_concurrent_callers(rig: Rig) -> None:
    await _report(rig, SHORT, F, F, F)
    opened = await rig.breakers.state("api")
    await rig.wait_until_ms(opened.since_ms + SHORT.cooldown_ms)
    decisions = await asyncio.gather(*(rig.breakers.admit("api", SHORT) for _ in range(10)))
    assert sum(d.allowed for d in decisions) == 1
    assert sum(d.transition is Transition.HALF_OPENED for d in decisions) == 1
    assert all(d.status is BreakerStatus.HALF_OPEN for d in decisions)


async def test_fewer_probes_set_while_half_open_do_not_keep_it_half_open_for_ever(
    rig: Rig,
) -> None:
    """Three probes out, two have succeeded, the third is lost; then `probes` is set to 1
    (`tasks apply`). Once the lost probe's slot times out, the two successes recorded are
    enough under the new setting: the breaker closes, instead of handing out its slots again
    to the successes alone, which fill them, so that no probe is ever admitted to decide it
    and every call is refused for ever."""
    three = BreakerConfig(failure_threshold=3, cooldown_ms=50, probes=3, probe_timeout_ms=200)
    await _half_open(rig, three)
    for _ in range(2):
        assert (await rig.breakers.admit("api", three)).probe
    assert await _report(rig, three, S, S) == [None, None]
    one = replace(three, probes=1)
    state = await rig.breakers.state("api")
    await rig.wait_until_ms(max(state.since_ms, state.last_probe_ms) + one.probe_timeout_ms)
    decision = await rig.breakers.admit("api", one)
    assert (decision.allowed, decision.status) == (True, BreakerStatus.CLOSED), decision
    assert decision.transition is Transition.CLOSED
