"""The scheduler on real Redis and a real store, clock passed in: leadership, dedupe under two
schedulers, dependencies, overlap, catch-up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.outbox import Emitted
from taskstream.core.protocol import Keys
from taskstream.core.spec import TaskSpec
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import advance, manual
from taskstream.scheduler.facts import ACTIVE_READ
from taskstream.scheduler.instances import new_instance
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import T0, Harness, Running, until
from tests.support.databases import temp_database

M0 = 1_780_000_020_000
"""A whole minute (epoch ms), so `every: 1m` fires at M0 + k minutes."""
EVERY_SECOND = "\n".join(
    f"  - {{id: t{i}, agent: echo, schedule: {{every: 1s}}, window: 1h}}" for i in range(20)
)


def make(h: Harness, owner: str | None = None, lease_ms: int = 10_000) -> Scheduler:
    lease = LeaderLease(h.redis, h.keys, owner, lease_ms=lease_ms) if owner else None
    return Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), leader=lease)


@pytest.fixture
async def maria(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    async with temp_database("mariadb") as url:
        store = await SqlStore.connect(url)
        try:
            yield Harness(store, redis, keys, FixedClock(T0 + 1))
        finally:
            await store.close()


async def test_two_schedulers_on_1000_fires_make_no_duplicate(maria: Harness) -> None:
    h = maria
    await h.apply("tasks:\n" + EVERY_SECOND)
    a, b = make(h), make(h)  # no lease: both decide every tick
    await asyncio.gather(a.run_pass(), b.run_pass())
    for _ in range(50):
        h.clock.advance(1000)
        await asyncio.gather(a.run_pass(), b.run_pass())
    rows = await h.store.list_instances(limit=5000)
    assert len(rows) == 1000
    assert len({(r.task_id, r.scheduled_for_ms) for r in rows}) == 1000
    total = sum([await h.redis.xlen(s) for s in h.keys.streams()])
    assert total == 1000


async def test_the_standby_fires_the_next_tick_when_the_leader_dies(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(T0 + 1))
    await h.apply("tasks:\n  - {id: tick, agent: echo, schedule: {every: 1s}, window: 1m}")
    leader, standby = make(h, "leader"), make(h, "standby")
    assert await leader._step() >= 0
    await standby._step()
    h.clock.advance(1000)
    await leader._step()
    await standby._step()
    assert len(await store.list_instances()) == 1
    await redis.delete(keys.leader)  # the leader died: its lease expired
    h.clock.advance(1000)
    await standby._step()
    rows = await store.list_instances()
    assert [r.scheduled_for_ms for r in rows] == [T0 + 1000, T0 + 2000]
    # The old leader comes back: its cursor writes carry an old token and are rejected.
    h.clock.advance(1000)
    await leader._step()
    assert len(await store.list_instances()) == 2
    await standby._step()
    assert len(await store.list_instances()) == 3


DAY0 = 1_780_012_800_000
"""2026-05-29T00:00:00Z."""
EVERY_SECOND_DEPS = """
tasks:
  - {id: w, agent: echo, schedule: {every: 1s}, window: 1h, depends_on: [raw.ready]}
"""

DEPS = """
tasks:
  - id: report
    agent: echo
    schedule: {every: 1m}
    window: 10m
    depends_on: [raw.ready]
"""


async def test_a_tick_waits_for_its_marker_then_runs(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    await s.run_pass()
    assert await store.list_instances() == []
    decisions = [d.decision for d in await store.decisions("report")]
    assert decisions == ["wait_dep"]
    await store.mark_ready("raw.ready", "2026-05-28")
    h.clock.advance(5_000)
    await s.run_pass()
    [row] = await store.list_instances()
    assert row.scheduled_for_ms == M0 + 60_000
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep", "should_run"]


async def test_a_marker_that_never_comes_skips_the_tick_at_window_close(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    h.clock.advance(10 * 60_000 + 1)
    await s.run_pass()
    first = [d for d in await store.decisions("report") if d.fire_time_ms == M0 + 60_000]
    assert [d.decision for d in first] == ["wait_dep", "skip_dep"]
    assert "raw.ready" in str(first[-1].details)


OVERLAP = """
tasks:
  - {{id: job, agent: echo, schedule: {{every: 1m}}, window: 10m, concurrency: {policy}}}
