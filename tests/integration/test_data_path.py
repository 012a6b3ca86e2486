"""The walking skeleton end to end on real Redis and a real store, clock passed in:
scheduler pass -> outbox -> stream -> executor handler -> commit -> XACK+XDEL."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.definitions import to_records
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import GROUP, Keys, Priority, WorkEntry, encode
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import Scheduler, SchedulerConfig, new_instance
from tests.integration.harness import Harness, Running, until

T0 = 1_780_000_000_000  # a whole multiple of 10 s
TASKS = """
tasks:
  - id: every10
    agent: echo
    schedule: {every: 10s}
    window: 5s
    payload: {n: 1}
  - id: ghost
    agent: echo
"""


async def apply(store: SqlStore, text: str = TASKS) -> None:
    """Apply `text` as at T0, the time of the tests' clocks."""
    taskfile = parse_task_file_text(text, "t.yaml", known_agents={"echo", "sleep"})
    await store.upsert_definitions(to_records(taskfile), now_ms=T0)


def scheduler(store: SqlStore, redis: streams.Redis, keys: Keys, clock: FixedClock) -> Scheduler:
    return Scheduler(store, Outbox(store, redis, keys), clock, SchedulerConfig())


async def drain(store: SqlStore, redis: streams.Redis, keys: Keys) -> None:
    """Run an executor until every work stream is empty and nothing is pending."""
    h = Harness(store, redis, keys, registry_modules=())
    ex = Running(h.executor())

    async def empty() -> bool:
        for stream in keys.streams():
            if await redis.xlen(stream) or (await redis.xpending(stream, GROUP))["pending"]:
                return False
        return True

    try:
        await until(empty)
    finally:
        await ex.close()


