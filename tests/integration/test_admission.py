"""Upstream admission on real Redis and a real store: a run over its upstream's limit, or
behind an open breaker, is deferred without spending an attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.outcome import defer_jitter_max_ms
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.backend import GuardUnavailable
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.memory import MemoryBreakers, MemoryLimiter
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.ratelimit.window import Admission, guard_ms
from tests.integration import outages
from tests.integration.harness import Harness, Running, until
from tests.ratelimit.rigs import RedisRig

TASKS = """
upstreams:
  llm: {limit: 1, window: 60s}
tasks:
  - {id: ask, agent: echo, upstreams: [llm], retry: {max_attempts: 1}}
  - {id: flaky, agent: flaky, upstreams: [llm], retry: {max_attempts: 1},
     payload: {fail_until: 99}}
  - {id: busy, agent: flaky, upstreams: [llm], retry: {max_attempts: 1},
     payload: {fail_until: 99, kind: busy}}
"""


def gated(h: Harness, breaker: BreakerConfig | None = None) -> Executor:
    gate = UpstreamGate(
        h.store, RedisLimiter(h.redis, h.keys), RedisBreakers(h.redis, h.keys), breaker
    )
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    return Executor(deps, ExecutorConfig(consumer="g1", block_ms=20))


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    await store.upsert_upstreams({"llm": {"limit": 1, "window": 60.0, "burst": None}})
    return harness


async def status(h: Harness, instance_id: str) -> Status:
    row = await h.store.get_instance(instance_id)
    assert row is not None
    return row.status


async def test_over_the_limit_is_deferred_without_spending_an_attempt(h: Harness) -> None:
    first = await h.trigger(TASKS, "ask", 1_000)
    second = await h.trigger(TASKS, "ask", 2_000)
    ex = Running(gated(h))
    try:

        async def settled() -> bool:
            return {await status(h, first.id), await status(h, second.id)} == {
                Status.SUCCESS,
                Status.RETRYING,
            }

        await until(settled)
    finally:
        await ex.close()
    waiting = first if await status(h, first.id) is Status.RETRYING else second
    row = await h.store.get_instance(waiting.id)
    assert row is not None and row.next_attempt_at_ms is not None
    longest = 61_000 + guard_ms(60_000) + defer_jitter_max_ms(60_000 + guard_ms(60_000))
    assert 50_000 <= row.next_attempt_at_ms - h.clock.now_ms() <= longest
    reasons = [x.reason for x in await h.store.history(waiting.id)]
    assert reasons[-1] == "deferred"
    # max_attempts is 1 and that run never called the upstream: it may still run.
    await h.redis.delete(h.keys.limiter("llm"))
    h.clock.advance(longest)
    await h.scheduler().run_pass()
    ex = Running(gated(h))
    try:

        async def done() -> bool:
            return await status(h, waiting.id) is Status.SUCCESS

        await until(done)
    finally:
        await ex.close()


async def test_a_run_whose_admission_cannot_be_decided_is_deferred(h: Harness) -> None:
    """The limiter and breakers live in a Redis that does not answer: the run is deferred
    without spending an attempt, not dropped while RUNNING."""
    dead = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    gate = UpstreamGate(h.store, RedisLimiter(dead, h.keys), RedisBreakers(dead, h.keys))
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(TASKS, "ask", 1_000)
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:

        async def deferred() -> bool:
            return await status(h, row.id) is Status.RETRYING

        await until(deferred)
    finally:
        await ex.close()
        await dead.aclose()
    assert [x.reason for x in await h.store.history(row.id)][-1] == "deferred"


async def test_an_open_breaker_defers_instead_of_calling(h: Harness) -> None:
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=60_000)
    await h.redis.delete(h.keys.limiter("llm"))
    await h.store.upsert_upstreams({"llm": {"limit": 100, "window": 60.0, "burst": None}})
    failing = await h.trigger(TASKS, "flaky", 1_000)
    ex = Running(gated(h, cfg))
    try:

        async def tripped() -> bool:
            return await status(h, failing.id) is Status.RETRYING

        # Its failure opened the breaker: the outage is known, so even with max_attempts 1
        # the run is deferred, not failed.
        await until(tripped)
        state: Any = await RedisBreakers(h.redis, h.keys).state("llm")
        assert state.status == "open"
        trip = await h.store.get_instance(failing.id)
        assert trip is not None and trip.last_error is not None
        assert [x.reason for x in await h.store.history(failing.id)][-1] == "deferred"
        later = await h.trigger(TASKS, "ask", 2_000)

        async def deferred() -> bool:
            return await status(h, later.id) is Status.RETRYING

        await until(deferred)
    finally:
        await ex.close()
    row = await h.store.get_instance(later.id)
    assert row is not None and row.result is None
    assert [x.reason for x in await h.store.history(later.id)][-1] == "deferred"


async def test_a_failure_that_opens_the_breaker_keeps_the_longer_wait_it_asked_for(
    h: Harness,
) -> None:
    """The agent's own call was answered "retry in 10 min" and its failure opened the breaker
    (cool-down 5 s): the run is deferred for the 10 min, as a call through `ctx.http` would
    be, not for the cool-down only."""
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=5_000)
    await h.store.upsert_upstreams({"llm": {"limit": 100, "window": 60.0, "burst": None}})
    busy = await h.trigger(TASKS, "busy", 1_000)
    ex = Running(gated(h, cfg))
    try:
        await until(lambda: _is(h, busy.id, Status.RETRYING))
    finally:
        await ex.close()
    row = await h.store.get_instance(busy.id)
    assert row is not None and row.next_attempt_at_ms is not None
    assert [x.reason for x in await h.store.history(busy.id)][-1] == "deferred"
    assert row.next_attempt_at_ms - await h.store.db_now_ms() >= 590_000


class _BrokenLimiter(RedisLimiter):
    """The real limiter with a defect: every acquire raises an error nobody expects."""

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("limiter defect")


class _BrokenBreakers(RedisBreakers):
    """The real breakers, except that recording an outcome raises an error nobody expects."""

    async def record(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("breaker defect")


async def test_an_unexpected_admission_error_is_a_retriable_failure_not_a_lost_run(
    h: Harness,
) -> None:
    """The run ends (FAILED here: one attempt allowed) and its entry is acked, instead of the
    run's task dying and leaving the row RUNNING until its lease runs out."""
    gate = UpstreamGate(h.store, _BrokenLimiter(h.redis, h.keys), RedisBreakers(h.redis, h.keys))
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(TASKS, "ask")
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:
        await until(lambda: _is(h, row.id, Status.FAILED))
    finally:
        await ex.close()
    found = await h.store.get_instance(row.id)
    assert found is not None
    assert (found.attempt, found.last_error) == (1, "RuntimeError: limiter defect")
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