"""


@pytest.mark.parametrize("policy", ["forbid", "replace"])
async def test_overlap_policies(
    store: SqlStore, redis: streams.Redis, keys: Keys, policy: str
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(OVERLAP.format(policy=policy))
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()  # first run: DISPATCHED, nobody executes it
    h.clock.advance(60_000)
    await s.run_pass()
    rows = {r.scheduled_for_ms: r for r in await store.list_instances()}
    last = [d.decision for d in await store.decisions("job")][-1]
    if policy == "forbid":
        assert last == "skip_overlap"
        assert list(rows) == [M0 + 60_000]
    else:
        assert last == "should_run"
        first = rows[M0 + 60_000]
        assert (first.status, first.fail_class) == (Status.FAILED, FailClass.REPLACED)
        assert rows[M0 + 120_000].status is Status.DISPATCHED


async def waiting_replace_tick(h: Harness) -> tuple[Scheduler, TaskSpec]:
    """A `concurrency: replace` task whose tick at M0 + 1 min waits for its marker."""
    await h.apply(DEPS + "    concurrency: replace\n")
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    [spec] = await h.definitions()
    return s, spec


async def run_by_hand_then_mark(h: Harness, s: Scheduler, spec: TaskSpec) -> Emitted:
    """An operator triggers the task by hand, then the marker comes and a pass decides."""
    h.clock.advance(5_000)
    manual_run = await manual.trigger(h.outbox, spec, now_ms=h.clock.now_ms())
    await h.store.mark_ready("raw.ready", "2026-05-28")
    h.clock.advance(5_000)
    await s.run_pass()
    return manual_run


async def test_replace_does_not_cancel_a_later_manual_run(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A tick waits for its marker; meanwhile an operator triggers the task by hand. When the
    marker comes, the older tick gives way to the newer manual run instead of cancelling it."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    s, spec = await waiting_replace_tick(h)
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep"]
    manual_run = await run_by_hand_then_mark(h, s, spec)
    tick = [d for d in await store.decisions("report") if d.fire_time_ms == M0 + 60_000]
    assert [d.decision for d in tick] == ["wait_dep", "skip_overlap"]
    last = tick[-1]
    assert last.details["overlap"]["active_id"] == manual_run.instance_id
    [row] = await store.list_instances()
    assert (row.id, row.status) == (manual_run.instance_id, Status.DISPATCHED)


async def test_replace_sees_a_later_run_behind_many_earlier_ones(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """As above, with more earlier runs still active (an operator's backfill of older fire
    times) than the scheduler reads at once: the later manual run is still found, and the
    tick gives way to it instead of cancelling the oldest earlier run."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    s, spec = await waiting_replace_tick(h)
    for n in range(1, ACTIVE_READ + 1):
        await manual.trigger(h.outbox, spec, now_ms=h.clock.now_ms(), at_ms=M0 - n * 60_000)
    manual_run = await run_by_hand_then_mark(h, s, spec)
    [last] = [d for d in await store.decisions("report") if d.fire_time_ms == M0 + 60_000][-1:]
    assert (last.decision, last.details["overlap"]["active_id"]) == (
        "skip_overlap",
        manual_run.instance_id,
    )
    statuses = {r.status for r in await store.list_instances()}
    assert statuses == {Status.DISPATCHED}