async def test_a_tick_runs_once_to_success(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(store)
    await streams.ensure_groups(redis, keys)
    clock = FixedClock(T0 + 1)
    sched = scheduler(store, redis, keys, clock)
    next_due = await sched.run_pass()
    assert next_due == T0 + 10_000
    assert await store.list_instances() == []
    clock.set(T0 + 10_000)
    await sched.run_pass()
    await scheduler(store, redis, keys, clock).run_pass()  # a second scheduler, same tick
    [row] = await store.list_instances(task_id="every10")
    assert row.status is Status.DISPATCHED
    assert row.scheduled_for_ms == T0 + 10_000
    decisions = await store.decisions("every10")
    assert sorted(d.decision for d in decisions) == ["should_run"]

    await drain(store, redis, keys)
    done = await store.get_instance(row.id)
    assert done is not None and done.status is Status.SUCCESS
    assert done.result == {"n": 1}
    assert done.attempt == 1
    history = [(h.from_status, h.to_status) for h in await store.history(row.id)]
    assert history == [
        (None, Status.PENDING),
        (Status.PENDING, Status.DISPATCHED),
        (Status.DISPATCHED, Status.RUNNING),
        (Status.RUNNING, Status.SUCCESS),
    ]
    stream = keys.stream(Priority.DEFAULT)
    assert await redis.xlen(stream) == 0
    assert (await redis.xpending(stream, GROUP))["pending"] == 0


async def test_two_schedulers_on_one_tick_make_one_instance(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(store)
    clock = FixedClock(T0 + 1)
    first, second = scheduler(store, redis, keys, clock), scheduler(store, redis, keys, clock)
    # Both have read the cursor before the tick is due: neither has seen the other's decision.
    await first.run_pass()
    await second.run_pass()
    clock.set(T0 + 10_000)
    await store.set_cursor("every10", T0 + 1)  # both see the tick as due
    await first.run_pass()
    await store.set_cursor("every10", T0 + 1)
    await second.run_pass()
    assert len(await store.list_instances(task_id="every10")) == 1
    decisions = sorted(d.decision for d in await store.decisions("every10"))
    assert decisions == ["should_run", "skip_duplicated"]
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == 1


@pytest.mark.parametrize(
    ("reason", "recorded"), [("scheduled", "should_run"), ("backfill", "skip_duplicated")]
)
async def test_a_tick_created_by_a_pass_that_stopped_before_recording_it_is_recorded_as_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, reason: str, recorded: str
) -> None:
    """A pass creates and publishes the tick's instance, then stops before its decision is
    written. The next pass records `should_run` naming that instance (it is the tick's own),
    where an instance a backfill made for the same key stays `skip_duplicated`."""
    await apply(store)
    await streams.ensure_groups(redis, keys)
    clock = FixedClock(T0 + 1)
    sched = scheduler(store, redis, keys, clock)
    await sched.run_pass()
    spec = next(t for t in parse_task_file_text(TASKS, "t.yaml").tasks if t.id == "every10")
    outbox = Outbox(store, redis, keys)
    made = await outbox.emit(new_instance(spec, T0 + 10_000, reason=reason), now_ms=T0 + 10_000)
    clock.set(T0 + 10_000)
    await scheduler(store, redis, keys, clock).run_pass()
    [row] = await store.list_instances(task_id="every10")
    assert row.id == made.instance_id
    [decision] = await store.decisions("every10")
    assert (decision.decision, decision.instance_id) == (recorded, row.id)
    assert decision.details.get("recorded_after_creation", False) is (reason == "scheduled")
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == 1


async def test_a_late_tick_is_caught_up_by_default(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(store)
    clock = FixedClock(T0 + 1)
    sched = scheduler(store, redis, keys, clock)
    await sched.run_pass()
    clock.set(T0 + 10_000 + 5_001)  # window (5 s) closed, within catchup.max_delay (1 h)
    await sched.run_pass()
    [row] = await store.list_instances(task_id="every10")
    assert row.scheduled_for_ms == T0 + 10_000
    [decision] = await store.decisions("every10")
    assert decision.decision == "should_run"
    assert decision.details["catchup"]


async def test_a_late_tick_without_catchup_is_missed_and_skipped(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(
        store, TASKS.replace("    window: 5s", "    window: 5s\n    catchup: {enabled: false}")
    )
    clock = FixedClock(T0 + 1)
    sched = scheduler(store, redis, keys, clock)
    await sched.run_pass()
    clock.set(T0 + 10_000 + 5_001)
    await sched.run_pass()
    [row] = await store.list_instances(task_id="every10")
    assert row.status is Status.SKIPPED
    [decision] = await store.decisions("every10")
    assert decision.decision == "missed"
    assert decision.instance_id == row.id
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == 0


async def test_undecodable_entries_are_dead_lettered_and_work_keeps_flowing(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(store)
    await streams.ensure_groups(redis, keys)
    stream = keys.stream(Priority.DEFAULT)
    await redis.xadd(stream, {"not": "an entry"})
    bad_version: dict[Any, Any] = {**encode(_entry("i_x")), "v": "99"}
    await redis.xadd(stream, bad_version)
    outbox = Outbox(store, redis, keys)
    spec = parse_task_file_text(TASKS, "t.yaml").tasks[1]
    emitted = await outbox.emit(new_instance(spec, T0), now_ms=T0)
    await drain(store, redis, keys)
    reasons = sorted(f[b"reason"] for _, f in await _dead(redis, keys))
    assert reasons == [b"missing_version", b"unknown_version"]
    row = await store.get_instance(emitted.instance_id)
    assert row is not None and row.status is Status.SUCCESS
    assert (await redis.xpending(stream, GROUP))["pending"] == 0


async def _emit_unknown_agent(store: SqlStore, redis: streams.Redis, keys: Keys) -> str:
    """Emit an instance whose agent (`nope`) no executor knows; returns its id."""
    await apply(store)
    await streams.ensure_groups(redis, keys)
    spec = parse_task_file_text(TASKS, "t.yaml").tasks[1]
    new = new_instance(spec, T0)
    new = type(new)(**{**_fields(new), "agent": "nope"})
    await Outbox(store, redis, keys).emit(new, now_ms=T0)
    return new.id


async def test_unknown_agent_is_poison(store: SqlStore, redis: streams.Redis, keys: Keys) -> None:
    instance_id = await _emit_unknown_agent(store, redis, keys)
    await drain(store, redis, keys)
    row = await store.get_instance(instance_id)
    assert row is not None and row.status is Status.FAILED
    assert row.fail_class is FailClass.POISON
    [(_, fields)] = await _dead(redis, keys)
    assert fields[b"reason"] == b"unknown_agent"


async def test_a_duplicate_entry_of_an_unknown_agent_is_acked_not_dead_lettered_again(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The first entry fails the instance as poison and is dead-lettered; a second entry of
    the same attempt (the sweeper's or the reconciler's republish) finds it settled."""
    instance_id = await _emit_unknown_agent(store, redis, keys)
    await drain(store, redis, keys)
    await streams.publish(redis, keys, Priority.DEFAULT, _entry(instance_id, agent="nope"))
    await drain(store, redis, keys)

    assert [f[b"reason"] for _, f in await _dead(redis, keys)] == [b"unknown_agent"]
    stream = keys.stream(Priority.DEFAULT)
    assert (await redis.xpending(stream, GROUP))["pending"] == 0
    assert await redis.xlen(stream) == 0
    history = await store.history(instance_id)
    assert [h.to_status for h in history].count(Status.FAILED) == 1


async def test_a_duplicate_delivery_commits_once(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await apply(store)
    await streams.ensure_groups(redis, keys)
    spec = parse_task_file_text(TASKS, "t.yaml").tasks[1]
    new = new_instance(spec, T0)
    await Outbox(store, redis, keys).emit(new, now_ms=T0)
    await drain(store, redis, keys)
    await streams.publish(redis, keys, Priority.DEFAULT, _entry(new.id, agent="echo"))
    await drain(store, redis, keys)
    history = await store.history(new.id)
    assert [h.to_status for h in history].count(Status.SUCCESS) == 1
    assert await redis.xlen(keys.stream(Priority.DEFAULT)) == 0


async def test_an_entry_seen_before_dispatch_is_still_claimed(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Crash (or slow CAS) between XADD and PENDING->DISPATCHED: the executor finishes it."""
    await apply(store)
    await streams.ensure_groups(redis, keys)
    spec = parse_task_file_text(TASKS, "t.yaml").tasks[1]
    new = new_instance(spec, T0)
    await store.create_instance(new)
    await streams.publish(redis, keys, Priority.DEFAULT, _entry(new.id, agent="echo"))
    await drain(store, redis, keys)
    row = await store.get_instance(new.id)
    assert row is not None and row.status is Status.SUCCESS
    again = await Outbox(store, redis, keys).emit(new, now_ms=T0)
    assert again.outcome == "duplicate"


def _entry(instance_id: str, agent: str = "echo") -> WorkEntry:
    return WorkEntry(
        instance_id=instance_id,
        task_id="ghost",
        agent=agent,
        attempt=0,
        scheduled_for_ms=T0,
        emitted_at_ms=T0,
    )


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


async def _dead(redis: streams.Redis, keys: Keys) -> list[tuple[bytes, dict[bytes, bytes]]]:
    rows: Any = await redis.xrange(keys.dead)
    return list(rows)


@pytest.fixture(autouse=True)
def _no_host_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fire times never depend on the host timezone."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