async def test_an_unexpected_error_recording_the_outcome_leaves_the_runs_end_standing(
    h: Harness,
) -> None:
    """The agent ran and succeeded; only its breaker bookkeeping failed: SUCCESS, once."""
    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), _BrokenBreakers(h.redis, h.keys))
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(TASKS, "ask")
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:
        await until(lambda: _is(h, row.id, Status.SUCCESS))
    finally:
        await ex.close()
    history = await h.store.history(row.id)
    assert [x.to_status for x in history].count(Status.RUNNING) == 1


async def _is(h: Harness, instance_id: str, wanted: Status) -> bool:
    return await status(h, instance_id) is wanted


async def test_a_refused_run_hands_back_the_slots_it_took_before_the_refusal(
    h: Harness,
) -> None:
    """A run declares [api, full]; `full` has no slot left, so the run is deferred and no
    call goes out. The slot it took of `api` first must be free again, or each retry of the
    run would use up `api` without ever calling it."""
    await h.store.upsert_upstreams(
        {
            "api": {"limit": 1, "window": 60.0, "burst": None},
            "full": {"limit": 1, "window": 60.0, "burst": None},
        }
    )
    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), RedisBreakers(h.redis, h.keys))
    assert (await gate.admit_call("full"))[0] is None  # its one slot is taken
    assert isinstance(await gate.admit_run(["api", "full"]), int)
    assert await h.redis.zcard(h.keys.limiter("api")) == 0
    assert (await gate.admit_call("api"))[0] is None


