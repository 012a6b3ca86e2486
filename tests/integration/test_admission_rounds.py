"""A run's own half-open probe admission, used by its first call after its round has ended:
the call must not go out as a probe of a round that no longer is (into a breaker that has
opened again, or beside the probes of a newer round), but be admitted anew."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.rigs import RedisRig

CFG = BreakerConfig(failure_threshold=1, cooldown_ms=20, probes=2, probe_timeout_ms=600_000)


@pytest.fixture
def gate(store: SqlStore, redis: streams.Redis, keys: Keys) -> UpstreamGate:
    return UpstreamGate(store, RedisLimiter(redis, keys), RedisBreakers(redis, keys), CFG)


async def _half_open(gate: UpstreamGate, rig: RedisRig) -> tuple[RunUpstreams, RunUpstreams]:
    """`api`'s breaker opened by a failure, its cool-down over, and two runs holding its two
    probes of the round that follows."""
    assert await gate.record_call("api", Outcome.FAILURE, probe_round=None) is not None
    opened = await rig.breakers.state("api")
    await rig.wait_until_ms(opened.since_ms + CFG.cooldown_ms)
    first, second = await gate.admit_run(["api"]), await gate.admit_run(["api"])
    assert isinstance(first, RunUpstreams) and isinstance(second, RunUpstreams)
    return first, second


async def test_a_probe_whose_round_reopened_the_breaker_is_not_sent(
    gate: UpstreamGate, redis: streams.Redis, keys: Keys
) -> None:
    """Two probes; one run's call fails and re-opens the breaker while the other run's agent
    has not called yet. That call must wait out the new cool-down, not go into the outage."""
    rig = RedisRig(redis, keys)
    slow, failing = await _half_open(gate, rig)
    ticket = await failing.acquire("api")
    assert not isinstance(ticket, int)
    assert await failing.record(ticket, Outcome.FAILURE) is not None
    assert (await rig.breakers.state("api")).status is BreakerStatus.OPEN
    late = await slow.acquire("api")
    assert isinstance(late, int), f"sent as a probe of an ended round: {late}"


async def test_no_more_probes_than_configured_go_out_in_a_new_round(
    gate: UpstreamGate, redis: streams.Redis, keys: Keys
) -> None:
    """As above, and the new cool-down is over too: two other runs hold the new round's two
    probes. The slow run's call would be a third trial call at once."""
    rig = RedisRig(redis, keys)
    slow, failing = await _half_open(gate, rig)
    ticket = await failing.acquire("api")
    assert not isinstance(ticket, int)
    await failing.record(ticket, Outcome.FAILURE)
    opened = await rig.breakers.state("api")
    await rig.wait_until_ms(opened.since_ms + CFG.cooldown_ms)
    newer = [await gate.admit_run(["api"]), await gate.admit_run(["api"])]
    assert all(isinstance(run, RunUpstreams) for run in newer)
    late = await slow.acquire("api")
    assert isinstance(late, int), f"a third probe went out: {late}"
    assert (await rig.breakers.state("api")).probes_admitted == 2


async def test_a_probe_whose_round_ended_goes_as_an_ordinary_call_once_closed(
    gate: UpstreamGate, redis: streams.Redis, keys: Keys
) -> None:
    """As above, and the new round's two probes have succeeded: the breaker is closed, and
    the slow run's call goes as an ordinary one, whose report counts in the closed breaker."""
    rig = RedisRig(redis, keys)
    slow, failing = await _half_open(gate, rig)
    ticket = await failing.acquire("api")
    assert not isinstance(ticket, int)
    await failing.record(ticket, Outcome.FAILURE)
    opened = await rig.breakers.state("api")
    await rig.wait_until_ms(opened.since_ms + CFG.cooldown_ms)
    for run in [await gate.admit_run(["api"]), await gate.admit_run(["api"])]:
        assert isinstance(run, RunUpstreams)
        await run.settle(Outcome.SUCCESS)
    assert (await rig.breakers.state("api")).status is BreakerStatus.CLOSED
    late = await slow.acquire("api")
    assert not isinstance(late, int) and late.probe_round is None
    await slow.record(late, Outcome.FAILURE)
    assert (await rig.breakers.state("api")).status is BreakerStatus.OPEN
