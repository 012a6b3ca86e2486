"""An executor cut off from the database alone (Linux network namespaces, root only): it still
reaches Redis, so its liveness key stays fresh, but it can neither extend its lease nor commit.
Its run is timed out once the lease lapses, the executor on the other host re-runs it, and the
cut-off one's late commit is fenced when the partition heals; then it serves again.

Run with `scripts/fault -k partition` (root, with `ip`; skipped otherwise). The measured
takeover time is recorded as a property of the test's report.
"""

from __future__ import annotations

import logging
import time

import pytest

from taskstream.core.reasons import LEASE_EXPIRED
from taskstream.core.states import Status
from tests.fault.conftest import Cluster, RecordProperty, rows_to, running_rows
from tests.fault.partition.conftest import (
    MARKS,
    assert_taken_over,
    fenced,
    first_claim,
    serves_alone,
    start_on,
    taken_over,
)
from tests.support.forwarder import Forwarder
from tests.support.netns import Host

log = logging.getLogger(__name__)

pytestmark = MARKS

LEASE_MS = 12_000
TAKEOVER_LIMIT_MS = LEASE_MS + 8_000
"""The lease, then a sweep pass (2 s), the retry's backoff (1 s, jitter) and a claim."""
WORK = """
tasks:
  - id: long
    agent: slow
    lease: 12s
    payload: {seconds: 20}
  - id: quick
    agent: echo
"""


@pytest.mark.timeout(180)
async def test_an_executor_cut_off_from_the_database_alone_loses_its_run_at_its_lease(
    cluster: Cluster,
    two_hosts: list[Host],
    database_forwarders: dict[str, Forwarder],
    record_property: RecordProperty,
) -> None:
    """Its liveness key alone does not keep the run: the sweeper times it out when its lease
    lapses (`lease_expired`, not `owner_lost`: the owner was seen alive), the other executor
    commits the one SUCCESS, and the late commit, delivered once the link is back, is fenced."""
    await cluster.apply(WORK)
    cluster.start("scheduler")
    cluster.start("sweeper")
    on_host = {
        start_on(cluster, h, database_forwarders[h.netns].port, "executor").pid: h
        for h in two_hosts
    }
    await cluster.ready()
    instance = await cluster.emit("long")
    victim, survivor = await first_claim(cluster, instance)
    cut_off = database_forwarders[on_host[victim.pid].netns]

    cut_off.blackhole()
    cut_ms = time.time() * 1000
    _, takeover_ms = await taken_over(cluster, instance, cut_ms, timeout_s=45)
    record_property("db_partition_takeover_ms", takeover_ms)
    log.info("partition.db_takeover takeover_ms=%d", takeover_ms)
    await cluster.reach(instance, Status.SUCCESS, Status.FAILED, timeout_s=45)

    cut_off.restore()
    healed_ms = time.time() * 1000

    await fenced(cluster, victim, instance, timeout_s=75)
    record_property("db_partition_fenced_after_heal_ms", round(time.time() * 1000 - healed_ms))

    history = await cluster.store.history(instance)
    assert [h.owner for h in running_rows(history)] == [victim.consumer, survivor.consumer]
    await assert_taken_over(cluster, instance, victim, survivor, LEASE_EXPIRED)
    assert takeover_ms <= TAKEOVER_LIMIT_MS, f"taken over {takeover_ms} ms after the cut"

    # The cut-off executor serves again: with the other one stopped, new work is its own.
    await serves_alone(cluster, victim, survivor)
    record_property("db_partition_served_after_heal_ms", round(time.time() * 1000 - healed_ms))
    assert victim.alive
    assert len(rows_to(await cluster.store.history(instance), Status.SUCCESS)) == 1
    await cluster.drained()