async def test_a_run_admitted_before_the_breaker_opened_does_not_decide_its_probe(
    h: Harness,
) -> None:
    """`probes` 1. A run is admitted while the breaker is closed; other calls trip it; after
    the cool-down another run takes the one probe. The first run ending (successfully,
    say) must neither close the breaker nor free the probe: only the probe's run does."""
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=50, probes=1)
    breakers = RedisBreakers(h.redis, h.keys)
    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), breakers, cfg)
    await h.store.upsert_upstreams({"api": {"limit": 100, "window": 60.0, "burst": None}})
    old = await gate.admit_run(["api"])
    assert isinstance(old, RunUpstreams)
    assert await gate.record_call("api", Outcome.FAILURE, probe_round=None) is not None
    opened = await breakers.state("api")
    await RedisRig(h.redis, h.keys).wait_until_ms(opened.since_ms + cfg.cooldown_ms)
    probe = await gate.admit_run(["api"])
    assert isinstance(probe, RunUpstreams)
    await old.settle(Outcome.SUCCESS)
    assert (await breakers.state("api")).status is BreakerStatus.HALF_OPEN
    assert (await gate.admit_call("api"))[0] is not None  # the probe is still out
    await probe.settle(Outcome.SUCCESS)
    assert (await breakers.state("api")).status is BreakerStatus.CLOSED


@pytest.mark.parametrize("outcome", [Outcome.SUCCESS, Outcome.FAILURE, Outcome.IGNORE])
async def test_a_probe_run_that_outlived_its_slot_does_not_decide_the_next_probe(
    h: Harness, outcome: Outcome
) -> None:
    """`probes` 1. A probe's run outlives `probe_timeout`, so its slot goes to a second run;
    then the first run ends. Its outcome must not free the slot for a third run (two trial
    calls at once), close the breaker, or re-open it: the second run's probe decides."""
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=50, probes=1, probe_timeout_ms=500)
    breakers = RedisBreakers(h.redis, h.keys)
    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), breakers, cfg)
    await h.store.upsert_upstreams({"api": {"limit": 100, "window": 60.0, "burst": None}})
    assert await gate.record_call("api", Outcome.FAILURE, probe_round=None) is not None
    rig = RedisRig(h.redis, h.keys)
    await rig.wait_until_ms((await breakers.state("api")).since_ms + cfg.cooldown_ms)
    slow = await gate.admit_run(["api"])
    assert isinstance(slow, RunUpstreams)
    await rig.wait_until_ms((await breakers.state("api")).since_ms + cfg.probe_timeout_ms)
    second = await gate.admit_run(["api"])
    assert isinstance(second, RunUpstreams)
    held = await breakers.state("api")
    await slow.settle(outcome)
    assert await breakers.state("api") == held
    assert isinstance(await gate.admit_run(["api"]), int)  # the second probe is still out
    await second.settle(Outcome.SUCCESS)
    assert (await breakers.state("api")).status is BreakerStatus.CLOSED


