"""The heartbeat of one executor process: each run's lease is extended by its own length, runs
are tracked by claim (instance id, token) and remembered for a while once ended, the loops
outlive an unexpected error, and the liveness key does not wait for the store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.exceptions import ReadOnlyError

from taskstream.core import streams
from taskstream.core.reasons import LEASE_EXPIRED
from taskstream.core.states import Status
from taskstream.executor import heartbeat as heartbeat_module
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.heartbeat import Heartbeat
from taskstream.executor.intake import Run
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.executor.runner import RunEnv, execute
from taskstream.ratelimit.memory import MemoryBreakers, MemoryLimiter
from tests.integration.harness import Harness, until
from tests.integration.outages import forever, intake, lease_end

LEASES = """
tasks:
  - id: short
    agent: slow
    lease: 10s
    payload: {seconds: 0}
  - id: long
    agent: slow
    lease: 600s
    payload: {seconds: 0}
  - id: again
    agent: slow
    lease: 60s
    retry: {max_attempts: 3}
    payload: {seconds: 0}
"""


@pytest.fixture
def tasks() -> Iterator[list[asyncio.Task[None]]]:
    """Stand-ins for runs whose agents are still running; cancelled after the test."""
    made: list[asyncio.Task[None]] = []
    yield made
    for task in made:
        task.cancel()


def _running(made: list[asyncio.Task[None]]) -> asyncio.Task[None]:
    made.append(asyncio.create_task(forever()))
    return made[-1]


async def _claim(h: Harness, task_id: str) -> Run:
    await h.trigger(LEASES, task_id, fire_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    return run


async def test_each_lease_is_extended_by_its_own_runs_lease_length(
    outage: Harness, tasks: list[asyncio.Task[None]]
) -> None:
    """A 10 s lease beside a 600 s one: the long lease is not cut to the short one's length
    (it would lapse between extensions once the short run ended), nor the short one stretched
    (a lost short run would wait ten minutes for the sweeper)."""
    h = outage
    await h.apply(LEASES)
    short, long = await _claim(h, "short"), await _claim(h, "long")
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    heartbeat.track(short, _running(tasks))
    heartbeat.track(long, _running(tasks))
    before = await h.store.db_now_ms()
    await heartbeat.extend()
    after = await h.store.db_now_ms()
    assert before + 10_000 <= await lease_end(h, short.row.id) <= after + 10_000
    assert before + 600_000 <= await lease_end(h, long.row.id) <= after + 600_000
    assert not (short.fenced or long.fenced)


async def test_a_newer_claim_of_an_instance_is_tracked_apart_from_its_fenced_run(
    outage: Harness, tasks: list[asyncio.Task[None]]
) -> None:
    """Run 1 of an instance was timed out and its retry was claimed by this same process while
    run 1 still runs: run 1 is fenced and cancelled, run 2 keeps its lease, and run 1 ending
    does not stop run 2 from being tracked."""
    h = outage
    await h.apply(LEASES)
    first = await _claim(h, "again")
    instance_id = first.row.id
    moved = await h.store.transition(
        instance_id, Status.RUNNING, Status.TIMEOUT, reason="lease_expired", attempt=1
    )
    assert moved.ok
    moved = await h.store.transition(
        instance_id,
        Status.TIMEOUT,
        Status.RETRYING,
        reason="after_lease_expired",
        attempt=1,
        next_attempt_at_ms=h.clock.now_ms(),
    )
    assert moved.ok
    retry = await h.store.get_instance(instance_id)
    assert retry is not None
    await h.outbox.publish(retry, now_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [second] = await (await intake(h, "c1")).admit([delivery])
    assert (second.row.id, second.token) == (instance_id, 2)

    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    old, new = _running(tasks), _running(tasks)
    heartbeat.track(first, old)
    heartbeat.track(second, new)
    await heartbeat.extend()
    assert (first.fenced, second.fenced) == (True, False)
    with pytest.raises(asyncio.CancelledError):
        await old
    assert not new.done()
    heartbeat.untrack(first)
    assert (heartbeat.holds(instance_id, 1), heartbeat.holds(instance_id, 2)) == (False, True)


async def test_ended_claims_are_remembered_up_to_a_bound(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended run's claim still counts as this process's own (`ran`: intake must not adopt
    it), the newest `ENDED_KEPT` of them; a run being tracked is held whatever the bound."""
    monkeypatch.setattr(heartbeat_module, "ENDED_KEPT", 2)
    h = outage
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    runs = []
    for _ in range(4):
        h.clock.advance(1000)  # another fire time: another instance
        runs.append(await _claim(h, "long"))
    for run in runs:
        heartbeat.track(run, _running(tasks))
    for run in runs[:3]:
        heartbeat.untrack(run)
        heartbeat.untrack(run)  # a second untrack of one run changes nothing
    claims = [(run.row.id, run.token) for run in runs]
    assert [heartbeat.ran(*c) for c in claims] == [False, True, True, True]
    assert [heartbeat.holds(*c) for c in claims] == [False, False, False, True]


