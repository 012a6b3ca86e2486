"""An executor that dies (kill -9) or freezes (SIGSTOP) mid-run: the run is taken back and
re-run by another executor, once, with the default liveness TTL and sweep interval."""

from __future__ import annotations

import logging
import signal
import time

from taskstream.core.states import Status
from tests.fault.conftest import Cluster, RecordProperty, rows_to, running_rows

log = logging.getLogger(__name__)

RECOVERY_LIMIT_MS = 15_000

TASKS = """
tasks:
  - id: slow
    agent: slow
    payload: {seconds: 8}
  - id: effect
    agent: effect
    payload: {seconds: 12, effect: send}
"""


async def test_kill_9_mid_task_is_rerun_by_the_other_executor(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    await cluster.apply(TASKS)
    cluster.start("scheduler")
    cluster.start("sweeper")
    cluster.start("executor")
    cluster.start("executor")
    await cluster.ready()
    instance = await cluster.emit("slow")
    first = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 1, what="first run claimed"
    )
    victim = cluster.holder(running_rows(first)[0].owner)
    [survivor] = [r for r in cluster.executors() if r is not victim]
    assert (await cluster.reach(instance, Status.RUNNING)).attempt == 1

    victim.send(signal.SIGKILL)
    killed_ms = time.time() * 1000

    again = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 2, what="re-run claimed"
    )
    rerun = running_rows(again)[1]
    recovery_ms = round(rerun.at_ms - killed_ms)
    record_property("kill9_recovery_ms", recovery_ms)
    log.info("kill9.recovered recovery_ms=%d", recovery_ms)
    await cluster.reach(instance, Status.SUCCESS, Status.FAILED)

    history = await cluster.store.history(instance)
    assert rerun.owner == survivor.consumer
    assert recovery_ms <= RECOVERY_LIMIT_MS, f"re-run started {recovery_ms} ms after the kill"
    [success] = rows_to(history, Status.SUCCESS)
    assert (success.owner, success.attempt) == (survivor.consumer, 2)
    assert [h.reason for h in rows_to(history, Status.TIMEOUT)] == ["owner_lost"]
    assert not victim.alive
    await cluster.drained()


async def test_a_paused_executor_is_fenced_and_does_not_commit_or_ack(cluster: Cluster) -> None:
    await cluster.apply(TASKS)
    cluster.start("scheduler")
    cluster.start("sweeper")
    cluster.start("executor")
    cluster.start("executor")
    await cluster.ready()
    instance = await cluster.emit("effect")
    first = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 1, what="first run claimed"
    )
    claimed = running_rows(first)[0]
    zombie = cluster.holder(claimed.owner)
    [other] = [r for r in cluster.executors() if r is not zombie]
    lease_ms = round(cluster.specs["effect"].effective_lease_s * 1000)

    async def lease_extended() -> bool:
        # Pause only after the first heartbeat wrote its lease extension: a process frozen
        # inside that transaction would hold the row lock for the lock wait timeout.
        row = await cluster.store.get_instance(instance)
        assert row is not None and row.lease_expires_at_ms is not None
        return row.lease_expires_at_ms > claimed.at_ms + lease_ms

    await cluster.until(lease_extended, timeout_s=20, what="first lease extension")
    zombie.send(signal.SIGSTOP)

    await cluster.reach(instance, Status.SUCCESS, Status.FAILED, timeout_s=90)
    zombie.send(signal.SIGCONT)

    async def zombie_done() -> bool:
        return bool(zombie.logged("instance.fenced", instance_id=instance))

    await cluster.until(zombie_done, timeout_s=30, what="zombie run ended fenced")

    history = await cluster.store.history(instance)
    [success] = rows_to(history, Status.SUCCESS)
    assert (success.owner, success.attempt) == (other.consumer, 2)
    assert [h.owner for h in running_rows(history)] == [zombie.consumer, other.consumer]
    assert [h.reason for h in rows_to(history, Status.TIMEOUT)] == ["owner_lost"]
    assert not zombie.logged("instance.committed", instance_id=instance)
    batches = zombie.logged("instances.committed")
    assert not [r for b in batches for r in b["runs"] if r.startswith(f"{instance}@")]
    done = await cluster.store.get_instance(instance)
    assert done is not None and done.result == {"performed": True, "attempt": 2}
    assert await cluster.store.side_effect_done(f"{done.dedupe_key}:send")
    await cluster.drained()
    assert len(rows_to(await cluster.store.history(instance), Status.SUCCESS)) == 1