async def test_a_calls_report_decides_only_its_own_probe(h: Harness) -> None:
    """`probes` 1. A run's first call goes out on its admission while the breaker is closed;
    other runs trip it; after the cool-down the same run's second call to that upstream is
    admitted as the probe while the first is still in flight. The first call failing (it
    was in flight when the breaker opened) must not re-open the breaker nor free the
    probe: only the second call's report decides it."""
    await h.store.upsert_upstreams({"llm": {"limit": 10, "window": 60.0, "burst": None}})
    clock = FixedClock(h.clock.now_ms())
    breakers = MemoryBreakers(clock)
    cfg = BreakerConfig(failure_threshold=1, cooldown_ms=1_000, probes=1)
    gate = UpstreamGate(h.store, MemoryLimiter(clock), breakers, cfg)
    run = await gate.admit_run(["llm"])
    assert isinstance(run, RunUpstreams)
    early = await run.acquire("llm")
    assert not isinstance(early, int) and early.probe_round is None
    assert await gate.record_call("llm", Outcome.FAILURE, probe_round=None) is not None
    clock.advance(cfg.cooldown_ms)
    probe = await run.acquire("llm")
    assert not isinstance(probe, int) and probe.probe_round is not None
    await run.record(early, Outcome.FAILURE)
    state = await breakers.state("llm")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 1)
    assert await run.record(probe, Outcome.SUCCESS) is None
    assert (await breakers.state("llm")).status is BreakerStatus.CLOSED
    await run.settle(Outcome.FAILURE)  # both calls reported: nothing is left to settle
    assert (await breakers.state("llm")).status is BreakerStatus.CLOSED


async def test_a_sent_call_moves_its_own_hit(h: Harness) -> None:
    """Two calls of one run are admitted at different times; the later one is sent first.
    Its own window hit moves to the send time; the earlier call's hit stays where it was."""
    await h.store.upsert_upstreams({"llm": {"limit": 10, "window": 60.0, "burst": None}})
    clock = FixedClock(h.clock.now_ms())
    limiter = MemoryLimiter(clock)
    gate = UpstreamGate(h.store, limiter, MemoryBreakers(clock))
    run = gate.bind(())
    first = await run.acquire("llm")
    clock.advance(1_000)
    second = await run.acquire("llm")
    assert not isinstance(first, int) and not isinstance(second, int)
    clock.advance(1_000)
    assert await run.sending(second)
    hits = limiter._hits["llm"]
    assert first.hit is not None and second.hit is not None
    assert (hits[first.hit], hits[second.hit]) == (clock.now_ms() - 2_000, clock.now_ms())


class _BlipOnce(MemoryLimiter):
    """The in-process limiter, whose next `acquire` fails as a Redis blip would."""

    blip = False

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        if self.blip:
            self.blip = False
            raise GuardUnavailable(f"limiter {name}: connection reset")
        return await super().acquire(name, limit, window_ms, burst)


async def _cooled_down(
    h: Harness, *, window_s: float, probe_timeout_ms: int
) -> tuple[FixedClock, _BlipOnce, MemoryBreakers, UpstreamGate]:
    """A gate over in-process backends on a clock of its own, `llm` limited to 10 calls per
    `window_s`, whose breaker a run's failure opened and whose 30 s cool-down is now over:
    the next admission takes the one half-open probe."""
    await h.store.upsert_upstreams({"llm": {"limit": 10, "window": window_s, "burst": None}})
    clock = FixedClock(h.clock.now_ms())
    limiter, breakers = _BlipOnce(clock), MemoryBreakers(clock)
    config = BreakerConfig(
        failure_threshold=1, cooldown_ms=30_000, probe_timeout_ms=probe_timeout_ms
    )
    gate = UpstreamGate(h.store, limiter, breakers, config)
    opened = await gate.admit_run(["llm"])
    assert isinstance(opened, RunUpstreams)
    await opened.settle(Outcome.FAILURE)
    clock.advance(30_000)
    return clock, limiter, breakers, gate


async def test_an_admission_that_fails_midway_gives_back_its_half_open_probe(h: Harness) -> None:
    """The breaker's cool-down is over and the run takes its one probe, then the limiter
    cannot be reached: the run is deferred with no call sent, and the probe is given back,
    so the next run may try at once instead of after `probe_timeout` (60 s)."""
    clock, limiter, breakers, gate = await _cooled_down(h, window_s=60.0, probe_timeout_ms=60_000)
    limiter.blip = True
    with pytest.raises(GuardUnavailable):
        await gate.admit_run(["llm"])
    state = await breakers.state("llm")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)
    clock.advance(1_000)
    assert isinstance(await gate.admit_run(["llm"]), RunUpstreams)