async def test_the_beat_loop_outlives_an_unexpected_error(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply the loop has no rule for (READONLY from a replica after a failover) is logged
    and the next beat runs: a dead heartbeat would let every lease lapse while the process
    kept claiming."""
    h = outage
    calls: list[int] = []
    beat_again = asyncio.Event()
    mark_alive = streams.mark_alive

    async def flaky(redis: streams.Redis, keys: object, consumer: str, ttl_ms: int) -> None:
        calls.append(ttl_ms)
        if len(calls) == 1:
            raise ReadOnlyError("You can't write against a read only replica.")
        await mark_alive(redis, h.keys, consumer, ttl_ms)
        beat_again.set()

    monkeypatch.setattr(streams, "mark_alive", flaky)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=0.6)
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await asyncio.wait_for(beat_again.wait(), timeout=20)
        assert not loop.done()
        assert await h.redis.exists(h.keys.alive("c1")) == 1
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=20)


async def test_beats_come_often_enough_for_the_shortest_lease_held(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a long liveness TTL (60 s: a lease beat every 20 s) a run with a 10 s lease would
    lapse between beats, and the sweeper would time out a healthy run. Tracking it wakes the
    sleeping lease loop, and beats then come every third of that lease."""
    h = outage
    await h.apply(LEASES)
    beats: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=60)
    beat = heartbeat.beat

    async def counted() -> None:
        await beat()
        next((b for b in beats if not b.is_set()), asyncio.Event()).set()

    monkeypatch.setattr(heartbeat, "beat", counted)
    assert heartbeat.interval_s == 20
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await asyncio.wait_for(beats[0].wait(), timeout=20)  # then it sleeps 20 s
        short = await _claim(h, "short")
        heartbeat.track(short, _running(tasks))
        assert heartbeat.interval_s == pytest.approx(10 / 3)
        await asyncio.wait_for(beats[1].wait(), timeout=5)  # bounds a broken run only
        heartbeat.untrack(short)
        assert heartbeat.interval_s == 20
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=20)


@dataclass
class _SlowStore:
    """Holds the store's lease extensions until `answer` is set, counting the liveness
    refreshes made meanwhile."""

    h: Harness
    extending: asyncio.Event = field(default_factory=asyncio.Event)
    answer: asyncio.Event = field(default_factory=asyncio.Event)
    refreshed: list[asyncio.Event] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch, refreshes: int) -> None:
        self.refreshed = [asyncio.Event() for _ in range(refreshes)]
        extend_leases, mark_alive = self.h.store.extend_leases, streams.mark_alive

        async def slow(held: list[tuple[str, int]], *, lease_s: float) -> set[tuple[str, int]]:
            self.extending.set()
            await self.answer.wait()
            return await extend_leases(held, lease_s=lease_s)

        async def counted(redis: streams.Redis, keys: object, consumer: str, ttl_ms: int) -> None:
            await mark_alive(redis, self.h.keys, consumer, ttl_ms)
            if self.extending.is_set():
                next((r for r in self.refreshed if not r.is_set()), asyncio.Event()).set()

        monkeypatch.setattr(self.h.store, "extend_leases", slow)
        monkeypatch.setattr(streams, "mark_alive", counted)

    async def refreshes_while_extending(self) -> None:
        await asyncio.wait_for(self.extending.wait(), timeout=20)
        await asyncio.wait_for(self.refreshed[-1].wait(), timeout=5)  # bounds a broken run only


