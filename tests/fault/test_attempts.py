"""`max_attempts` holds across processes: a task that always fails, with every executor killed
and replaced between its attempts (a sweeper and a scheduler running throughout), runs exactly
`max_attempts` times and fails as exhausted."""

from __future__ import annotations

from collections.abc import Callable

from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from tests.fault.conftest import Cluster, rows_to, running_rows

MAX_ATTEMPTS = 3
EXECUTORS = 2
TASKS = f"""
tasks:
  - id: hopeless
    agent: flaky
    retry: {{max_attempts: {MAX_ATTEMPTS}, backoff: {{base: 2s, factor: 1}}, jitter: 0}}
    payload: {{fail_until: 99}}
"""


def failed_at(attempt: int) -> Callable[[InstanceRow], bool]:
    """The row has finished `attempt` (or a later one) with a failure."""
    return lambda row: row.attempt >= attempt and row.status in (Status.RETRYING, Status.FAILED)


async def test_attempts_are_not_exceeded_across_kills_and_restarts(cluster: Cluster) -> None:
    await cluster.apply(TASKS)
    cluster.start("scheduler")
    cluster.start("sweeper")
    for _ in range(EXECUTORS):
        cluster.start("executor")
    await cluster.ready()
    instance = await cluster.emit("hopeless")
    replaced: list[int] = []

    for attempt in range(1, MAX_ATTEMPTS):
        row = await cluster.row_until(
            instance, failed_at(attempt), what=f"attempt {attempt} failed"
        )
        assert (row.status, row.attempt) == (Status.RETRYING, attempt)
        for executor in cluster.executors():
            executor.kill()
        replaced.append(attempt)
        for _ in range(EXECUTORS):
            cluster.start("executor")
    done = await cluster.reach(instance, Status.FAILED, Status.SUCCESS)

    history = await cluster.store.history(instance)
    assert replaced == list(range(1, MAX_ATTEMPTS))
    assert (done.status, done.fail_class, done.attempt) == (
        Status.FAILED,
        FailClass.EXHAUSTED,
        MAX_ATTEMPTS,
    )
    assert [h.attempt for h in running_rows(history)] == list(range(1, MAX_ATTEMPTS + 1))
    assert [h.reason for h in rows_to(history, Status.RETRYING)] == ["retriable_error"] * (
        MAX_ATTEMPTS - 1
    )
    assert [h.reason for h in rows_to(history, Status.FAILED)] == ["retriable_error"]
    assert not rows_to(history, Status.TIMEOUT)
    owners = {h.owner for h in running_rows(history)}
    assert len(owners) == MAX_ATTEMPTS, "every attempt ran in a different process"
    await cluster.drained()