async def test_replace_follows_a_previous_instance_claimed_during_the_cancel(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous instance is read DISPATCHED and claimed (RUNNING) before the cancel's CAS:
    that CAS is lost, and the cancel is tried again from RUNNING, so the previous run still
    gives way (FAILED `replaced`, its lease gone) instead of running beside the new one."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(OVERLAP.format(policy="replace"))
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    [first] = await store.list_instances()
    real = store.transition
    claimed: list[int] = []

    async def claim_first(instance_id: str, src: Status, dst: Status, **kw: Any) -> CasResult:
        if not claimed and str(kw.get("reason", "")).startswith("replaced by"):
            won = await store.claim_many([ClaimRequest(first.id, first.attempt, 60)], owner="c1")
            claimed.append(won[first.id].token)
        return await real(instance_id, src, dst, **kw)

    monkeypatch.setattr(store, "transition", claim_first)
    h.clock.advance(60_000)
    with capture_logs() as logs:
        await s.run_pass()
    assert claimed == [first.attempt + 1]
    moves = [
        (e["event"], e["from_status"], e.get("now_status"))
        for e in logs
        if e.get("instance_id") == first.id and str(e["event"]).startswith("instance.replace")
    ]
    assert moves == [
        ("instance.replace_lost", Status.DISPATCHED, Status.RUNNING),
        ("instance.replaced", Status.RUNNING, None),
    ]
    done = await store.get_instance(first.id)
    assert done is not None and (done.status, done.fail_class) == (
        Status.FAILED,
        FailClass.REPLACED,
    )
    assert done.lease_owner is None
    assert [x.from_status for x in await store.history(first.id)][-1] is Status.RUNNING


async def test_downtime_catch_up_latest_runs_only_the_newest(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply("""
tasks:
  - {id: latest, agent: echo, schedule: {every: 1m}, window: 30s,
     catchup: {max_delay: 10m, mode: latest}}
  - {id: all, agent: echo, schedule: {every: 1m}, window: 30s,
     catchup: {max_delay: 10m, mode: all}}
""")
    s = make(h)
    await s.run_pass()
    h.clock.advance(15 * 60_000)  # down for 15 minutes
    await s.run_pass()
    latest = [d.decision for d in await store.decisions("latest", limit=100)]
    every = [d.decision for d in await store.decisions("all", limit=100)]
    assert latest.count("missed") == 5 and every.count("missed") == 5
    # 5 missed (older than max_delay), 9 caught up per mode, the 15th tick is on time.
    assert latest.count("should_run") == 1 and latest.count("coalesced") == 9
    assert every.count("should_run") == 10
    runs = await store.list_instances(task_id="latest", status=Status.DISPATCHED)
    assert [r.scheduled_for_ms for r in runs] == [M0 + 15 * 60_000]
    h.clock.advance(45_000)  # the 15th tick's window closes; nothing new was missed
    await s.run_pass()
    assert len(await store.list_instances(task_id="latest", status=Status.DISPATCHED)) == 1
    skipped = await store.list_instances(task_id="latest", status=Status.SKIPPED)
    assert len(skipped) == 5
    spec = next(t for t in (await h.definitions()) if t.id == "latest")
    done = await manual.backfill(
        h.outbox, spec, from_ms=M0 + 60_000, to_ms=M0 + 5 * 60_000, now_ms=h.clock.now_ms()
    )
    assert done.published == 5  # a missed tick can still be run on purpose


async def test_an_agent_marking_ready_releases_a_waiting_tick(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS + "  - {id: collect, agent: producer}\n")
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep"]
    producer = await h.trigger(DEPS + "  - {id: collect, agent: producer}\n", "collect", M0)
    ex = Running(h.executor())
    try:

        async def produced() -> bool:
            row = await store.get_instance(producer.id)
            return row is not None and row.status is Status.SUCCESS

        await until(produced)
    finally:
        await ex.close()
    await s.run_pass()
    assert [d.decision for d in await store.decisions("report")] == ["wait_dep", "should_run"]


READY_CATCHUP = """
tasks:
  - id: ready
    agent: echo
    schedule: {every: 1m}
    window: 30s
    depends_on: [raw.ready]
    catchup: {max_delay: 1h, mode: latest, only_if_ready: true}
"""


@pytest.mark.parametrize("marked", [True, False])
async def test_catch_up_only_if_ready_with_a_marker_set_late(
    store: SqlStore, redis: streams.Redis, keys: Keys, marked: bool
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(READY_CATCHUP)
    s = make(h)
    await s.run_pass()
    h.clock.advance(10 * 60_000 - 1)  # down for ten minutes; the last tick's window closed
    h.clock.advance(45_000)
    if marked:  # the data arrived late, while no scheduler ran
        await store.mark_ready("raw.ready", "2026-05-28")
    await s.run_pass()
    last = [d for d in await store.decisions("ready", limit=100)][-1]
    runs = await store.list_instances(task_id="ready", status=Status.DISPATCHED)
    if marked:
        assert last.decision == "should_run"
        assert [r.scheduled_for_ms for r in runs] == [M0 + 10 * 60_000]
    else:
        assert last.decision == "skip_dep"
        assert runs == []


async def test_a_hint_wakes_a_sleeping_scheduler(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """With nothing due for 30 s, a run set to retry now is re-emitted at once after the
    executor's hint on the control channel, not at the end of the sleep."""
    from taskstream.core import notify
    from taskstream.core.clock import SystemClock

    h = Harness(store, redis, keys)
    await h.apply("tasks:\n  - {id: once, agent: echo}\n")
    row = await h.trigger("tasks:\n  - {id: once, agent: echo}\n", "once")
    await store.claim_many([ClaimRequest(row.id, 0, 60)], owner="x")
    scheduler = Scheduler(
        store,
        h.outbox,
        SystemClock(),
        SchedulerConfig(max_sleep_s=30),
        wakeups=notify.Wakeups(redis, keys),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        await asyncio.sleep(0.5)  # let it finish its first pass and go to sleep
        now = await store.db_now_ms()
        done = await store.finish_many(
            [FinishRequest(row.id, 1, Status.RETRYING, "t", next_attempt_at_ms=now)]
        )
        assert done[row.id].ok
        await notify.hint(redis, keys, "retry")

        async def re_emitted() -> bool:
            current = await store.get_instance(row.id)
            return current is not None and current.status is Status.DISPATCHED

        await until(re_emitted, timeout_s=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


TWO = """
tasks:
  - {id: broken, agent: echo, schedule: {every: 1m}}
  - {id: fine, agent: echo, schedule: {every: 1m}}
"""


async def test_a_task_whose_advance_fails_does_not_stop_the_others(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task's advance raises an error nobody expects (a defect, or a stored definition
    an older version accepted): it is logged and tried again next pass; `fine` runs, and
    the pass returns instead of ending the scheduler."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(TWO)
    s = make(h)
    advance = s._advancer.advance

    async def faulty(spec: Any, *args: Any, **kwargs: Any) -> int:
        if spec.id == "broken":
            raise ValueError("cannot make an instance")
        return await advance(spec, *args, **kwargs)

    monkeypatch.setattr(s._advancer, "advance", faulty)
    await s.run_pass()
    h.clock.advance(60_000)
    assert await s.run_pass() == M0 + 120_000
    assert [r.task_id for r in await store.list_instances()] == ["fine"]


async def test_a_tick_left_waiting_by_a_schedule_edit_is_closed_and_nothing_spins(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tick F (every 1m) waits for its marker; the schedule is then changed to a cron that
    does not fire at F. F is closed as skip_window (nothing else would decide it again), and
    the pass's next wake-up is in the future, not F's past re-check time (a busy loop)."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(DEPS)
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()
    [waiting] = await store.decisions("report")
    assert waiting.decision == "wait_dep"
    await h.apply(DEPS.replace("every: 1m", "cron: '30 * * * *', timezone: UTC"))
    h.clock.advance(3 * 3_600_000)
    nexts = [await s.run_pass() for _ in range(2)]
    assert all(n is not None and n > h.clock.now_ms() for n in nexts)
    at_f = [d for d in await store.decisions("report") if d.fire_time_ms == waiting.fire_time_ms]
    assert [d.decision for d in at_f] == ["wait_dep", "skip_window"]


async def test_a_tick_waiting_for_long_does_not_hold_back_the_ticks_after_it(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Yesterday's last ticks (every 1s, window 1h) wait for yesterday's marker, which never
    comes, so the cursor stays before them; today's marker is set. With at most 20 ticks per
    pass, today's ticks keep running pass after pass: decided ticks beyond the cursor do not
    use up the bound."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0 - 3_000))
    await h.apply(EVERY_SECOND_DEPS)
    await store.mark_ready("raw.ready", "2026-05-29")
    s = make(h)
    await s.run_pass()
    for _ in range(10):
        h.clock.advance(10_000)
        await s.run_pass()
    newest = max(r.scheduled_for_ms for r in await store.list_instances(limit=1000))
    assert newest == h.clock.now_ms() - h.clock.now_ms() % 1000


async def chunked_backlog(h: Harness, mode: str, down_s: int, passes: int) -> list[int]:
    """`every: 1s` task `sec` (window 1 s, catch-up `mode`) whose scheduler was down for
    `down_s` seconds after its first pass; `passes` passes later, the fire times (s after
    DAY0) that have an instance. The caller bounds the ticks per pass."""
    h.clock.set(DAY0 - 500)
    await h.apply(
        "tasks:\n  - {id: sec, agent: echo, schedule: {every: 1s}, window: 1s,"
        f" concurrency: allow, catchup: {{enabled: true, max_delay: 1h, mode: {mode}}}}}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(DAY0 + down_s * 1000 + 500)
    for _ in range(passes):
        await s.run_pass()
    rows = await h.store.list_instances(limit=1000)
    return sorted((r.scheduled_for_ms - DAY0) // 1000 for r in rows)


async def test_latest_catch_up_runs_once_however_many_chunks_the_backlog_takes(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for 50 s with `every: 1s`, at most 20 ticks per pass: the backlog takes three
    chunks, and `mode: latest` still runs one tick (the newest, on time), not one per chunk."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0))
    assert await chunked_backlog(h, "latest", down_s=50, passes=5) == [50]


async def test_an_older_tick_still_waiting_is_not_a_newer_tick_on_time(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tick H waits for its marker; the scheduler is then down until H + 1h45m. Tick H + 1h
    (window 30m) is 45 min late, inside `max_delay`: with `mode: latest` and no newer tick
    on time, catch-up runs it. The older waiting tick H does not count as on time."""
    h = Harness(store, redis, keys, FixedClock(DAY0 - 1_000))
    await h.apply(
        "tasks:\n  - {id: hourly, agent: echo, schedule: {every: 1h}, window: 30m,"
        " depends_on: [raw.ready], catchup: {mode: latest, max_delay: 1h}}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(DAY0 + 1_000)
    await s.run_pass()
    h.clock.set(DAY0 + 105 * 60_000)
    await s.run_pass()
    assert [r.scheduled_for_ms for r in await store.list_instances()] == [DAY0 + 3_600_000]


async def test_all_catch_up_runs_the_newest_burst_of_the_whole_backlog_across_chunks(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for 150 s with `every: 1s`, at most 20 ticks per pass: `mode: all` runs the
    newest 100 missed ticks of the whole backlog (and the tick on time), not 100 per chunk."""
    monkeypatch.setattr(advance, "MAX_TICKS_PER_PASS", 20)
    h = Harness(store, redis, keys, FixedClock(DAY0))
    assert await chunked_backlog(h, "all", down_s=150, passes=10) == list(range(50, 151))
    coalesced = await store.decisions("sec", since_ms=DAY0, limit=60)
    first = next(d for d in coalesced if d.fire_time_ms == DAY0)
    assert (first.decision, first.details["max_burst"]) == ("coalesced", 100)
    assert first.details["oldest_run_ms"] == DAY0 + 50_000


@pytest.mark.parametrize("gone_for_ms", [3 * 60_000, 2 * 3_600_000])
async def test_a_tick_whose_instance_a_dead_leader_made_is_recorded_as_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, gone_for_ms: int
) -> None:
    """A leader created tick M0's instance, then died before recording the decision. The
    next leader comes after the window closed: catch-up would call the tick `coalesced`
    (a newer tick is on time) or `missed` (past `max_delay`), but it did run; the record
    says so and names the instance, and no `missed:` record is made for it."""
    h = Harness(store, redis, keys, FixedClock(M0 - 500))
    text = (
        "tasks:\n  - {id: minute, agent: echo, schedule: {every: 1m}, window: 1m,"
        " catchup: {mode: latest, max_delay: 1h}}\n"
    )
    await h.apply(text)
    s = make(h)
    await s.run_pass()
    spec = next(t for t in await h.definitions() if t.id == "minute")
    made = await h.outbox.emit(new_instance(spec, M0), now_ms=M0)
    h.clock.set(M0 + gone_for_ms + 500)
    await make(h).run_pass()
    [decision] = [d for d in await store.decisions("minute", since_ms=M0) if d.fire_time_ms == M0]
    assert (decision.decision, decision.instance_id) == ("should_run", made.instance_id)
    assert decision.details["recorded_after_creation"] is True
    row = await store.get_instance(made.instance_id)
    assert row is not None
    keys_made = {r.dedupe_key for r in await store.list_instances(limit=1000)}
    assert f"missed:{row.dedupe_key}" not in keys_made