async def test_a_slow_lease_extension_does_not_let_the_liveness_key_expire(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store answers the lease extension slowly (a lock wait, SQLite's busy timeout, an
    exhausted pool) but does answer. The liveness key is still refreshed every third of its
    TTL, a whole TTL long, so the sweeper leaves the run to its live owner instead of timing
    it out (owner_lost) and running it again; the extension then lands."""
    h = outage
    await h.apply(LEASES)
    run = await _claim(h, "long")
    slow = _SlowStore(h)
    slow.install(monkeypatch, refreshes=3)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=0.6)
    heartbeat.track(run, _running(tasks))
    claimed = await lease_end(h, run.row.id)
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await slow.refreshes_while_extending()
        assert (await h.sweeper().sweep_once()).get("timeout") is None
        row = await h.store.get_instance(run.row.id)
        assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)
        slow.answer.set()

        async def extended() -> bool:
            return await lease_end(h, run.row.id) > claimed

        await until(extended)
        assert not run.fenced
    finally:
        slow.answer.set()
        stop.set()
        await asyncio.wait_for(loop, timeout=20)


async def test_a_process_whose_store_does_not_answer_loses_its_leases_though_alive(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease extension never returns while Redis and the event loop are fine: the liveness
    key is kept, but the lease is not, and the entry is left idle. Once the lease has expired
    the sweeper times the run out (lease_expired), and the process fences the run when its
    extension at last finds the lease gone."""
    h = outage
    await h.apply(LEASES)
    run = await _claim(h, "short")
    slow = _SlowStore(h)
    slow.install(monkeypatch, refreshes=1)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=0.6)
    heartbeat.track(run, _running(tasks))
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await slow.refreshes_while_extending()
        h.clock.set(await lease_end(h, run.row.id))
        # min_idle_ms=0: the entry is idle, as nothing touches it while the extension waits.
        assert (await h.sweeper(min_idle_ms=0).sweep_once()).get("timeout") == 1
        assert LEASE_EXPIRED in [x.reason for x in await h.store.history(run.row.id)]
        slow.answer.set()

        async def fenced() -> bool:
            return run.fenced

        await until(fenced)
    finally:
        slow.answer.set()
        stop.set()
        await asyncio.wait_for(loop, timeout=20)


