"""Hosts cut off from Redis and the database by a network partition (Linux network
namespaces, root only): the roles on the other side take their work over within the recovery
bound, the cut-off ones are fenced when the partition heals, and go on serving.

The hosts, Redis and the forwarders are those of this directory's conftest. A
partition takes the host's link down (`cut`), or keeps it up and sends every frame nowhere
(`drop`): no reset either way, open connections hang, and their bytes are delivered once the
partition heals.

Run with `scripts/fault -k partition` (root, with `ip`; skipped otherwise). The measured times
(takeover after the cut, fencing and first new run after the heal, the standby's first fire)
are recorded as properties of each test's report.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import sys
import time

import pytest

from taskstream.core import streams
from taskstream.core.states import Status
from tests.fault.conftest import (
    ROOT,
    Cluster,
    RecordProperty,
    owner_pid,
    rows_to,
    running_rows,
)
from tests.fault.partition.conftest import (
    DATABASE,
    MARKS,
    assert_taken_over,
    exited,
    fenced,
    first_claim,
    partition,
    serves_alone,
    start_on,
    taken_over,
)
from tests.support.forwarder import Forwarder
from tests.support.netns import Host

log = logging.getLogger(__name__)

pytestmark = MARKS

RECOVERY_LIMIT_MS = 15_000
LEASE_MS = 10_000

WORK = """
tasks:
  - id: slow
    agent: slow
    payload: {seconds: 8}
  - id: quick
    agent: echo
"""
LONG = """
tasks:
  - id: long
    agent: slow
    payload: {seconds: 16}
"""
TICKS = """
tasks:
  - id: tick
    agent: echo
    schedule: {every: 1s}
    window: 1m
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["cut", "drop"])
async def test_an_executor_cut_off_mid_run_is_taken_over_then_fenced_and_serves_again(
    cluster: Cluster,
    two_hosts: list[Host],
    database_forwarder: int,
    record_property: RecordProperty,
    how: str,
) -> None:
    await cluster.apply(WORK)
    cluster.start("scheduler")
    cluster.start("sweeper")
    on_host = {start_on(cluster, h, database_forwarder, "executor").pid: h for h in two_hosts}
    await cluster.ready()
    instance = await cluster.emit("slow")
    victim, survivor = await first_claim(cluster, instance)

    partition(on_host[victim.pid], how)
    cut_ms = time.time() * 1000
    rerun, recovery_ms = await taken_over(cluster, instance, cut_ms)
    record_property("partition_recovery_ms", recovery_ms)
    log.info("partition.recovered recovery_ms=%d", recovery_ms)
    await cluster.reach(instance, Status.SUCCESS, Status.FAILED, timeout_s=30)

    on_host[victim.pid].heal()
    healed_ms = time.time() * 1000
    await fenced(cluster, victim, instance, timeout_s=45)
    record_property("partition_fenced_after_heal_ms", round(time.time() * 1000 - healed_ms))

    history = await cluster.store.history(instance)
    assert rerun.owner == survivor.consumer
    assert recovery_ms <= RECOVERY_LIMIT_MS, f"taken over {recovery_ms} ms after the cut"
    assert [h.owner for h in running_rows(history)] == [victim.consumer, survivor.consumer]
    await assert_taken_over(cluster, instance, victim, survivor, "owner_lost")

    # The cut-off executor serves again: with the other one stopped, new work is its own.
    await serves_alone(cluster, victim, survivor)
    record_property("partition_served_after_heal_ms", round(time.time() * 1000 - healed_ms))
    assert victim.alive
    assert len(rows_to(await cluster.store.history(instance), Status.SUCCESS)) == 1
    await cluster.drained()


@pytest.mark.timeout(150)
async def test_an_executor_cut_off_from_redis_alone_is_fenced_by_the_store(
    cluster: Cluster,
    two_hosts: list[Host],
    database_forwarder: int,
    redis_forwarders: dict[str, Forwarder],
    record_property: RecordProperty,
) -> None:
    """Redis and the database on different sides of a partition: the executor that still
    reaches the store but not Redis is taken for lost (its liveness key expires), and its late
    commit, which does reach the store during the partition, is fenced there."""
    await cluster.apply(LONG)
    cluster.start("scheduler")
    cluster.start("sweeper")
    on_host = {
        start_on(cluster, h, database_forwarder, "executor", redis_forwarders[h.netns].port).pid: h
        for h in two_hosts
    }
    await cluster.ready()
    instance = await cluster.emit("long")
    victim, survivor = await first_claim(cluster, instance)
    cut_off = redis_forwarders[on_host[victim.pid].netns]

    cut_off.blackhole()
    cut_ms = time.time() * 1000
    _, recovery_ms = await taken_over(cluster, instance, cut_ms)
    record_property("redis_partition_recovery_ms", recovery_ms)
    await fenced(cluster, victim, instance, timeout_s=40)
    await cluster.reach(instance, Status.SUCCESS, Status.FAILED, timeout_s=40)
    cut_off.restore()

    assert recovery_ms <= RECOVERY_LIMIT_MS, f"taken over {recovery_ms} ms after the cut"
    await assert_taken_over(cluster, instance, victim, survivor, "owner_lost")
    assert victim.alive
    await cluster.drained()


