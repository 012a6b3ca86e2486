"""Ticks meeting what the scheduler did not decide for them, on real Redis and a real store
(clock passed in): an earlier tick's instance under a key several ticks share, an operator's
run at a fire time across a restart, a newer tick on time that the calendar skips, the tick's
own instance made by a leader that stopped before recording it, and `replace` meeting more
than one earlier run."""

from __future__ import annotations

from collections import Counter

import pytest
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import manual
from taskstream.scheduler.instances import new_instance
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from taskstream.scheduler.verdict import NOT_FINAL
from tests.integration.harness import Harness
from tests.integration.scheduler_cases import DAY0, M0, OVERLAP, make

FRI = 1_780_012_800_000
"""2026-05-29T00:00:00Z, a Friday."""
MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR


@pytest.mark.parametrize("concurrency", ["allow", "replace"])
async def test_a_later_tick_of_a_business_date_is_a_duplicate_of_the_days_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, concurrency: str
) -> None:
    """`{task_id}:{business_date}`: the 01:00 tick makes the day's instance; the 02:00 tick
    finds it. It is not the 02:00 tick's own (made for 01:00), so it is a duplicate, and
    `replace` must not cancel it as the previous run."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: d, agent: echo, schedule: {every: 1h, timezone: UTC}, window: 5m,"
        f" concurrency: {concurrency}, dedupe_key: '{{task_id}}:{{business_date}}'}}\n"
    )
    s = make(h)
    await s.run_pass()
    for hour in (1, 2):
        h.clock.set(FRI + hour * HOUR + 1_000)
        await s.run_pass()
    got = {d.fire_time_ms: d.decision for d in await store.decisions("d", limit=10)}
    assert got == {FRI + HOUR: "should_run", FRI + 2 * HOUR: "skip_duplicated"}
    [row] = await store.list_instances(task_id="d")
    assert (row.scheduled_for_ms, row.status) == (FRI + HOUR, Status.DISPATCHED)


async def test_catch_up_of_a_business_date_records_only_the_ticks_own_instance(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A leader made the 01:00 instance and died before recording it; the next one comes at
    03:30. Only 01:00 ran (`recorded_after_creation`); 02:00 and 03:00 shared its key but
    are not it, so catch-up decides them (`latest`: 03:00 runs into the existing key)."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: d, agent: echo, schedule: {every: 1h, timezone: UTC}, window: 5m,"
        " dedupe_key: '{task_id}:{business_date}', catchup: {max_delay: 6h}}\n"
    )
    await make(h).run_pass()
    [spec] = await h.definitions()
    made = await h.outbox.emit(new_instance(spec, FRI + HOUR), now_ms=h.clock.now_ms())
    h.clock.set(FRI + 3 * HOUR + 30 * MIN)
    await make(h).run_pass()
    got = {
        (d.fire_time_ms - FRI) // HOUR: (d.decision, d.details.get("recorded_after_creation"))
        for d in await store.decisions("d", limit=10)
    }
    assert got[1] == ("should_run", True)
    assert got[2] == ("coalesced", None)
    assert got[3] == ("skip_duplicated", None)
    assert [r.id for r in await store.list_instances(task_id="d")] == [made.instance_id]


async def test_a_tick_of_a_task_sharing_its_key_with_another_is_a_duplicate(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tasks `a` and `b` use the same `dedupe_key` (no `{task_id}`), so one instance runs per
    fire time. The task whose tick finds the other's instance records `skip_duplicated`, not
    a run of its own that names the other task's instance."""
    h = Harness(store, redis, keys, FixedClock(M0 - 1))
    await h.apply(
        "tasks:\n"
        "  - {id: a, agent: echo, schedule: {every: 1m}, dedupe_key: 'report:{scheduled_for}'}\n"
        "  - {id: b, agent: echo, schedule: {every: 1m}, dedupe_key: 'report:{scheduled_for}'}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(M0 + 100)
    await s.run_pass()
    [row] = await store.list_instances(limit=10)
    other = "b" if row.task_id == "a" else "a"
    [mine] = [d for d in await store.decisions(row.task_id, limit=10) if d.fire_time_ms == M0]
    [theirs] = [d for d in await store.decisions(other, limit=10) if d.fire_time_ms == M0]
    assert (mine.decision, mine.instance_id) == ("should_run", row.id)
    assert theirs.decision == "skip_duplicated"
    assert "recorded_after_creation" not in theirs.details


async def test_a_tick_that_ran_unrecorded_before_a_long_outage_is_not_called_missed(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A pass made the M0 tick's instance and stopped before recording it; then no scheduler
    ran for three hours (about 170 fire times before the catch-up horizon, so the outage is
    summarised in one `missed` record). M0 ran: it is recorded `should_run` with its
    instance, and the summary starts after it."""
    text = (
        "tasks:\n  - {id: job, agent: echo, schedule: {every: 1m}, window: 30s,"
        " catchup: {max_delay: 10m}}\n"
    )
    h = Harness(store, redis, keys, FixedClock(M0 - 1_000))
    await h.apply(text)
    await make(h).run_pass()
    h.clock.set(M0 + 100)
    row = await h.trigger(text, "job", M0)
    h.clock.set(M0 + 3 * HOUR + 100)
    await make(h).run_pass()
    decided = await store.decisions("job", since_ms=M0, limit=5)
    [at_m0] = [d for d in decided if d.fire_time_ms == M0]
    assert (at_m0.decision, at_m0.instance_id) == ("should_run", row.id)
    [summary] = [d for d in decided if d.decision == "missed"]
    assert summary.fire_time_ms == M0 + MIN


@pytest.mark.parametrize("restart", [False, True])
async def test_an_operators_run_at_a_fire_time_does_not_decide_the_tick(
    store: SqlStore, redis: streams.Redis, keys: Keys, restart: bool
) -> None:
    """An operator runs the US variant of the coming tick by hand (its own dedupe key); the
    tick still makes its EU instance, whether or not the scheduler restarted in between (a
    restarted one reads the decisions back, the operator's row among them)."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: r, agent: echo, schedule: {every: 1h}, window: 5m,"
        " dedupe_key: '{task_id}:{scheduled_for}:{payload.region}', payload: {region: eu}}\n"
    )
    s = make(h)
    await s.run_pass()
    [spec] = await h.definitions()
    now = h.clock.now_ms()
    await manual.trigger(h.outbox, spec, now_ms=now, payload={"region": "us"}, at_ms=FRI + HOUR)
    if restart:
        s = make(h)
    h.clock.set(FRI + HOUR + 1_000)
    await s.run_pass()
    rows = await store.list_instances(task_id="r")
    assert sorted(r.payload["region"] for r in rows) == ["eu", "us"]


@pytest.mark.parametrize(
    "calendar", ["{allow_weekend: false}", "{exclude_dates: [2026-05-30, 2026-05-31]}"]
)
async def test_latest_does_not_coalesce_into_an_on_time_tick_the_calendar_skips(
    store: SqlStore, redis: streams.Redis, keys: Keys, calendar: str
) -> None:
    """A nightly run at 23:55 UTC; the scheduler is down from Friday 23:00 to Monday 00:01.
    Sunday 23:55 is on time but skipped by the calendar, so it cannot stand for Friday's
    missed tick: Friday 23:55 (within `max_delay`) runs."""
    h = Harness(store, redis, keys, FixedClock(FRI + 23 * HOUR))
    await h.apply(
        "tasks:\n  - {id: t, agent: echo, schedule: {cron: '55 23 * * *', timezone: UTC},"
        f" window: 10m, calendar: {calendar}, catchup: {{mode: latest, max_delay: 3d}}}}\n"
    )
    s = make(h)
    await s.run_pass()
    h.clock.set(FRI + 3 * DAY + MIN)
    await s.run_pass()
    got = {d.fire_time_ms: d.decision for d in await store.decisions("t", limit=10)}
    friday, saturday, sunday = (FRI + d * DAY + 23 * HOUR + 55 * MIN for d in range(3))
    assert got == {friday: "should_run", saturday: "skip_calendar", sunday: "skip_calendar"}
    assert [r.scheduled_for_ms for r in await store.list_instances(task_id="t")] == [friday]


@pytest.mark.parametrize(
    ("task", "successor_ms"),
    [
        # In the tick's window (1h) the successor decides it again.
        ("schedule: {every: 1m}, window: 1h", FRI + 2_000),
        # After the window (5m) closed, within catchup.max_delay (1h): a catch-up tick.
        (
            "schedule: {every: 1h}, window: 5m, catchup: {only_if_ready: true}",
            FRI + 30 * MIN,
        ),
    ],
)
async def test_a_tick_whose_own_instance_exists_unrecorded_is_not_recorded_skipped(
    store: SqlStore, redis: streams.Redis, keys: Keys, task: str, successor_ms: int
) -> None:
    """A leader decided `should_run`, created the instance and stopped before recording it;
    its successor decides the tick again, in its window or (later) as a catch-up tick under
    `only_if_ready`, and a precondition now fails. The instance exists and runs: the record
    says the tick ran, naming it, not `skip_dep`."""
    gate = {"result": "pass"}

    async def check(task_id: str, business_date: str) -> str:
        return gate["result"]

    h = Harness(store, redis, keys, FixedClock(FRI - 1))
    await h.apply(f"tasks:\n  - {{id: g, agent: echo, {task}, preconditions: [gate]}}\n")
    await Scheduler(store, h.outbox, h.clock, SchedulerConfig(), checks={"gate": check}).run_pass()
    [spec] = await h.definitions()
    h.clock.set(FRI + 1_000)
    made = await h.outbox.emit(new_instance(spec, FRI), now_ms=h.clock.now_ms())
    gate["result"] = "fail"
    h.clock.set(successor_ms)
    await Scheduler(store, h.outbox, h.clock, SchedulerConfig(), checks={"gate": check}).run_pass()
    [decided] = [d for d in await store.decisions("g", limit=10) if d.fire_time_ms == FRI]
    assert (decided.decision, decided.instance_id) == ("should_run", made.instance_id)
    assert decided.details["recorded_after_creation"] is True


async def test_ticks_waiting_when_a_long_outage_began_get_a_final_decision(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Five ticks wait for a marker; the scheduler is then down for 3 h, past the catch-up
    horizon (1 h), with more than 100 fire times in between (summarised in one `missed`).
    Each waiting tick still ends as its window's close would have ended it, `skip_dep`, and
    the summary names a tick that was not waiting."""
    h = Harness(store, redis, keys, FixedClock(FRI - 1))
    await h.apply(
        "tasks:\n  - {id: w, agent: echo, schedule: {every: 1m}, window: 10m,"
        " depends_on: [raw.ready]}\n"
    )
    s = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    await s.run_pass()
    for m in range(5):
        h.clock.set(FRI + m * MIN + 100)
        await s.run_pass()
    h.clock.set(FRI + 3 * HOUR)
    await Scheduler(store, h.outbox, h.clock, SchedulerConfig()).run_pass()
    last: dict[int, str] = {}
    for row in await store.decisions("w", since_ms=FRI, limit=200):
        last[(row.fire_time_ms - FRI) // MIN] = row.decision
    assert [last[m] for m in range(5)] == ["skip_dep"] * 5
    assert last[5] == "missed"


async def test_a_stored_precondition_no_module_provides_is_logged_once_per_load(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Definitions stored without the check (e.g. before its module was removed): the
    scheduler names them when it loads the definitions, not on every pass."""

    async def check(task_id: str, business_date: str) -> str:
        return "pass"

    h = Harness(store, redis, keys, FixedClock(FRI - 1))
    await h.apply(
        "tasks:\n  - {id: g, agent: echo, schedule: {every: 1m}, preconditions: [gate, feed]}\n"
        "  - {id: k, agent: echo, schedule: {every: 1m}, preconditions: [gate]}\n"
    )
    scheduler = Scheduler(store, h.outbox, h.clock, SchedulerConfig(), checks={"gate": check})
    with capture_logs() as logs:
        await scheduler.run_pass()
        h.clock.advance(60_000)
        await scheduler.run_pass()
    unknown = [
        (e["task_id"], e["names"]) for e in logs if e["event"] == "task.precondition_unknown"
    ]
    assert unknown == [("g", ["feed"])]


async def test_replace_cancels_every_earlier_run_still_active(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The 1-minute tick's run and an operator's run are both still active when the 2-minute
    tick fires: `replace` cancels both, so the new run is the only one left going."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(OVERLAP.format(policy="replace"))
    s = make(h)
    await s.run_pass()
    h.clock.advance(MIN)
    await s.run_pass()
    [spec] = await h.definitions()
    h.clock.advance(5_000)
    by_hand = await manual.trigger(h.outbox, spec, now_ms=h.clock.now_ms())
    h.clock.advance(MIN - 5_000)
    await s.run_pass()
    rows = {r.id: r for r in await store.list_instances(task_id="job")}
    [new] = [r for r in rows.values() if r.scheduled_for_ms == M0 + 2 * MIN]
    [scheduled] = [r for r in rows.values() if r.scheduled_for_ms == M0 + MIN]
    cancelled = [scheduled.id, by_hand.instance_id]
    assert {i: (rows[i].status, rows[i].fail_class) for i in cancelled} == dict.fromkeys(
        cancelled, (Status.FAILED, FailClass.REPLACED)
    )
    assert new.status is Status.DISPATCHED
    [last] = (await store.decisions("job"))[-1:]
    assert (last.decision, last.details["replace"]) == ("should_run", cancelled)


async def test_replace_cancels_every_earlier_run_however_many(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """15 earlier runs are still active (a backfill of 15 past minutes, say): more than the
    10 active runs a tick reads otherwise. `replace` cancels all 15."""
    h = Harness(store, redis, keys, FixedClock(M0 - 1))
    await h.apply(OVERLAP.format(policy="replace"))
    [spec] = await h.definitions()
    for k in range(15, 0, -1):
        await manual.trigger(h.outbox, spec, now_ms=M0 - 1, at_ms=M0 - k * MIN)
    s = make(h)
    await s.run_pass()
    h.clock.set(M0 + 1_000)
    await s.run_pass()
    rows = await store.list_instances(task_id="job", limit=100)
    earlier = [r for r in rows if r.scheduled_for_ms < M0]
    assert len(earlier) == 15
    assert {(r.status, r.fail_class) for r in earlier} == {(Status.FAILED, FailClass.REPLACED)}


WAITING = (
    "tasks:\n  - {id: r, agent: echo, schedule: {every: 1m, timezone: UTC}, window: 3h,"
    " depends_on: [raw.ready], catchup: {max_delay: 1h}}\n"
)
WAIT = DAY0 - MIN
"""A fire time of `WAITING` whose business date's marker never comes."""


async def _waiting_while_170_ran(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> tuple[Harness, Scheduler]:
    """`WAITING` applied; tick `WAIT` waits (its window is 3 h) while the 170 ticks after it,
    whose marker is set, run: the cursor stays before `WAIT`."""
    h = Harness(store, redis, keys, FixedClock(WAIT - 1_000))
    await h.apply(WAITING)
    await store.mark_ready("raw.ready", "2026-05-29")
    s = make(h)
    await s.run_pass()
    h.clock.set(WAIT + 2 * HOUR + 50 * MIN)
    await s.run_pass()
    return h, s


async def test_a_tick_that_waited_through_a_long_outage_gets_one_final_decision(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """Tick W waits for a marker that never comes while the ticks after it run; then no
    scheduler runs for hours. W's wait ends `skip_dep`; the outage's `missed` summary names
    no tick that already has a final decision (here every tick before the horizon has one,
    so there is none)."""
    h, s = await _waiting_while_170_ran(store, redis, keys)
    h.clock.set(WAIT + 8 * HOUR)
    await s.run_pass()
    decided = await store.decisions("r", since_ms=0, limit=100_000)
    finals = Counter(d.fire_time_ms for d in decided if d.decision not in NOT_FINAL)
    assert [d.decision for d in decided if d.fire_time_ms == WAIT] == ["wait_dep", "skip_dep"]
    assert {f: n for f, n in finals.items() if n > 1} == {}


async def test_a_tick_that_ran_past_the_first_page_is_not_called_missed(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A waiting tick held the cursor while the 170 ticks after it were decided; a pass then
    made the next tick's instance and stopped before recording it; then a long outage. That
    tick ran, more than 101 fire times past the cursor: it is recorded `should_run`, and the
    outage's summary starts after it."""
    h, _ = await _waiting_while_170_ran(store, redis, keys)
    ran = WAIT + 171 * MIN
    h.clock.set(ran + 100)
    row = await h.trigger(WAITING, "r", ran)
    h.clock.set(WAIT + 8 * HOUR)
    await make(h).run_pass()
    decided = await store.decisions("r", since_ms=ran, limit=5)
    assert [(d.decision, d.instance_id) for d in decided if d.fire_time_ms == ran] == [
        ("should_run", row.id)
    ]
    [summary] = [d for d in decided if d.decision == "missed"]
    assert summary.fire_time_ms == ran + MIN
