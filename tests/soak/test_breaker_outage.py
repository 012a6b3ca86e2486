"""Issue #5's breaker must-show, on a real cluster: an upstream that fails for 30 s and then
recovers.

A loopback upstream answers 503 for the first `DOWN_MS` of the run and 200 afterwards, logging
every arrival. Three `http` tasks call it every second as upstream `api`, run by a scheduler,
a sweeper and two executors as real processes with the default `BreakerConfig` (the one the
role processes use: 5 consecutive failures open it, 30 s cool-down, 1 probe). The test watches
the breaker's Redis hash, lets the outage pass and the cluster run on, pauses the tasks, waits
until every instance has settled, then checks from the arrival log, the breaker states and the
store that:

- the breaker opened once the threshold of failures had arrived (plus at most the calls that
  were in flight), and closed on the first probe after the upstream recovered;
- while it was open the upstream received no call but the configured probes (calls admitted
  just before it opened may still arrive in its first `SLACK_MS`);
- the scheduler held ticks back as `deferred` decisions naming `api`, and created no instance
  while the breaker was open;
- every instance created reached SUCCESS: none FAILED, none lost (the instances in the store
  are exactly those the decision log created).

Why `max_attempts: 5` cannot be exhausted by the outage: an attempt is spent only by a failure
recorded while the breaker is closed and does not open it. The breaker opens at the 5th
consecutive failure, and that failure, a failed probe, and a failure of a call in flight when
it opened all defer the run until the cool-down ends (`UpstreamOutage`) without spending one,
as do the admissions an open breaker refuses. So at most 4 attempts are spent in the whole
cluster before the breaker opens, and any one instance has at least one attempt left for the
call that succeeds.
"""

from __future__ import annotations

import json
import time

import pytest

from taskstream.core.states import Status
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers
from tests.fault.conftest import Cluster, RecordProperty, Role
from tests.soak.outage_cluster import BreakerWatch, Ledger, ledger, redis_offset_ms, unsettled
from tests.soak.outage_timeline import OpenPeriod, failed_before, open_periods, shifted
from tests.support.outage_upstream import DOWN, UP, Arrival, OutageUpstream, wall_ms

DOWN_MS = 30_000
"""How long the upstream fails, from the moment the cluster is ready (ms)."""
CFG = BreakerConfig()
"""The breaker configuration the role processes run with (cli/roles.py passes none)."""
TASK_IDS = ("poll-a", "poll-b", "poll-c")
MAX_ATTEMPTS = 5
EXECUTORS = 2
IN_FLIGHT = EXECUTORS * 4
"""Most calls the executors can have in flight at once (default concurrency 4 each)."""
SLACK_MS = 1_000
"""Arrivals this long after the breaker opened may be calls admitted before it opened."""
RUN_ON_CALLS = 9
"""Successful calls to see after the breaker closed before the tasks are paused."""


def tasks(url: str) -> str:
    """Three tasks calling `url` every second as upstream `api`; ticks held longer than their
    5 s window coalesce into the newest (catch-up `latest`)."""
    specs = [
        f"""
  - id: {task_id}
    agent: http
    schedule: {{every: 1s}}
    window: 5s
    upstreams: [api]
    retry: {{max_attempts: {MAX_ATTEMPTS}, backoff: {{base: 1s, factor: 2, max: 8s}}, jitter: 0.2}}
    payload: {{url: "{url}/{task_id}", timeout: 5}}"""
        for task_id in TASK_IDS
    ]
    return "tasks:" + "".join(specs) + "\n"


async def start_cluster(cluster: Cluster, url: str) -> Role:
    """Store the tasks, start every role and wait until all are ready; returns the scheduler."""
    await cluster.apply(tasks(url))
    scheduler = cluster.start("scheduler")
    cluster.start("sweeper")
    for _ in range(EXECUTORS):
        cluster.start("executor")
    await cluster.ready()
    return scheduler


async def ride_out(cluster: Cluster, upstream: OutageUpstream, watch: BreakerWatch) -> None:
    """Wait until the breaker has opened and closed again, then for `RUN_ON_CALLS` successful
    calls after that."""

    async def opened_and_closed() -> bool:
        return watch.closed_after_open()

    await cluster.until(
        opened_and_closed,
        timeout_s=(DOWN_MS + CFG.cooldown_ms) / 1000 + 45,
        what="breaker opened, then closed",
    )

    async def ran_on() -> bool:
        return sum(a.status == UP for a in upstream.arrivals) >= RUN_ON_CALLS

    await cluster.until(ran_on, timeout_s=30, what=f"{RUN_ON_CALLS} calls answered after recovery")


async def pause_and_drain(cluster: Cluster, scheduler: Role) -> None:
    """Pause the tasks, wait until the scheduler has loaded that (no tick is decided after),
    then until every instance has settled and the streams are empty. Runs deferred while the
    breaker was half-open wait out the probe timeout (60 s) before they are retried."""
    loads = len(scheduler.logged("scheduler.definitions_loaded"))
    for task_id in TASK_IDS:
        assert await cluster.store.set_paused(task_id, True)

    async def reloaded() -> bool:
        return len(scheduler.logged("scheduler.definitions_loaded")) > loads

    await cluster.until(reloaded, timeout_s=15, what="scheduler saw the pause")

    async def settled() -> bool:
        return await unsettled(cluster.store, TASK_IDS) == 0

    await cluster.until(
        settled, timeout_s=CFG.probe_timeout_ms / 1000 + 30, what="every instance settled"
    )
    await cluster.drained()