async def test_a_run_long_past_its_time_limit_is_let_go(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that ignores its cancellation keeps its run going past the time limit. Once
    `OVERRUN_S` past it, the heartbeat hands the run to `on_overrun` (once), cancels it
    again, and stops extending its lease and touching its entry; the run still within the
    margin keeps both."""
    h = outage
    await h.apply(LEASES)
    late, within = await _claim(h, "long"), await _claim(h, "short")
    handed: list[Run] = []
    heartbeat = Heartbeat(
        h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6, on_overrun=handed.append
    )
    release = asyncio.Event()

    async def ignores_cancellation() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    stuck = asyncio.create_task(ignores_cancellation())
    tasks.append(stuck)
    await asyncio.sleep(0)  # it is under way, as an agent past its limit is
    heartbeat.track(late, stuck)
    heartbeat.track(within, _running(tasks))
    margin_ms = round(heartbeat_module.OVERRUN_S * 1000)
    late.ends_by_ms = h.clock.now_ms() - margin_ms - 1
    within.ends_by_ms = h.clock.now_ms() - margin_ms + 1
    extended: list[tuple[str, int]] = []
    touched: list[streams.Delivery] = []
    extend_leases, touch = h.store.extend_leases, streams.touch

    async def extend_seen(claims: list[tuple[str, int]], *, lease_s: float) -> set[Any]:
        extended.extend(claims)
        return await extend_leases(claims, lease_s=lease_s)

    async def touch_seen(redis: Any, consumer: str, deliveries: list[Any]) -> list[Any]:
        touched.extend(deliveries)
        return await touch(redis, consumer, deliveries)

    monkeypatch.setattr(h.store, "extend_leases", extend_seen)
    monkeypatch.setattr(streams, "touch", touch_seen)
    await heartbeat.extend()
    await heartbeat.extend()

    assert extended == [(within.row.id, within.token)] * 2
    assert touched == [within.delivery] * 2
    assert handed == [late]
    assert (late.overran, within.overran, late.fenced) == (True, False, False)
    assert stuck.cancelling() == 1
    release.set()


async def test_a_run_knows_when_its_time_limit_ends(outage: Harness) -> None:
    h = outage
    await h.apply(LEASES.replace("lease: 10s", "lease: 10s\n    timeout: 2s"))
    run = await _claim(h, "short")
    await execute(run, RunEnv(h.store, h.clock, max_payload_bytes=1 << 20))
    assert run.ends_by_ms == h.clock.now_ms() + 2_000


EFFECTS = """
tasks:
  - id: effect
    agent: effect
    lease: 10s
    payload: {seconds: 0}
"""


@pytest.mark.parametrize("ended", ["fenced", "overran"])
async def test_a_run_whose_attempt_has_ended_may_start_no_side_effect(
    outage: Harness, ended: str
) -> None:
    """The run was fenced, or its end was committed as a timeout while its agent went on:
    `ctx.once` refuses (`ClaimLost`), so no effect starts that no commit would record."""
    h = outage
    await h.apply(EFFECTS)
    await h.trigger(EFFECTS, "effect", fire_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    setattr(run, ended, True)
    end = await execute(run, RunEnv(h.store, h.clock, max_payload_bytes=1 << 20))
    assert end.error is not None and end.error.startswith("ClaimLost: ")
    assert ended in end.error or "time limit" in end.error
    assert run.side_effects == []


GATED = """
upstreams:
  llm: {limit: 100, window: 60s}
tasks:
  - id: paced
    agent: slow
    upstreams: [llm]
    lease: 60s
    timeout: 5s
    payload: {seconds: 30}
"""


async def test_time_spent_in_upstream_admission_is_not_overrun(outage: Harness) -> None:
    """The run's admission took 20 s (the store or Redis slow); its agent then started within
    its 5 s limit. Its time limit counts from when the agent starts, so the heartbeat does not
    take it for one that ignored its cancellation."""
    h = outage
    await h.apply(GATED)
    await h.store.upsert_upstreams({"llm": {"limit": 100, "window": 60.0, "burst": None}})
    await h.trigger(GATED, "paced", fire_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])

    class SlowGate(UpstreamGate):
        async def admit_run(self, upstreams: Sequence[str]) -> int | RunUpstreams:
            h.clock.advance(20_000)
            return await super().admit_run(upstreams)

    gate = SlowGate(h.store, MemoryLimiter(h.clock), MemoryBreakers(h.clock))
    handed: list[Run] = []
    heartbeat = Heartbeat(
        h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6, on_overrun=handed.append
    )
    env = RunEnv(h.store, h.clock, max_payload_bytes=1 << 20, gate=gate)

    async def running() -> None:
        await execute(run, env)

    task = asyncio.create_task(running())
    try:
        heartbeat.track(run, task)
        await until(lambda: _started(run))
        await heartbeat.extend()
        assert (handed, run.overran, task.done()) == ([], False, False)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _started(run: Run) -> bool:
    return run.ends_by_ms is not None


async def test_a_lapsing_lease_tracked_during_an_extension_is_extended_after_it(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose lease is nearly spent (an adopted claim, an admission the store held up) is
    tracked while an extension of the other leases is under way. It is to be extended at the
    next beat, right after that extension: its wake-up and its "extend now" used to be
    cleared by that extension's end, and the loop then slept until a third of the shortest
    lease had passed again, by when the sweeper times the healthy run out."""
    h = outage
    await h.apply(LEASES)
    long, lapsing = await _claim(h, "long"), await _claim(h, "short")
    claimed = await lease_end(h, lapsing.row.id)
    # The clock stands 1 s before the short lease ends (of its 10 s) from the first beat on:
    # no beat finds a third of a lease passed since that one.
    h.clock.set(claimed - 1_000)
    slow = _SlowStore(h)
    slow.install(monkeypatch, refreshes=0)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=60)
    heartbeat.track(long, _running(tasks))
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await asyncio.wait_for(slow.extending.wait(), timeout=20)
        heartbeat.track(lapsing, _running(tasks))
        slow.answer.set()

        async def extended() -> bool:
            return await lease_end(h, lapsing.row.id) > claimed

        await until(extended, timeout_s=10)  # bounds a broken run only
    finally:
        slow.answer.set()
        stop.set()
        await asyncio.wait_for(loop, timeout=20)