async def test_a_stale_probe_admission_gives_its_probe_back_when_no_new_slot_can_be_had(
    h: Harness,
) -> None:
    """The run took the one half-open probe and a window hit; its agent worked past the 1 s
    window, so its first call needs a new slot, and the limiter cannot be reached. The call
    is deferred with no call sent, and the probe goes back, so the next run may try at once
    instead of after `probe_timeout`."""
    clock, limiter, breakers, gate = await _cooled_down(h, window_s=1.0, probe_timeout_ms=600_000)
    run = await gate.admit_run(["llm"])
    assert isinstance(run, RunUpstreams)
    assert (await breakers.state("llm")).probes_admitted == 1
    clock.advance(10_000)
    limiter.blip = True
    with pytest.raises(GuardUnavailable):
        await run.acquire("llm")
    await run.settle(Outcome.IGNORE)
    state = await breakers.state("llm")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)


async def test_a_store_that_drops_a_settings_read_keeps_the_last_settings(
    h: Harness, db_url: str
) -> None:
    """Settings are read again before a call's admission; the store fails that read (its
    connection is killed). The call is admitted on the settings read before, instead of the
    error failing the run and counting against its upstreams."""
    if not db_url.startswith("mysql"):
        pytest.skip("kills a MariaDB connection")
    clock = FixedClock(h.clock.now_ms())
    gate = UpstreamGate(h.store, MemoryLimiter(clock), MemoryBreakers(clock), reload_s=0)
    assert isinstance(await gate.admit_run(["llm"]), RunUpstreams)
    clock.advance(65_000)  # the run's window slot (60 s and its guard) has passed
    async with h.store.engine.connect() as conn:
        await conn.execute(text("LOCK TABLES upstreams WRITE"))
        call = asyncio.create_task(gate.admit_call("llm"))
        await outages.kill_waiter(conn, "SELECT upstreams.%", release=False)
        wait_ms, hit, probe_round = await call
        await conn.execute(text("UNLOCK TABLES"))
    assert (wait_ms, hit is not None, probe_round) == (None, True, None)


class _SlowLimiter(RedisLimiter):
    """The real limiter, whose answer takes `seconds` on `clock` (a Redis that is slow)."""

    def __init__(self, redis: streams.Redis, keys: Keys, clock: FixedClock, seconds: float):
        super().__init__(redis, keys)
        self._clock, self._ms = clock, round(seconds * 1000)

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(self._ms)
        return await super().acquire(*args, **kwargs)


LATE = """
tasks:
  - {id: late, agent: echo, upstreams: [llm], deadline: 5s, retry: {max_attempts: 1}}
"""


async def test_the_deadline_counts_the_time_the_admission_took(h: Harness) -> None:
    """The run starts 1 s before its deadline, and its admission answers 2 s later: the
    deadline has passed, so the agent is not called and the attempt times out (FAILED
    `exhausted`), instead of a run that starts after its deadline and succeeds."""
    await h.apply(LATE)
    limiter = _SlowLimiter(h.redis, h.keys, h.clock, 2.0)
    gate = UpstreamGate(h.store, limiter, RedisBreakers(h.redis, h.keys))
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(LATE, "late", h.clock.now_ms())
    h.clock.advance(4_000)
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:
        await until(lambda: _settled(h, row.id))
    finally:
        await ex.close()
    found = await h.store.get_instance(row.id)
    assert found is not None
    assert (found.status, found.fail_class, found.result) == (
        Status.FAILED,
        FailClass.EXHAUSTED,
        None,
    )
    assert found.last_error == "TimeoutError: deadline passed before the run started"


async def _settled(h: Harness, instance_id: str) -> bool:
    return await status(h, instance_id) in (Status.SUCCESS, Status.FAILED)
