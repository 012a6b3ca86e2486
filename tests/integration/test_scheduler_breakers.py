"""The scheduler holds back ticks whose upstream breaker is open, on real Redis and a real
store: breakers opened through `RedisBreakers`, the scheduler's clock passed in.

The cool-down is measured on the Redis server's clock (the scheduler's clock never ends it),
so only the test that watches a release waits, on a short cool-down, for Redis to say it
ended; every other test uses a long cool-down and moves only the scheduler's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from taskstream.cli.explain_cmd import explain_data
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.errors import QueueUnavailable
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.ratelimit.breaker import Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers
from taskstream.runtime.upstream_holds import BreakerHolds
from taskstream.scheduler.hold import UpstreamHolds
from taskstream.scheduler.service import Scheduler, SchedulerConfig, new_instance
from taskstream.scheduler.trail import decision_trail
from tests.integration.harness import Harness, until

HOUR = 3_600_000
H0 = 1_780_002_000_000
"""A whole hour (epoch ms), so `every: 1h` fires at H0 + k hours."""
LONG = BreakerConfig(failure_threshold=1, cooldown_ms=HOUR)
SHORT = BreakerConfig(failure_threshold=1, cooldown_ms=300)

TASKS = """
tasks:
  - {id: ask, agent: echo, upstreams: [llm], schedule: {every: 1h}, window: 10m}
  - {id: both, agent: echo, upstreams: [db, llm], schedule: {every: 1h}, window: 10m}
  - {id: plain, agent: echo, schedule: {every: 1h}, window: 10m}
  - {id: other, agent: echo, upstreams: [db], schedule: {every: 1h}, window: 10m}
"""


def held_by(h: Harness, cfg: BreakerConfig, holds: UpstreamHolds | None = None) -> Scheduler:
    holds = holds or BreakerHolds(RedisBreakers(h.redis, h.keys), cfg)
    return Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), holds=holds)


async def open_breaker(h: Harness, name: str, cfg: BreakerConfig) -> int:
    """Open `name`'s breaker by reporting one failure; returns when it opened (Redis ms)."""
    update = await RedisBreakers(h.redis, h.keys).record(
        name, Outcome.FAILURE, cfg, probe_round=None
    )
    assert update.state.status == "open"
    return update.state.since_ms


async def started(h: Harness, text: str, cfg: BreakerConfig) -> Scheduler:
    """A scheduler that has seen `text`'s tasks just before H0 (so H0 is their first tick)."""
    await h.apply(text)
    s = held_by(h, cfg)
    await s.run_pass()
    h.clock.set(H0)
    return s


async def trail(h: Harness, task_id: str, fire_ms: int = H0) -> list[DecisionRow]:
    return await decision_trail(h.store, task_id, fire_ms)


async def instances(h: Harness, task_id: str) -> list[tuple[int, Status]]:
    rows = await h.store.list_instances(task_id=task_id)
    return sorted((r.scheduled_for_ms, r.status) for r in rows)


@pytest.fixture
def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return Harness(store, redis, keys, FixedClock(H0 - 1))


async def test_an_open_breaker_holds_the_tick_back_and_says_so(h: Harness) -> None:
    s = await started(h, TASKS, LONG)
    await open_breaker(h, "llm", LONG)
    next_due = await s.run_pass()
    assert await instances(h, "ask") == []
    assert await instances(h, "both") == []
    [held] = await trail(h, "ask")
    assert (held.decision, held.reason) == ("deferred", "upstream breaker open: llm")
    assert held.instance_id is None
    until_ms = held.details["held_by"]["llm"]
    assert H0 + HOUR - 60_000 < until_ms <= H0 + HOUR  # the cool-down left, on Redis's clock
    [both] = await trail(h, "both")
    assert list(both.details["held_by"]) == ["llm"]  # only the open breaker holds it
    # The scheduler wakes when the cool-down ends (each task read it a moment apart).
    assert next_due == min(until_ms, both.details["held_by"]["llm"])
    # Tasks without upstreams, or whose breakers are closed, fire as before.
    assert await instances(h, "plain") == [(H0, Status.DISPATCHED)]
    assert await instances(h, "other") == [(H0, Status.DISPATCHED)]
    spec = next(t for t in await h.definitions() if t.id == "ask")
    explained = explain_data(spec, None, H0, await trail(h, "ask"), now_ms=h.clock.now_ms())
    [row] = explained["decisions"]
    assert row["rule"] == "upstream breaker (open)"
    assert row["saw"] == {"held_by": {"llm": until_ms}}
    assert explained["outcome"] == "not decided yet: deferred (upstream breaker open: llm)"


async def test_the_scheduler_clock_does_not_end_the_cool_down(h: Harness) -> None:
    s = await started(h, TASKS, LONG)
    await open_breaker(h, "llm", LONG)
    await s.run_pass()
    for _ in range(3):  # passes while held record nothing new
        h.clock.advance(2 * 60_000)
        await s.run_pass()
    assert await instances(h, "ask") == []
    assert [d.decision for d in await trail(h, "ask")] == ["deferred"]


