"""Manual triggers, backfills and the decision trail on real Redis and a real store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.definitions import to_records
from taskstream.core.errors import StoreUnavailable, TaskstreamError, UsageError
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys, Priority
from taskstream.core.spec import TaskSpec
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import manual
from taskstream.scheduler.trail import decision_trail, nearest_decided_fire

TASKS = """
tasks:
  - id: report
    agent: echo
    schedule: {cron: "0 9 * * *", timezone: Europe/Berlin}
    calendar: {allow_weekend: false}
  - id: regional
    agent: echo
    schedule: {every: 1h, timezone: Europe/Berlin}
    dedupe_key: "{task_id}:{business_date}:{payload.region}"
    payload: {region: eu}
  - id: on-demand
    agent: echo
  - id: nightly
    agent: echo
    schedule: {cron: "30 1 * * *", timezone: UTC}
    calendar: {exclude_dates: ["2026-12-01"], maintenance: [{start: "01:00", end: "02:00"}]}
  - id: nightly-strict
    agent: echo
    schedule: {cron: "30 1 * * *", timezone: UTC}
    calendar: {maintenance: [{start: "01:00", end: "02:00"}]}
    catchup: {enabled: false}
  - id: due-in-2h
    agent: echo
    schedule: {cron: "0 9 * * *", timezone: UTC}
    deadline: 2h
"""


def ms(text: str) -> int:
    """UTC epoch ms of an ISO 8601 time with offset."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


MONDAY = ms("2026-11-30T00:00:00+00:00")  # 2026-11-30 is a Monday
SUNDAY_NIGHT = ms("2026-12-06T23:59:00+00:00")
LATER = ms("2026-12-10T12:00:00+00:00")


@pytest.fixture
async def specs(store: SqlStore) -> dict[str, TaskSpec]:
    taskfile = parse_task_file_text(TASKS, "t.yaml")
    await store.upsert_definitions(to_records(taskfile))
    return {spec.id: spec for spec in taskfile.tasks}


@pytest.fixture
def outbox(store: SqlStore, redis: streams.Redis, keys: Keys) -> Outbox:
    return Outbox(store, redis, keys)


async def test_triggering_the_same_key_twice_creates_one_instance(
    outbox: Outbox, specs: dict[str, TaskSpec], keys: Keys
) -> None:
    at_ms = ms("2026-12-01T08:00:00+00:00")
    first = await manual.trigger(outbox, specs["report"], now_ms=LATER, at_ms=at_ms)
    second = await manual.trigger(outbox, specs["report"], now_ms=LATER + 5, at_ms=at_ms)

    assert (first.outcome, second.outcome) == ("published", "duplicate")
    assert first.instance_id == second.instance_id
    rows = await outbox.store.list_instances(task_id="report")
    assert [(r.scheduled_for_ms, r.payload) for r in rows] == [(at_ms, {})]
    assert await outbox.redis.xlen(keys.stream(Priority.DEFAULT)) == 1
    trail = await decision_trail(outbox.store, "report", at_ms)
    assert [(d.decision, d.reason) for d in trail] == [
        ("should_run", "manual trigger"),
        ("skip_duplicated", "manual trigger: an instance with this dedupe key exists"),
    ]
    assert trail[1].details["existing_status"] == "DISPATCHED"
    assert trail[1].instance_id == first.instance_id


async def test_trigger_without_a_time_fires_now(outbox: Outbox, specs: dict[str, TaskSpec]) -> None:
    emitted = await manual.trigger(outbox, specs["on-demand"], now_ms=LATER)
    row = await outbox.store.get_instance(emitted.instance_id)
    assert row is not None
    assert row.scheduled_for_ms == LATER
    assert row.dedupe_key == "on-demand:2026-12-10T12:00:00.000Z"


