"""A run cancelled (a stop past its grace, a fence) while it is being admitted to its
upstreams gives back what the admission took so far: no call goes out, and a half-open
probe kept would refuse every run on every executor until `probe_timeout` passed, a window
slot kept would count for a call never sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.core import futures, streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.rigs import RedisRig
from tests.ratelimit.virtual_time import virtual

CFG = BreakerConfig(failure_threshold=1, cooldown_ms=20, probes=1, probe_timeout_ms=600_000)


class _HeldLimiter(RedisLimiter):
    """The real limiter, whose `acquire` for `held` waits until released (a Redis that
    answers slowly); `entered` is set when it starts waiting."""

    held = "llm"

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.entered = asyncio.Event()
        self.release_ = asyncio.Event()

    async def acquire(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == self.held:
            self.entered.set()
            await self.release_.wait()
        return await super().acquire(name, *args, **kwargs)


@pytest.fixture
async def setup(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> tuple[UpstreamGate, _HeldLimiter, RedisBreakers]:
    limited = {"limit": 100, "window": 60.0, "burst": None}
    await store.upsert_upstreams({"llm": limited, "api": limited})
    limiter, breakers = _HeldLimiter(redis, keys), RedisBreakers(redis, keys)
    return UpstreamGate(store, limiter, breakers, CFG), limiter, breakers


async def _cancelled_midway(gate: UpstreamGate, limiter: _HeldLimiter, *names: str) -> None:
    admitting = asyncio.create_task(gate.admit_run(list(names)))
    await asyncio.wait_for(limiter.entered.wait(), timeout=10)
    admitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitting


async def test_a_run_cancelled_while_admitted_gives_back_its_probe(
    setup: tuple[UpstreamGate, _HeldLimiter, RedisBreakers], redis: streams.Redis, keys: Keys
) -> None:
    gate, limiter, breakers = setup
    assert await gate.record_call("llm", Outcome.FAILURE, probe_round=None) is not None
    await RedisRig(redis, keys).wait_until_ms((await breakers.state("llm")).since_ms + 20)
    await _cancelled_midway(gate, limiter, "llm")  # the probe is taken, the window asked
    state = await breakers.state("llm")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)
    decision = await breakers.admit("llm", CFG)
    assert decision.allowed, f"probe kept: runs refused for {decision.retry_after_ms} ms"


async def test_a_run_cancelled_while_admitted_gives_back_its_window_slots(
    setup: tuple[UpstreamGate, _HeldLimiter, RedisBreakers], redis: streams.Redis, keys: Keys
) -> None:
    gate, limiter, _ = setup
    await _cancelled_midway(gate, limiter, "api", "llm")  # `api` admitted, `llm` asked
    assert await redis.zcard(keys.limiter("api")) == 0


class _HeldReports(RedisBreakers):
    """The real breakers, whose first report waits until `go` is set: before it is made
    (`made_first` False: a slow request) or after (a reply slow to come back); `entered` is
    set when it waits."""

    made_first = True

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.entered, self.go = asyncio.Event(), asyncio.Event()

    async def record(self, *args: Any, **kwargs: Any) -> Any:
        first = not self.entered.is_set()
        update = await super().record(*args, **kwargs) if self.made_first or not first else None
        if first:
            self.entered.set()
            await self.go.wait()
        return update if update is not None else await super().record(*args, **kwargs)


async def _half_open(
    store: SqlStore, redis: streams.Redis, keys: Keys, probes: int, full: list[str]
) -> tuple[UpstreamGate, _HeldReports, RedisBreakers]:
    """A gate on a clock of the test's, and the breakers of another executor: `api`
    half-open (`probes` trial calls, none out), `api` and `llm` limited to one call a
    minute, taken for those in `full`."""
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=1_000, probes=probes)
    await store.upsert_upstreams(
        {
            "api": {"limit": 1, "window": 60.0, "burst": None},
            "llm": {"limit": 1, "window": 60.0, "burst": None},
        }
    )
    clock = FixedClock(await store.db_now_ms())
    on_clock = virtual(redis, clock)
    breakers = _HeldReports(on_clock, keys)
    gate = UpstreamGate(store, RedisLimiter(on_clock, keys), breakers, cfg)
    for name in full:
        assert (await gate.admit_call(name))[0] is None
    other = RedisBreakers(on_clock, keys)
    await other.record("api", Outcome.FAILURE, cfg, probe_round=None)
    clock.advance(cfg.cooldown_ms)
    return gate, breakers, other


async def _cancelled_handing_back(
    gate: UpstreamGate, breakers: _HeldReports, upstreams: list[str]
) -> None:
    """Admit a run to `upstreams`, cancel it while its first report waits, then let the
    report go and wait for the give-backs still going."""
    admitting = asyncio.create_task(gate.admit_run(upstreams))
    await asyncio.wait_for(breakers.entered.wait(), timeout=10)
    admitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitting
    breakers.go.set()
    if futures._DETACHED:
        await asyncio.wait(set(futures._DETACHED), timeout=10)


async def test_a_run_cancelled_while_handing_back_a_refused_admission_gives_it_back_once(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """`probes` 2: another executor's probe of `api` is out, and a run takes the second,
    then `llm` refuses it (its window is full). The run is cancelled while the probe is
    being handed back, after the hand-back was made: the probe must not be handed back a
    second time, which would free a slot the other probe holds (three trial calls)."""
    gate, breakers, other = await _half_open(store, redis, keys, probes=2, full=["llm"])
    assert (await other.admit("api", gate.config("api"))).probe
    await _cancelled_handing_back(gate, breakers, ["api", "llm"])
    state = await breakers.state("api")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 1)


async def test_a_run_cancelled_while_handing_back_its_refused_probe_gives_it_back(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """`probes` 1: a run takes `api`'s probe, then `api`'s own window refuses it; the run
    is cancelled before the probe's hand-back is made. It must still be made, or every run
    is refused until `probe_timeout` (60 s) passes."""
    gate, breakers, _ = await _half_open(store, redis, keys, probes=1, full=["api"])
    breakers.made_first = False
    await _cancelled_handing_back(gate, breakers, ["api"])
    state = await breakers.state("api")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)