async def test_the_held_tick_fires_once_when_the_cool_down_ends(h: Harness) -> None:
    s = await started(h, TASKS, SHORT)
    since_ms = await open_breaker(h, "llm", SHORT)
    await s.run_pass()
    assert await instances(h, "ask") == []
    breakers = RedisBreakers(h.redis, h.keys)

    async def cooled_down() -> bool:  # on the Redis server's clock, which the breaker uses
        return (await breakers.states(["llm"])).at_ms >= since_ms + SHORT.cooldown_ms

    await until(cooled_down, timeout_s=10)
    h.clock.advance(1_000)
    await s.run_pass()
    h.clock.advance(1_000)
    await s.run_pass()
    assert await instances(h, "ask") == [(H0, Status.DISPATCHED)]
    [row] = await h.store.list_instances(task_id="ask")
    spec = next(t for t in await h.definitions() if t.id == "ask")
    assert row.dedupe_key == new_instance(spec, H0).dedupe_key  # the same tick, the same key
    held, ran = await trail(h, "ask")
    assert (held.decision, ran.decision) == ("deferred", "should_run")
    assert ran.instance_id == row.id
    assert ran.reason == "every rule passed (after being held back by the open breaker of llm)"
    assert ran.details["held_back_by"] == held.details["held_by"]
    # Reading states changed nothing: the executors' first admission is the probe.
    assert (await breakers.state("llm")).status == "open"
    assert (await breakers.admit("llm", SHORT)).probe


LATE = """
tasks:
  - {{id: ask, agent: echo, upstreams: [llm], schedule: {{every: 1h}}, window: 1s,
     catchup: {catchup}}}
"""


async def test_a_tick_held_past_its_window_runs_by_the_catch_up_policy(h: Harness) -> None:
    s = await started(h, LATE.format(catchup="{mode: all, max_delay: 10m}"), SHORT)
    since_ms = await open_breaker(h, "llm", SHORT)
    await s.run_pass()
    breakers = RedisBreakers(h.redis, h.keys)

    async def cooled_down() -> bool:
        return (await breakers.states(["llm"])).at_ms >= since_ms + SHORT.cooldown_ms

    await until(cooled_down, timeout_s=10)
    h.clock.advance(5 * 60_000)  # the 1 s window closed long ago; max_delay has not passed
    await s.run_pass()
    held, ran = await trail(h, "ask")
    assert (held.decision, ran.decision) == ("deferred", "should_run")
    assert ran.details["catchup"] is True
    assert "held back by the open breaker of llm" in ran.reason
    assert await instances(h, "ask") == [(H0, Status.DISPATCHED)]


async def test_a_tick_held_past_its_window_without_catch_up_is_missed(h: Harness) -> None:
    s = await started(h, LATE.format(catchup="{enabled: false}"), LONG)
    await open_breaker(h, "llm", LONG)
    await s.run_pass()
    h.clock.advance(5_000)
    await s.run_pass()
    held, missed = await trail(h, "ask")
    assert (held.decision, missed.decision) == ("deferred", "missed")
    assert missed.reason == (
        "catch-up is disabled (after being held back by the open breaker of llm)"
    )
    [row] = await h.store.list_instances(task_id="ask")
    assert row.status is Status.SKIPPED and row.dedupe_key.startswith("missed:")
    h.clock.advance(5_000)
    await s.run_pass()
    assert len(await trail(h, "ask")) == 2  # final: never decided again


EVERY_MINUTE = """
tasks:
  - {id: ask, agent: echo, upstreams: [llm], schedule: {every: 1m}, window: 30s}
"""


async def test_mode_latest_coalesces_an_older_held_tick_into_the_newer_one(h: Harness) -> None:
    s = await started(h, EVERY_MINUTE, LONG)
    await open_breaker(h, "llm", LONG)
    await s.run_pass()
    h.clock.advance(60_000)  # the H0 tick's window closed; the next tick is on time
    await s.run_pass()
    held, coalesced = await trail(h, "ask")
    assert (held.decision, coalesced.decision) == ("deferred", "coalesced")
    assert "held back by the open breaker of llm" in coalesced.reason
    assert [d.decision for d in await trail(h, "ask", H0 + 60_000)] == ["deferred"]
    assert await instances(h, "ask") == []


async def test_without_breakers_the_scheduler_fires_as_before(h: Harness) -> None:
    await h.apply(TASKS)
    s = h.scheduler()
    await s.run_pass()
    await open_breaker(h, "llm", LONG)
    h.clock.set(H0)
    await s.run_pass()
    assert await instances(h, "ask") == [(H0, Status.DISPATCHED)]


class Unreachable:
    async def held(self, upstreams: Sequence[str]) -> Mapping[str, int]:
        raise QueueUnavailable("redis is down")


async def test_unreadable_breakers_hold_nothing_back(h: Harness) -> None:
    await h.apply(TASKS)
    s = held_by(h, LONG, Unreachable())
    await s.run_pass()
    h.clock.set(H0)
    await s.run_pass()
    assert await instances(h, "ask") == [(H0, Status.DISPATCHED)]
