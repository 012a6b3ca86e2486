"""Intake and the definitions cache: a run gets its task's spec even when the task was applied
after the executor's last look at the definitions."""

from __future__ import annotations

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.executor.intake import Intake
from tests.integration.harness import Harness

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
    intake = Intake(
        h.store,
        h.redis,
        h.keys,
        default_registry(h.registry_modules),
        defs,
        "c1",
        held=lambda _i, _t: False,
    )
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
    intake = Intake(
        h.store,
        h.redis,
        h.keys,
        default_registry(h.registry_modules),
        defs,
        "c1",
        held=lambda _i, _t: False,
    )
    row = await h.trigger(RETRIED, "fresh", fire_ms=h.clock.now_ms())
    deliveries = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await intake.admit(deliveries)
    assert (run.spec, row.max_attempts, run.max_attempts) == (None, 3, 3)
