"""Intake and the definitions cache: a run gets its task's spec even when the task was applied
after the executor's last look at the definitions."""

from __future__ import annotations

from typing import Any

from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.protocol import Priority
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest
from tests.integration.harness import Harness
from tests.integration.outages import intake_of

RETRIED = """
tasks:
  - id: fresh
    agent: slow
    timeout: 7s
    retry: {max_attempts: 3}
    payload: {seconds: 0}
"""


async def test_a_task_applied_since_the_last_definitions_check_runs_with_its_spec(
    outage: Harness,
) -> None:
    """The executor checks the definitions at most once an hour here; the task is applied
    after its check and its instance read at once. The run still gets the spec (three
    attempts, a 7 s timeout), not the defaults of an unknown task (one attempt)."""
    h = outage
    defs = DefinitionCache(h.store, min_interval_s=3600)
    await defs.refresh()
    intake = intake_of(h, defs)
    await h.apply(RETRIED)
    await h.trigger(RETRIED, "fresh", fire_ms=h.clock.now_ms())
    deliveries = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await intake.admit(deliveries)
    assert run.spec is not None
    assert (run.max_attempts, run.spec.timeout) == (3, 7.0)


async def test_a_run_whose_task_is_not_defined_keeps_the_attempts_stored_with_it(
    outage: Harness,
) -> None:
    """No stored definition names the instance's task: the run's attempt limit is the one its
    row was created with, not one attempt."""
    h = outage
    defs = DefinitionCache(h.store)
    intake = intake_of(h, defs)
    row = await h.trigger(RETRIED, "fresh", fire_ms=h.clock.now_ms())
    deliveries = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await intake.admit(deliveries)
    assert (run.spec, row.max_attempts, run.max_attempts) == (None, 3, 3)


async def test_a_stale_entry_read_after_the_current_one_is_not_the_run(outage: Harness) -> None:
    """One batch holds an instance's current entry (attempt 1) and, after it, a copy of its
    first entry (attempt 0) put back on the stream. The run is the current entry's, and the
    stale one is acked with it rather than left pending."""
    h = outage
    await h.apply(RETRIED)
    defs = DefinitionCache(h.store)
    await defs.refresh()
    row = await h.trigger(RETRIED, "fresh", fire_ms=h.clock.now_ms())
    stream = h.keys.stream(Priority.DEFAULT)
    entries: Any = await h.redis.xrange(stream)
    [(first_id, first_fields)] = entries
    await h.redis.xdel(stream, first_id)
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 0, 30)], owner="gone")
    failed = await h.store.transition(
        row.id,
        Status.RUNNING,
        Status.RETRYING,
        reason="setup",
        attempt=1,
        next_attempt_at_ms=h.clock.now_ms(),
    )
    assert failed.ok
    retrying = await h.store.get_instance(row.id)
    assert retrying is not None
    assert await h.outbox.publish_many([retrying], now_ms=h.clock.now_ms()) == {}
    stale_id = await h.redis.xadd(stream, first_fields)
    deliveries = await streams.read(h.redis, h.keys, "c1", count=10, block_ms=10)
    assert [d.entry_id for d in deliveries][-1] == streams.as_text(stale_id)
    [run] = await intake_of(h, defs).admit(deliveries)
    assert (run.entry.attempt, run.token) == (1, 2)
    assert [d.entry_id for d in run.duplicates] == [streams.as_text(stale_id)]