@pytest.mark.timeout(150)
async def test_a_row_lock_left_by_a_cut_off_host_does_not_hold_up_the_takeover(
    cluster: Cluster,
    two_hosts: list[Host],
    database_forwarder: int,
    record_property: RecordProperty,
) -> None:
    """A session of the cut-off host has the run's row locked, its transaction open (as a role
    cut off between two statements would): the server ends it after the idle transaction
    bound, so the takeover still comes within the recovery bound, not after the lock wait."""
    await cluster.apply(WORK)
    cluster.start("scheduler")
    cluster.start("sweeper")
    on_host = {start_on(cluster, h, database_forwarder, "executor").pid: h for h in two_hosts}
    await cluster.ready()
    instance = await cluster.emit("slow")
    victim, _ = await first_claim(cluster, instance)
    host = on_host[victim.pid]
    db_url = host.url(cluster.env[DATABASE], database_forwarder)
    locker = await asyncio.create_subprocess_exec(
        *host.wrap([sys.executable, "-m", "tests.support.row_lock", db_url, instance]),
        cwd=ROOT,
        env=cluster.env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert locker.stdout is not None
        assert await asyncio.wait_for(locker.stdout.readline(), timeout=30) == b"locked\n"
        host.cut()
        cut_ms = time.time() * 1000
        _, recovery_ms = await taken_over(cluster, instance, cut_ms)
        record_property("partition_locked_recovery_ms", recovery_ms)
        log.info("partition.locked_recovered recovery_ms=%d", recovery_ms)
        assert recovery_ms <= RECOVERY_LIMIT_MS, f"taken over {recovery_ms} ms after the cut"
        await cluster.reach(instance, Status.SUCCESS, Status.FAILED, timeout_s=30)
    finally:
        if locker.returncode is None:
            locker.kill()
        await locker.wait()
    history = await cluster.store.history(instance)
    [success] = rows_to(history, Status.SUCCESS)
    assert success.attempt == 2 and success.owner != victim.consumer


@pytest.mark.timeout(150)
async def test_a_leader_cut_off_is_replaced_and_no_fire_time_runs_twice(
    cluster: Cluster,
    two_hosts: list[Host],
    database_forwarder: int,
    record_property: RecordProperty,
) -> None:
    """Cut off with its link up (`drop`): its store calls hang rather than fail at once, the
    harder case for a leader (a link taken down behaves the same, each call failing sooner)."""
    await cluster.apply(TICKS)
    on_host = {start_on(cluster, h, database_forwarder, "scheduler").pid: h for h in two_hosts}
    await cluster.ready()
    first, second = cluster.roles

    async def leader_pid() -> int | None:
        raw = await cluster.redis.get(cluster.keys.leader)
        return owner_pid(streams.as_text(raw).rpartition("|")[0]) if raw else None

    async def fires() -> list[int]:
        rows = await cluster.store.list_instances(task_id="tick", limit=10_000)
        return sorted(r.scheduled_for_ms for r in rows)

    async def ticks_after(at_ms: int, n: int) -> bool:
        return len([f for f in await fires() if f > at_ms]) >= n

    pid = await cluster.until(leader_pid, timeout_s=30, what="a leader")
    leader, standby = (first, second) if first.pid == pid else (second, first)
    await cluster.until(lambda: ticks_after(0, 3), timeout_s=30, what="ticks while leading")

    on_host[leader.pid].drop()
    cut_ms = await cluster.store.db_now_ms()

    async def standby_leads() -> bool:
        return await leader_pid() == standby.pid

    await cluster.until(standby_leads, timeout_s=LEASE_MS / 1000 + 20, what="standby leads")
    rows = await cluster.until(
        lambda: _created_after(cluster, cut_ms), timeout_s=30, what="a tick after the cut"
    )
    takeover_ms = min(rows) - cut_ms
    record_property("partition_standby_first_fire_ms", takeover_ms)
    log.info("partition.standby_first_fire after_ms=%s", takeover_ms)
    assert takeover_ms <= LEASE_MS + 5_000

    on_host[leader.pid].heal()
    healed_ms = await cluster.store.db_now_ms()
    await cluster.until(
        lambda: ticks_after(healed_ms + 5_000, 1), timeout_s=30, what="ticks after the heal"
    )
    assert await leader_pid() == standby.pid

    # The cut-off scheduler stands by again: stopping the leader hands it the lease.
    standby.send(signal.SIGTERM)
    await cluster.until(lambda: exited(standby), timeout_s=30, what="new leader stopped")

    async def old_leads_again() -> bool:
        return await leader_pid() == leader.pid

    await cluster.until(old_leads_again, timeout_s=LEASE_MS / 1000 + 20, what="old leader back")
    back_ms = await cluster.store.db_now_ms()
    await cluster.until(lambda: ticks_after(back_ms, 2), timeout_s=30, what="ticks once back")

    fired = await fires()
    assert len(fired) == len(set(fired)), "a fire time ran twice"
    gaps = [b - a for a, b in itertools.pairwise(fired) if b - a != 1000]
    assert gaps == [], f"fire times missing between {fired[0]} and {fired[-1]}"


async def _created_after(cluster: Cluster, at_ms: int) -> list[int] | None:
    rows = await cluster.store.list_instances(task_id="tick", limit=10_000)
    return [r.created_at_ms for r in rows if r.scheduled_for_ms > at_ms] or None
