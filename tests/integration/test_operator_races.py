"""Operator commands against a store that fails part-way, and against each other: what was
done stands and is said, and no run is made twice."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from taskstream.core import operations, streams
from taskstream.core import streams_admin as admin
from taskstream.core.clock import FixedClock
from taskstream.core.definitions import DefinitionCache
from taskstream.core.errors import StoreUnavailable, TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys, Priority
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import manual
from taskstream.scheduler.service import new_instance
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import DAY0, make
from tests.integration.test_operations import TASKS, h

__all__ = ["h"]  # the fixture, shared with test_operations


def _down_after_transition(store: SqlStore, monkeypatch: pytest.MonkeyPatch, *failing: str) -> None:
    """Once a status move commits, the store's `failing` methods raise `StoreUnavailable`,
    as a database that goes away right after a commit."""
    real: Callable[..., Awaitable[Any]] = store.transition

    async def down(*_: object, **__: object) -> Any:
        raise StoreUnavailable("store sqlite://... unavailable: OperationalError")

    async def then_down(*args: Any, **kwargs: Any) -> Any:
        moved = await real(*args, **kwargs)
        for name in failing:
            monkeypatch.setattr(store, name, down)
        return moved

    monkeypatch.setattr(store, "transition", then_down)


async def _failed(h: Harness) -> str:
    row = await h.trigger(TASKS, "once-fails")
    await h.run_until(row.id, Status.FAILED)
    return row.id


@pytest.mark.parametrize("failing", [("get_instance", "dispatch_many"), ("dispatch_many",)])
async def test_a_retry_whose_store_fails_after_the_requeue_says_the_requeue_stands(
    h: Harness, monkeypatch: pytest.MonkeyPatch, failing: tuple[str, ...]
) -> None:
    """FAILED -> PENDING committed, then the store went away: the requeue is done, so the
    command must not report a failure (a script would retry and be told the instance is not
    FAILED); it says what is left, and the reconciler or the executor finishes it."""
    instance_id = await _failed(h)
    _down_after_transition(h.store, monkeypatch, *failing)
    late = await operations.requeue(
        h.outbox, instance_id, who="ops", why="fixed", now_ms=h.clock.now_ms()
    )
    monkeypatch.undo()
    assert late is not None, late
    after = await h.store.get_instance(instance_id)
    assert after is not None and after.status is Status.PENDING
    history = await h.store.history(instance_id)
    assert [(x.owner, x.note) for x in history if x.reason == "requeued"] == [("ops", "fixed")]
    if "get_instance" in failing:
        assert late.startswith("not published yet (store sqlite://... unavailable"), late
        assert late.endswith("the reconciler publishes it"), late
        h.clock.advance(60_000)
        assert await h.reconciler().reconcile() == 1
    else:
        assert late.startswith("published; its move to DISPATCHED not recorded (store "), late
    assert instance_id in await admin.instance_ids(h.redis, h.keys)
    await h.run_until(instance_id, Status.SUCCESS)


HOURLY = "tasks:\n  - {id: j, agent: echo, schedule: {every: 1h}, window: 5m}\n"
MIN = 60_000
TEN = DAY0 + 600 * MIN
"""2026-05-29T10:00:00Z."""


async def test_a_pause_during_a_pass_stops_the_ticks_after_it_not_the_one_being_decided(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads the definitions once, at its start: a pause that commits while it runs
    leaves the tick it is deciding to it (the run is made, as docs/scheduling.md says), and
    the next pass decides nothing of the task until it is resumed."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await h.apply(HOURLY)
    s = make(h)
    await s.run_pass()  # first seen at 09:59:59
    real = DefinitionCache.refresh

    async def paused_meanwhile(cache: DefinitionCache, *, force: bool = False) -> bool:
        loaded = await real(cache, force=force)
        assert await store.set_paused("j", True) is True
        return loaded

    monkeypatch.setattr(DefinitionCache, "refresh", paused_meanwhile)
    h.clock.set(TEN + 500)
    await s.run_pass()
    monkeypatch.undo()
    fires = [(r.scheduled_for_ms - DAY0) // MIN for r in await store.list_instances()]
    assert fires == [600]
    h.clock.set(TEN + 60 * MIN + 500)
    await s.run_pass()
    assert len(await store.list_instances()) == 1
    assert [d.fire_time_ms for d in await store.decisions("j")] == [TEN]
    assert await store.set_paused("j", False) is True
    await s.run_pass()
    fires = sorted((r.scheduled_for_ms - DAY0) // MIN for r in await store.list_instances())
    assert fires == [600, 660]


async def test_a_retry_run_twice_in_a_row_names_the_requeue_that_was_done(h: Harness) -> None:
    """A retried script's second `retry` is refused (exit 1), naming who requeued it, when
    and why, so it can tell its own first run's requeue from an instance never FAILED."""
    instance_id = await _failed(h)
    now_ms = h.clock.now_ms()
    assert (
        await operations.requeue(h.outbox, instance_id, who="ops", why="fixed", now_ms=now_ms)
        is None
    )
    with pytest.raises(TaskstreamError) as again:
        await operations.requeue(h.outbox, instance_id, who="ops", why="fixed", now_ms=now_ms)
    said = str(again.value)
    assert said.startswith(f"instance {instance_id} is DISPATCHED; only FAILED can be retried"), (
        said
    )
    assert re.search(r" \(last requeued by ops at 20\d\d-[0-9-]+T[0-9:]+\+00:00: fixed\)$", said), (
        said
    )


