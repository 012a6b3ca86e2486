"""One entry delivered twice (a second copy on the stream, and the pending entry forcibly
claimed by another consumer mid-run): one run, one committed effect, both entries acked."""

from __future__ import annotations

from typing import Any

from taskstream.core.protocol import GROUP, Priority
from taskstream.core.states import Status
from tests.fault.conftest import Cluster, rows_to, running_rows

TASKS = """
tasks:
  - id: effect
    agent: effect
    payload: {seconds: 6, effect: send}
"""


async def test_an_entry_delivered_twice_has_one_committed_effect(cluster: Cluster) -> None:
    await cluster.apply(TASKS)
    cluster.start("sweeper")
    cluster.start("executor")
    cluster.start("executor")
    await cluster.ready()
    stream = cluster.keys.stream(Priority.DEFAULT)
    instance = await cluster.emit("effect")
    first = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 1, what="run claimed"
    )
    holder = cluster.holder(running_rows(first)[0].owner)
    [other] = [r for r in cluster.executors() if r is not holder]

    entries: Any = await cluster.redis.xrange(stream)
    [(original_id, fields)] = entries
    copy_id = await cluster.redis.xadd(stream, fields)

    async def copy_delivered() -> bool:
        rows: Any = await cluster.redis.xpending_range(stream, GROUP, copy_id, copy_id, 1)
        return bool(rows)

    await cluster.until(copy_delivered, timeout_s=20, what="the copy delivered")
    taken: Any = await cluster.redis.xclaim(
        stream, GROUP, other.consumer, 0, [original_id], justid=True
    )
    assert taken == [original_id], "the run ended before the forced claim"

    done = await cluster.reach(instance, Status.SUCCESS, Status.FAILED)
    await cluster.drained()

    history = await cluster.store.history(instance)
    assert [h.owner for h in running_rows(history)] == [holder.consumer]
    [success] = rows_to(history, Status.SUCCESS)
    assert success.owner == holder.consumer
    assert done.result == {"performed": True, "attempt": 1}
    assert await cluster.store.side_effect_done(f"{done.dedupe_key}:send")
    claim_lost = [e for r in cluster.executors() for e in r.logged("instance.claim_lost")]
    assert [e["instance_id"] for e in claim_lost] == [instance]
