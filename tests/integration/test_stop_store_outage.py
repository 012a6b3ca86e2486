"""A stop during a store outage, on real Redis and a real store: the stopping executor cannot
write the release of a run it cut short (RETRYING, due now, not an attempt), nor the end of a
run that finished, so the run stays RUNNING under its lease. The release is made all the same
once the store answers, by the sweeper, instead of the run being timed out as `owner_lost`,
which would spend an attempt (with `max_attempts: 1`, the instance's only one). A run whose
end was lost is handed back the same way: it runs again (its end, and the side-effect rows
committed with it, were never written), without that attempt counting."""

from __future__ import annotations

from taskstream.core.protocol import GROUP, Priority
from taskstream.core.reasons import OWNER_LOST, RELEASED
from taskstream.core.states import Status
from tests.integration.executor_cases import reach
from tests.integration.harness import Harness
from tests.integration.outages import (
    Gate,
    gated_runner,
    stopped_with_end_refused,
    stopped_with_release_refused,
)


async def test_a_release_the_store_missed_at_stop_is_made_and_the_run_runs_again(
    outage_server: Harness,
) -> None:
    h = outage_server
    gate = Gate()
    instance_id = await stopped_with_release_refused(h, gate)
    await _recovered(h, gate, instance_id)
    history = await h.store.history(instance_id)
    released = [(x.from_status, x.to_status, x.attempt, x.owner, x.reason) for x in history]
    assert (Status.RUNNING, Status.RETRYING, 1, "c1", RELEASED) in released


async def test_a_run_whose_end_the_store_missed_at_stop_runs_again_without_spending_an_attempt(
    outage_server: Harness,
) -> None:
    """The run succeeded, but its end was not written: handed back, it runs again and
    succeeds, where being timed out as `owner_lost` would fail a `max_attempts: 1` task."""
    h = outage_server
    gate = Gate()
    instance_id = await stopped_with_end_refused(h, gate)
    row = await h.store.get_instance(instance_id)
    assert row is not None and (row.status, row.attempt) == (Status.RUNNING, 1)
    await _recovered(h, gate, instance_id)
    [lost] = [x for x in await h.store.history(instance_id) if x.reason == RELEASED]
    assert (lost.from_status, lost.to_status, lost.attempt, lost.owner) == (
        Status.RUNNING,
        Status.RETRYING,
        1,
        "c1",
    )
    assert lost.note is not None and "completed" in lost.note and "store" in lost.note


async def _recovered(h: Harness, gate: Gate, instance_id: str) -> None:
    """Once the store answers again, with `c1`'s liveness key gone: a sweep, a scheduler pass
    and executor `c2` take the instance to SUCCESS at its second attempt, no run counted as
    lost, no entry left pending."""
    assert not await h.redis.exists(h.keys.alive("c1"))
    await h.sweeper().sweep_once()
    await h.scheduler().run_pass()
    gate.release.set()
    again = gated_runner(h, gate, "c2")
    try:
        await reach(h, instance_id, Status.SUCCESS, Status.FAILED)
    finally:
        await again.close()
    row = await h.store.get_instance(instance_id)
    assert row is not None
    assert (row.status, row.fail_class, row.attempt) == (Status.SUCCESS, None, 2)
    history = await h.store.history(instance_id)
    assert all(x.reason != OWNER_LOST for x in history)
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0