async def test_retries_at_once_requeue_once_and_the_others_say_by_whom(h: Harness) -> None:
    instance_id = await _failed(h)
    said = await asyncio.gather(
        *(
            operations.requeue(
                Outbox(h.store, h.redis, h.keys),
                instance_id,
                who=f"op{n}",
                why=f"click {n}",
                now_ms=h.clock.now_ms(),
            )
            for n in range(3)
        ),
        return_exceptions=True,
    )
    assert said.count(None) == 1, said
    winner = f"op{said.index(None)}"
    history = await h.store.history(instance_id)
    assert [x.owner for x in history if x.reason == "requeued"] == [winner]
    for lost in (s for s in said if s is not None):
        assert isinstance(lost, TaskstreamError), lost
        assert f"requeued by {winner} at " in str(lost), lost
    assert await h.redis.xlen(h.keys.stream(Priority.DEFAULT)) == 1


async def test_trigger_and_backfills_of_the_tick_the_scheduler_decides_make_one_run(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The scheduler decides 10:00 while an operator triggers 10:00 and two backfills of it
    run: the dedupe key lets one of the four create it, once published; each of the others
    records `skip_duplicated` naming that instance."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await h.apply(HOURLY)
    s = make(h)
    await s.run_pass()  # first seen at 09:59:59
    h.clock.set(TEN + 500)
    [spec] = await h.definitions()

    def backfill() -> Awaitable[manual.BackfillResult]:
        outbox = Outbox(store, redis, keys)
        return manual.backfill(outbox, spec, from_ms=TEN, to_ms=TEN, now_ms=TEN + 500)

    trigger = manual.trigger(Outbox(store, redis, keys), spec, now_ms=TEN + 500, at_ms=TEN)
    _, triggered, *filled = await asyncio.gather(s.run_pass(), trigger, backfill(), backfill())
    [row] = await store.list_instances()
    assert row.scheduled_for_ms == TEN
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == 1
    decided = [(d.decision, d.instance_id) for d in await store.decisions("j")]
    assert sorted(decided) == [("should_run", row.id)] + [("skip_duplicated", row.id)] * 3
    assert triggered.instance_id == row.id
    assert sum(f.published for f in filled) + (triggered.outcome == "published") <= 1


async def test_a_schedule_applied_during_a_pass_counts_no_tick_twice_and_skips_none(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hourly, then every minute in Berlin time, applied while the 10:00 pass runs: that pass
    decides 10:00 on the schedule it read, the next decides 10:01 and 10:02 on the new one."""
    h = Harness(store, redis, keys, FixedClock(TEN - 1_000))
    await h.apply(HOURLY)
    s = make(h)
    await s.run_pass()
    real = DefinitionCache.refresh

    async def applied_meanwhile(cache: DefinitionCache, *, force: bool = False) -> bool:
        loaded = await real(cache, force=force)
        await h.apply(HOURLY.replace("every: 1h", "every: 1m, timezone: Europe/Berlin"))
        return loaded

    monkeypatch.setattr(DefinitionCache, "refresh", applied_meanwhile)
    h.clock.set(TEN + 500)
    await s.run_pass()
    monkeypatch.undo()
    h.clock.set(TEN + 2 * MIN + 500)
    await s.run_pass()
    fires = sorted((r.scheduled_for_ms - DAY0) // MIN for r in await store.list_instances())
    assert fires == [600, 601, 602]
    decided = [((d.fire_time_ms - DAY0) // MIN, d.decision) for d in await store.decisions("j")]
    assert decided == [(600, "should_run"), (601, "should_run"), (602, "should_run")]


async def test_a_trigger_whose_decision_the_store_drops_says_the_run_was_made(
    h: Harness, db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is created and published, then the store fails to record its decision: the
    command says the run was made (exit 0, a warning), or a script would trigger again and,
    without `--at`, make a second run."""

    async def down(*_: object, **__: object) -> bool:
        raise StoreUnavailable("store sqlite://... unavailable: OperationalError")

    monkeypatch.setattr(SqlStore, "record_decision", down)
    out = await run_cli(h, db_url, redis_url, "trigger", "once-fails")
    monkeypatch.undo()
    assert out.exit_code == 0, (out.output, out.exception)
    [row] = await h.store.list_instances(task_id="once-fails")
    assert out.stdout.startswith(f"once-fails: published {row.id} (fire time "), out.stdout
    assert out.stderr == (
        "warning: the decision of this run was not recorded (store sqlite://... unavailable:"
        " OperationalError): `taskstream explain` does not show it; the run was made, do not"
        " trigger it again\n"
    ), out.stderr
    assert await h.store.decisions("once-fails") == []
    assert row.id in await admin.instance_ids(h.redis, h.keys)


async def test_a_replay_whose_store_fails_after_its_publish_says_so_and_drops_the_letter(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A letter of a PENDING instance: the replay's XADD lands, then the store fails the move
    to DISPATCHED. The entry is on the stream, so the replay is done: it says so, and drops
    the letter, so that a replay run again does not publish the instance a second time."""
    text = TASKS.replace("nobody-knows-me", "echo")  # as the fixture applied it
    spec = next(t for t in parse_task_file_text(text, "t.yaml").tasks if t.id == "ghost")
    created = await h.store.create_instance(new_instance(spec, h.clock.now_ms()))
    await h.redis.xadd(h.keys.dead, {"reason": "poison", "orig.instance_id": created.instance_id})
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)

    async def down(*_: object, **__: object) -> Any:
        raise StoreUnavailable("store sqlite://... unavailable: OperationalError")

    monkeypatch.setattr(h.store, "dispatch_many", down)
    done = await operations.replay(h.outbox, letter, who="ops", now_ms=h.clock.now_ms())
    monkeypatch.undo()
    assert done.startswith("published; its move to DISPATCHED not recorded (store "), done
    assert await h.redis.xlen(h.keys.dead) == 0
    assert await admin.instance_ids(h.redis, h.keys) == {created.instance_id}
    await h.run_until(created.instance_id, Status.SUCCESS)
    history = await h.store.history(created.instance_id)
    assert [x.reason for x in history if x.to_status is Status.DISPATCHED] == ["seen_on_stream"]