@pytest.mark.fault
@pytest.mark.timeout(240)
async def test_an_outage_opens_the_breaker_and_loses_no_instance(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    started = time.monotonic()
    async with OutageUpstream() as upstream:
        scheduler = await start_cluster(cluster, upstream.url("").rstrip("/"))
        offset_ms = await redis_offset_ms(cluster.redis)
        db_offset_ms = await cluster.store.db_now_ms() - wall_ms()
        recovers_ms = upstream.start_outage(DOWN_MS) + offset_ms
        watch = BreakerWatch(RedisBreakers(cluster.redis, cluster.keys), "api")
        async with watch.running():
            await ride_out(cluster, upstream, watch)
            await pause_and_drain(cluster, scheduler)
    arrivals = shifted(upstream.arrivals, offset_ms)
    periods = open_periods(watch.seen, arrivals, CFG, SLACK_MS)
    books = await ledger(cluster.store, TASK_IDS, "api")

    report(record_property, periods, books, recovers_ms - DOWN_MS, time.monotonic() - started)
    check_breaker(periods, arrivals, recovers_ms)
    check_holds(books, periods, offset_ms - db_offset_ms)
    check_instances(books)


def check_breaker(periods: list[OpenPeriod], arrivals: list[Arrival], recovers_ms: int) -> None:
    """Opened after the threshold; nothing but probes while open; closed after recovery."""
    assert periods, "the breaker never opened"
    first, last = periods[0], periods[-1]
    failed = failed_before(arrivals, first.opened_ms)
    assert CFG.failure_threshold <= failed <= CFG.failure_threshold + IN_FLIGHT, failed
    for period in periods:
        assert not period.while_open, f"calls while open: {period.while_open}"
        assert len(period.in_flight) <= IN_FLIGHT, period.in_flight
        assert len(period.probes) <= CFG.probes, f"more calls than probes: {period.probes}"
    assert all(not p.closed for p in periods[:-1]), "closed, then opened again"
    assert last.closed and last.resolved_ms is not None, "the breaker did not close"
    assert last.resolved_ms >= recovers_ms, "closed before the upstream recovered"
    assert [a.status for a in last.probes] == [UP] * CFG.probes, last.probes
    assert all(a.status == DOWN for p in periods[:-1] for a in p.probes)
    after = [a for a in arrivals if a.at_ms >= last.resolved_ms]
    assert after and all(a.status == UP for a in after)


def check_holds(books: Ledger, periods: list[OpenPeriod], db_to_redis_ms: int) -> None:
    """Ticks were held back as `deferred` naming `api`, only while the breaker was open, and
    no instance was created while it was open. Decision times are on the scheduler's clock
    (aligned to the database's), so each side of an open period has `SLACK_MS` of play."""
    assert books.held, "no tick was held back"
    assert all("api" in d.reason for d in books.held)

    def during(decided_at_ms: int, start_ms: int, end_ms: int) -> bool:
        return start_ms <= decided_at_ms + db_to_redis_ms <= end_ms

    for held in books.held:
        assert any(
            during(held.decided_at_ms, p.opened_ms - SLACK_MS, p.probe_from_ms + SLACK_MS)
            for p in periods
        ), f"held outside an open period: {held}"
    for p in periods:
        start, end = p.opened_ms + SLACK_MS, p.probe_from_ms - SLACK_MS
        made = [d for d in books.created if during(d.decided_at_ms, start, end)]
        assert not made, f"instances created while open: {made}"


def check_instances(books: Ledger) -> None:
    """Every instance created reached SUCCESS within its attempts; none lost."""
    assert books.instances, "no instance was created"
    assert set(books.instances) == books.decided, "instances and decision log disagree"
    assert books.by_status() == {Status.SUCCESS: len(books.instances)}, books.by_status()
    assert max(books.attempts.values()) <= MAX_ATTEMPTS
    assert books.reasons.get("retriable_error", 0) <= CFG.failure_threshold - 1, books.reasons


def report(
    record: RecordProperty,
    periods: list[OpenPeriod],
    books: Ledger,
    start_ms: int,
    duration_s: float,
) -> None:
    """The measured timeline (s after the outage began) in the test's report, and printed."""

    def at(ms: int | None) -> float | None:
        return None if ms is None else round((ms - start_ms) / 1000, 3)

    measured = {
        "opened_at_s": [at(p.opened_ms) for p in periods],
        "probes_at_s": [[at(a.at_ms) for a in p.probes] for p in periods],
        "closed_at_s": at(periods[-1].resolved_ms),
        "calls_while_open": sum(len(p.while_open) for p in periods),
        "calls_in_flight_at_open": sum(len(p.in_flight) for p in periods),
        "instances": len(books.instances),
        "by_status": {str(k): v for k, v in books.by_status().items()},
        "attempts_max": max(books.attempts.values()),
        "run_ends": books.reasons,
        "held_decisions": len(books.held),
        "coalesced": books.coalesced,
        "duration_s": round(duration_s, 1),
    }
    for key, value in measured.items():
        record(key, value)
    print("breaker outage:", json.dumps(measured))
