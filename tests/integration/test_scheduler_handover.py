"""Two schedulers across a leader handover, on real Redis and a real store, clock passed in:
the old leader, still in a pass when its lease passed on, records no decision once the new
leader has taken the tasks over, so each tick has one final decision."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import verdict
from taskstream.scheduler.instances import new_instance
from taskstream.scheduler.leader import Fenced, LeaderLease
from taskstream.scheduler.service import LAPSE_MARGIN_MS, Scheduler, SchedulerConfig
from taskstream.scheduler.verdict import NOT_FINAL
from tests.integration.harness import Harness, until
from tests.integration.outages import waiting

M0 = 1_780_000_020_000
"""A whole minute (epoch ms), so `every: 1m` fires at M0 + k minutes."""
TASKS = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 1h}\n"
    "  - {id: gated, agent: echo, schedule: {every: 1m}, window: 1h, depends_on: [feed]}\n"
)
CLOSES = (
    "tasks:\n  - {id: closes, agent: echo, schedule: {every: 1m}, window: 30s,"
    " catchup: {enabled: false}}\n"
)
TOKEN_READ = "SELECT task_definitions.task_id, task_definitions.cursor_token %"
"""How a fenced write's locked read of its tasks' leader tokens starts (processlist)."""
LATE = "tasks:\n  - {id: late, agent: echo, schedule: {every: 1m}}\n"


@pytest.fixture
def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return Harness(store, redis, keys)


def _scheduler(h: Harness, name: str, clock: FixedClock | None = None) -> Scheduler:
    lease = LeaderLease(h.redis, h.keys, name, lease_ms=10_000)
    return Scheduler(h.store, h.outbox, clock or h.clock, SchedulerConfig(), leader=lease)


async def _handover(
    h: Harness,
    tasks: str = TASKS,
    *,
    new_at_ms: int = M0 + 1000,
    old_clock: FixedClock | None = None,
) -> tuple[Scheduler, int, Scheduler]:
    """`old` (on `old_clock`, default the harness's) leads and decides up to M0 - 1; its lease
    lapses (a pause), `new` takes it and makes one step at `new_at_ms`. Returns the old
    leader and its stale token, and the new one."""
    await h.apply(tasks)
    old, new = _scheduler(h, "old", old_clock), _scheduler(h, "new")
    h.clock.set(M0 - 1)
    if old_clock is not None:
        old_clock.set(M0 - 1)
    await old._step()
    stale = old._token
    assert stale is not None
    await h.redis.delete(h.keys.leader)  # what time does to a lease nobody renewed
    h.clock.set(new_at_ms)
    await new._step()
    assert new._token is not None and new._token > stale
    return old, stale, new


async def _final(h: Harness, task_id: str) -> list[tuple[str, str | None]]:
    rows = await h.store.decisions(task_id, limit=20)
    return [
        (d.decision, d.instance_id)
        for d in rows
        if d.fire_time_ms == M0 and d.decision not in NOT_FINAL
    ]


async def test_the_old_leader_records_no_decision_for_a_tick_the_new_one_decided(
    h: Harness,
) -> None:
    old, stale, _ = await _handover(h)

    with pytest.raises(Fenced):
        await old.run_pass(stale)  # it resumes where it paused, still holding its token

    [row] = [r for r in await h.store.list_instances(limit=10) if r.task_id == "minutely"]
    assert await _final(h, "minutely") == [(verdict.SHOULD_RUN, row.id)]


async def test_the_old_leader_records_nothing_for_a_waiting_tick_either(h: Harness) -> None:
    """A tick waiting for its marker is recorded as waiting by the new leader only."""
    old, stale, _ = await _handover(h)
    waiting = [d.decision for d in await h.store.decisions("gated", limit=20)]

    with pytest.raises(Fenced):
        await old.run_pass(stale)

    assert [d.decision for d in await h.store.decisions("gated", limit=20)] == waiting
    assert waiting == [verdict.WAIT_DEP]


async def test_a_leader_that_took_over_decides_as_before(h: Harness) -> None:
    """Taking the tasks over does not stop the new leader's own records or cursor moves."""
    _, _, new = await _handover(h)
    h.clock.set(M0 + 61_000)

    await new._step()

    rows = await h.store.decisions("minutely", limit=20)
    fires = [d.fire_time_ms for d in rows if d.decision not in NOT_FINAL]
    assert fires == [M0, M0 + 60_000]
    assert await h.store.get_cursor("minutely") == M0 + 60_000


def _row(fire_ms: int, task_id: str = "minutely") -> DecisionRow:
    return DecisionRow(task_id, fire_ms, verdict.SHOULD_RUN, "every rule passed", {}, None, 0)


async def test_an_old_leaders_record_waits_for_a_takeover_in_progress_and_is_refused(
    outage_server: Harness,
) -> None:
    """The token is read with a lock (MariaDB): a record that read it without one would see
    the old token while the new leader's takeover is uncommitted, and be written after it."""
    h = outage_server
    await h.apply(TASKS)
    await h.store.claim_cursors(5)
    async with h.store.engine.connect() as conn:
        await conn.execute(text("UPDATE task_definitions SET cursor_token = 6"))  # uncommitted
        record = asyncio.create_task(h.store.record_decision(_row(M0), token=5))
        await until(lambda: waiting(conn, TOKEN_READ))
        await conn.commit()

    assert await record is False
    assert await h.store.decisions("minutely", limit=10) == []


async def test_a_task_applied_during_a_takeover_gets_the_new_leaders_token(
    outage_server: Harness,
) -> None:
    """An apply that read the newest token without a lock, while a takeover was uncommitted,
    would give the new task the old leader's token, and the old leader could decide it."""
    h = outage_server
    await h.apply(TASKS)
    await h.store.claim_cursors(5)
    async with h.store.engine.connect() as conn:
        await conn.execute(text("UPDATE task_definitions SET cursor_token = 6"))  # uncommitted
        applied = asyncio.create_task(h.apply(LATE))
        await until(lambda: waiting(conn, "SELECT task_definitions.cursor_token%"))
        await conn.commit()
    await applied

    assert not await h.store.record_decision(_row(M0, "late"), token=5)
    assert not await h.store.set_cursor("late", M0, token=5)


async def test_the_old_leader_creates_no_instance_for_a_tick_the_new_one_skipped(
    h: Harness,
) -> None:
    """Paused past its lease in the middle of a pass, the old leader resumes with the time it
    read before the pause (the tick still in its window) and would run the tick; the new
    leader, later, found the window closed and, with catch-up off, recorded it missed. That
    stands: no run is created, and so none runs after its window."""
    paused_clock = FixedClock(M0 - 1)
    # The new leader steps once the 30 s window has closed; the old one wakes before that.
    old, stale, _ = await _handover(h, CLOSES, new_at_ms=M0 + 40_000, old_clock=paused_clock)
    paused_clock.set(M0 + 1000)

    with pytest.raises(Fenced):
        await old.run_pass(stale)

    [row] = await h.store.list_instances(limit=10)  # the record of the missed tick alone
    assert (row.status, row.dedupe_key.startswith("missed:")) == (Status.SKIPPED, True)
    decisions = await h.store.decisions("closes", limit=10)
    assert [(d.decision, d.instance_id) for d in decisions] == [(verdict.MISSED, row.id)]


async def test_an_old_leaders_instance_waits_for_a_takeover_in_progress_and_is_not_created(
    outage_server: Harness,
) -> None:
    """The creation reads the token with a lock too (MariaDB): without it, it would see the
    old token while the takeover is uncommitted and create the instance after it."""
    h = outage_server
    await h.apply(TASKS)
    await h.store.claim_cursors(5)
    [spec] = [s for s in await h.definitions() if s.id == "minutely"]
    new = new_instance(spec, M0)
    async with h.store.engine.connect() as conn:
        await conn.execute(text("UPDATE task_definitions SET cursor_token = 6"))  # uncommitted
        creating = asyncio.create_task(h.store.create_instances([new], tokens=[5]))
        await until(lambda: waiting(conn, TOKEN_READ))
        await conn.commit()

    [result] = await creating
    assert (result.created, result.fenced) == (False, True)
    assert await h.store.get_instance(new.id) is None


async def test_the_old_leader_leaves_no_missed_record_beside_the_new_ones_run(
    h: Harness,
) -> None:
    """The record of a missed tick (a SKIPPED instance) is an instance the scheduler creates
    too: the old leader, deciding with a time at which the window had closed, creates none
    for a tick the new leader ran."""
    paused_clock = FixedClock(M0 - 1)
    old, stale, _ = await _handover(h, CLOSES, old_clock=paused_clock)
    paused_clock.set(M0 + 40_000)

    with pytest.raises(Fenced):
        await old.run_pass(stale)

    [row] = await h.store.list_instances(limit=10)
    assert row.dedupe_key.startswith("closes:")
    decisions = await h.store.decisions("closes", limit=10)
    assert [(d.decision, d.instance_id) for d in decisions] == [(verdict.SHOULD_RUN, row.id)]


async def test_concurrent_applies_that_add_tasks_queue_instead_of_deadlocking(
    outage_server: Harness,
) -> None:
    """Each apply reads the newest token under lock, then changes a task they share: with
    shared locks, two applies holding theirs would each wait for the other to write."""
    h = outage_server
    await h.apply(TASKS)
    await h.store.claim_cursors(5)

    def applying(i: int) -> str:
        return (
            f"tasks:\n  - {{id: minutely, agent: echo, schedule: {{every: 1m}}, window: {i}m}}\n"
            f"  - {{id: added{i}, agent: echo, schedule: {{every: 1m}}}}\n"
        )

    for round_ in range(5):
        await asyncio.gather(*(h.apply(applying(10 * round_ + i + 1)) for i in range(4)))

    specs = {s.id for s in await h.definitions()}
    assert {f"added{10 * r + i + 1}" for r in range(5) for i in range(4)} <= specs
    assert not await h.store.set_cursor("added1", M0, token=4)


async def test_a_standby_after_redis_lost_the_token_counter_fences_the_leader(
    h: Harness,
) -> None:
    """The standby looked at the store's tokens while an earlier leader led (token 1); a
    newer leader took over with 2; then Redis restarted empty. When the standby takes the
    lease, its token must be above 2, or it shares the running leader's token and neither
    is fenced (two schedulers deciding the same ticks)."""
    await h.apply(TASKS)
    h.clock.set(M0 - 1)
    first, standby = _scheduler(h, "first"), _scheduler(h, "standby")
    await first._step()
    await standby._step()
    assert (first._token, standby._token) == (1, None)
    await h.redis.delete(h.keys.leader)  # the first leader's lease lapses
    leader = _scheduler(h, "leader")
    await leader._step()
    assert leader._token == 2
    await h.redis.delete(h.keys.leader, h.keys.leader_epoch)  # Redis restarted empty
    await _takes_over_and_fences(h, standby, leader)


async def test_a_leader_back_from_a_pause_after_redis_lost_writes_fences_the_newer_one(
    h: Harness,
) -> None:
    """The first leader (token 1) pauses past its lease; a newer one takes token 2 and claims
    the cursors; then Redis fails over to a replica that never saw the newer one's lease and
    token. The first leader, back, must take a token above 2 (it reads the store's tokens
    again), or both hold 2 and neither is fenced."""
    await h.apply(TASKS)
    h.clock.set(M0 - 1)
    first = _scheduler(h, "first")
    await first._step()
    assert first._token == 1
    counter_after_first = await h.redis.get(h.keys.leader_epoch)
    assert counter_after_first is not None
    await h.redis.delete(h.keys.leader)  # the first leader's lease lapses while it is paused
    newer = _scheduler(h, "newer")
    await newer._step()
    assert newer._token == 2
    await h.redis.delete(h.keys.leader)  # the replica lost the newer lease...
    await h.redis.set(h.keys.leader_epoch, counter_after_first)  # ...and its token
    await _takes_over_and_fences(h, first, newer)


async def _takes_over_and_fences(h: Harness, taker: Scheduler, running: Scheduler) -> None:
    """`taker` takes the lease with a token above `running`'s 2, so that `running`'s next
    pass is fenced."""
    h.clock.set(M0 + 1000)
    await taker._step()
    assert taker._token is not None and taker._token > 2
    h.clock.set(M0 + 61_000)
    with pytest.raises(Fenced):
        await running.run_pass(running._token)


async def test_a_standby_tries_again_when_the_leaders_lease_lapses(h: Harness) -> None:
    """A killed leader is replaced within one lease: the standby sleeps until the lease it
    saw lapses, not a whole polling interval (a third of a lease) past it."""
    leader, standby = _scheduler(h, "leader"), _scheduler(h, "standby")
    await h.apply(TASKS)
    await leader._step()
    assert await standby._step() == pytest.approx(10 / 3)  # a fresh lease: the usual poll
    await h.redis.pexpire(h.keys.leader, 1_200)  # the leader stopped renewing 8.8 s ago
    wait_s = await standby._step()
    assert 700 < round(wait_s * 1000) <= 1_200 + LAPSE_MARGIN_MS