async def test_payload_override_renders_into_the_dedupe_key(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    spec, at_ms = specs["regional"], ms("2026-12-01T10:00:00+00:00")
    default = await manual.trigger(outbox, spec, now_ms=LATER, at_ms=at_ms)
    us = await manual.trigger(outbox, spec, now_ms=LATER, at_ms=at_ms, payload={"region": "us"})
    again = await manual.trigger(outbox, spec, now_ms=LATER, at_ms=at_ms, payload={"region": "us"})

    assert (default.outcome, us.outcome, again.outcome) == ("published", "published", "duplicate")
    row = await outbox.store.get_instance(us.instance_id)
    assert row is not None
    assert (row.dedupe_key, row.payload) == ("regional:2026-12-01:us", {"region": "us"})
    with pytest.raises(UsageError, match=r"payload\.region"):
        await manual.trigger(outbox, spec, now_ms=LATER, at_ms=at_ms, payload={"zone": "x"})
    assert len(await outbox.store.list_instances(task_id="regional")) == 2


async def test_backfill_counts_published_duplicate_and_calendar_skipped(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    spec, wednesday_ms = specs["report"], ms("2026-12-02T09:00:00+01:00")
    await manual.trigger(outbox, spec, now_ms=LATER, at_ms=wednesday_ms)

    done = await manual.backfill(
        outbox, spec, from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER, limit=7
    )

    assert len(done.fire_times) == 7
    assert (done.published, done.duplicate, done.skipped_calendar) == (4, 1, 2)
    rows = await outbox.store.list_instances(task_id="report")
    assert len(rows) == 5
    weekdays = {"2026-11-30", "2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"}
    assert {r.business_date for r in rows} == weekdays
    saturday = await decision_trail(outbox.store, "report", ms("2026-12-05T08:00:00Z"))
    assert [(d.decision, d.instance_id) for d in saturday] == [("skip_calendar", None)]
    assert saturday[0].details["calendar"]["rule"] == "weekend"
    assert saturday[0].details["calendar"]["weekday"] == "sat"

    again = await manual.backfill(outbox, spec, from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER)
    assert (again.published, again.duplicate, again.skipped_calendar) == (0, 5, 2)
    monday = await decision_trail(outbox.store, "report", ms("2026-11-30T08:00:00Z"))
    assert [(d.decision, d.reason) for d in monday] == [
        ("should_run", "backfill"),
        ("skip_duplicated", "backfill: an instance with this dedupe key exists"),
    ]


async def test_backfill_runs_fire_times_inside_maintenance_as_the_scheduler_would(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    """Every 01:30 falls inside the 01:00-02:00 window. With catch-up on, the scheduler holds
    such a start until 02:00 and runs it, so a backfill (whose runs start now) creates them;
    an excluded date is still skipped. With catch-up off the window skips them, as it does
    for the scheduler."""
    week: dict[str, Any] = {"from_ms": MONDAY, "to_ms": SUNDAY_NIGHT, "now_ms": LATER}
    done = await manual.backfill(outbox, specs["nightly"], **week)
    assert (done.published, done.skipped_calendar) == (6, 1)
    tuesday = await decision_trail(outbox.store, "nightly", ms("2026-12-01T01:30:00Z"))
    assert tuesday[0].details["calendar"]["rule"] == "exclude_date"
    strict = await manual.backfill(outbox, specs["nightly-strict"], **week)
    assert (strict.published, strict.skipped_calendar) == (0, 7)
    monday = await decision_trail(outbox.store, "nightly-strict", ms("2026-11-30T01:30:00Z"))
    assert monday[0].details["calendar"]["rule"] == "maintenance"


async def test_an_operators_run_of_a_past_fire_time_gets_its_whole_deadline(
    outbox: Outbox, specs: dict[str, TaskSpec], store: SqlStore
) -> None:
    """`deadline: 2h` counts from the fire time for the scheduler's runs; a backfilled or
    triggered run of a fire time days ago would be past it before it started, and never
    run. Its deadline counts from when it is made; a future `--at` keeps its own."""
    spec, hour = specs["due-in-2h"], 3_600_000
    fire_ms = ms("2026-12-01T09:00:00Z")
    await manual.backfill(outbox, spec, from_ms=fire_ms, to_ms=fire_ms, now_ms=LATER)
    past = await manual.trigger(outbox, spec, now_ms=LATER, at_ms=fire_ms + 24 * hour)
    ahead = await manual.trigger(outbox, spec, now_ms=LATER, at_ms=LATER + 24 * hour)
    rows = {r.scheduled_for_ms: r for r in await store.list_instances(task_id="due-in-2h")}
    assert rows[fire_ms].deadline_ms == LATER + 2 * hour
    assert {r.id: r.deadline_ms for r in rows.values()}[past.instance_id] == LATER + 2 * hour
    assert rows[LATER + 24 * hour].id == ahead.instance_id
    assert rows[LATER + 24 * hour].deadline_ms == LATER + 26 * hour


async def test_backfill_range_is_inclusive_at_both_ends(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    fire_ms = ms("2026-12-01T08:00:00Z")
    done = await manual.backfill(
        outbox, specs["report"], from_ms=fire_ms, to_ms=fire_ms, now_ms=LATER
    )
    assert done.fire_times == (fire_ms,)
    assert done.published == 1


async def test_backfill_while_redis_fails_counts_the_unpublished_runs(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    dead = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    broken = Outbox(outbox.store, dead, outbox.keys)
    try:
        done = await manual.backfill(
            broken, specs["report"], from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER
        )
    finally:
        await dead.aclose()
    assert (done.published, done.unpublished, done.duplicate, done.skipped_calendar) == (
        0,
        5,
        0,
        2,
    )
    monday = await decision_trail(outbox.store, "report", ms("2026-11-30T08:00:00Z"))
    assert [(d.decision, d.details["outcome"]) for d in monday] == [("should_run", "unpublished")]


async def test_backfill_over_the_limit_names_the_count_and_writes_nothing(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    with pytest.raises(TaskstreamError, match="covers 7 fire times, over the limit of 6"):
        await manual.backfill(
            outbox, specs["report"], from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER, limit=6
        )
    week_end_ms = MONDAY + 167 * 3_600_000
    with pytest.raises(TaskstreamError, match="covers 168 fire times, over the limit of 100"):
        await manual.backfill(
            outbox, specs["regional"], from_ms=MONDAY, to_ms=week_end_ms, now_ms=LATER, limit=100
        )
    assert await outbox.store.list_instances(task_id="report") == []
    assert await outbox.store.decisions("report") == []


async def test_backfill_refuses_future_ranges_and_on_demand_tasks(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    with pytest.raises(TaskstreamError, match="past fire times only"):
        await manual.backfill(
            outbox, specs["report"], from_ms=MONDAY, to_ms=LATER + 1, now_ms=LATER
        )
    with pytest.raises(TaskstreamError, match="on demand"):
        await manual.backfill(
            outbox, specs["on-demand"], from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER
        )


async def test_the_nearest_decided_fire_time_is_found_on_either_side(
    store: SqlStore, specs: dict[str, TaskSpec]
) -> None:
    assert await nearest_decided_fire(store, "report", None) is None
    base = ms("2026-12-01T08:00:00Z")
    fires = [base, base + 86_400_000, base + 3 * 86_400_000]
    for fire_ms in fires:
        row = DecisionRow("report", fire_ms, "missed", "late", {}, None, fire_ms + 1)
        await store.record_decision(row)

    nearest = nearest_decided_fire
    assert await nearest(store, "report", None) == fires[2]
    assert await nearest(store, "report", fires[1]) == fires[1]
    assert await nearest(store, "report", fires[1] + 3_600_000) == fires[1]
    assert await nearest(store, "report", fires[1] + 2 * 86_400_000 - 1) == fires[2]
    assert await nearest(store, "report", fires[1] + 86_400_000) == fires[2]  # a tie: later
    assert await nearest(store, "report", base - 10**9) == fires[0]
    assert await nearest(store, "report", fires[2] + 10**9) == fires[2]
    assert await decision_trail(store, "report", None) == []


async def test_a_backfill_stopped_by_the_store_names_where_and_runs_again_to_finish(
    outbox: Outbox, specs: dict[str, TaskSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes away at the third weekday: the fire times before it are done (created,
    published, recorded), the error says where it stopped and that running it again finishes
    it; run again, it creates only the rest and reports the first ones duplicate."""
    real = outbox.store.create_instances
    made: list[int] = []

    async def down_at_the_third(*args: Any, **kwargs: Any) -> Any:
        if len(made) == 2:
            raise StoreUnavailable("store sqlite://... unavailable: OperationalError")
        made.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(outbox.store, "create_instances", down_at_the_third)
    with pytest.raises(TaskstreamError) as stopped:
        await manual.backfill(
            outbox, specs["report"], from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER
        )
    monkeypatch.undo()
    said = str(stopped.value)
    assert said.startswith(
        "backfill of 'report' stopped at fire time 2026-12-02T08:00:00.000Z (store sqlite://..."
        " unavailable: OperationalError): the 2 fire time(s) before it are done;"
    ), said
    assert said.endswith(
        "run the same backfill again to finish it (the fire times already created are then"
        " skip_duplicated)"
    ), said
    assert len(await outbox.store.list_instances(task_id="report")) == 2
    done = await manual.backfill(
        outbox, specs["report"], from_ms=MONDAY, to_ms=SUNDAY_NIGHT, now_ms=LATER
    )
    assert (done.published, done.duplicate, done.skipped_calendar) == (3, 2, 2)


async def test_an_operators_runs_are_recorded_with_who_made_them(
    outbox: Outbox, specs: dict[str, TaskSpec]
) -> None:
    """The creation of a triggered or backfilled instance names the operator in its history
    (`inspect`) and in its decision (`explain`), as a requeue does; a duplicate names the
    operator in its decision only: the instance is another's."""
    at_ms = ms("2026-12-01T08:00:00+00:00")
    report = specs["report"]
    made = await manual.trigger(outbox, report, now_ms=LATER, at_ms=at_ms, who="alice")
    again = await manual.trigger(outbox, report, now_ms=LATER, at_ms=at_ms, who="bob")
    filled = await manual.backfill(
        outbox, report, from_ms=MONDAY, to_ms=at_ms, now_ms=LATER, who="carol"
    )
    assert (made.outcome, again.outcome, filled.duplicate) == ("published", "duplicate", 1)
    [created] = (await outbox.store.history(made.instance_id))[:1]
    assert (created.reason, created.owner) == ("manual", "alice")
    [monday] = [i for i in filled.instance_ids if i != made.instance_id]
    [created] = (await outbox.store.history(monday))[:1]
    assert (created.reason, created.owner) == ("backfill", "carol")
    trail = await decision_trail(outbox.store, "report", at_ms)
    assert [d.details["by"] for d in trail] == ["alice", "bob", "carol"]
