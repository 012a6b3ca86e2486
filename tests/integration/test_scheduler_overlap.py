"""Overlap policies on real Redis and a real store, clock passed in: `forbid` skips a tick
while the previous run is active, `replace` cancels it, yet gives way to a later manual run
(however many earlier runs are active) and follows a previous run claimed during the
cancel."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.outbox import Emitted
from taskstream.core.protocol import Keys
from taskstream.core.spec import TaskSpec
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import manual
from taskstream.scheduler.facts import ACTIVE_READ
from taskstream.scheduler.service import Scheduler
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import DEPS, M0, OVERLAP, make


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


@pytest.mark.parametrize("policy", ["forbid", "replace"])
async def test_an_active_run_whose_row_cannot_be_read_is_still_an_active_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, policy: str
) -> None:
    """The previous run's row holds JSON that does not parse (a hand edit in SQL): it is
    still in flight, so `forbid` skips the tick naming it, and `replace` runs the tick and
    leaves it as it is (it cannot be read to be cancelled), instead of the task failing on
    every pass with no decision recorded."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(OVERLAP.format(policy=policy))
    s = make(h)
    await s.run_pass()
    h.clock.advance(60_000)
    await s.run_pass()  # first run: DISPATCHED, nobody executes it
    [first] = await store.list_instances()
    async with store.engine.begin() as conn:
        stmt = text("UPDATE task_instances SET payload = '{oops' WHERE id = :id")
        await conn.execute(stmt, {"id": first.id})
    h.clock.advance(60_000)
    with capture_logs() as logs:
        await s.run_pass()
    assert not [e for e in logs if e["event"] == "task.advance_failed"]
    last = (await store.decisions("job"))[-1]
    async with store.engine.connect() as conn:
        stmt = text("SELECT status, payload FROM task_instances WHERE id = :id")
        kept = tuple((await conn.execute(stmt, {"id": first.id})).one())
    assert kept == (Status.DISPATCHED.value, "{oops")
    if policy == "forbid":
        assert last.decision == "skip_overlap"
        assert f"{first.id} is still unreadable" in last.reason
    else:
        assert last.decision == "should_run"
        assert [e["instance_id"] for e in logs if e["event"] == "instance.unreadable"] == [first.id]
