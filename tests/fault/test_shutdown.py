"""SIGTERM while a run is in flight: the executor stops reading, lets the run finish within
`TASKSTREAM_SHUTDOWN_GRACE_S`, commits and acks it, and exits 0."""

from __future__ import annotations

import logging
import signal
import time

from taskstream.cli import common
from taskstream.core.states import Status
from taskstream.executor import handover
from tests.fault.conftest import Cluster, RecordProperty, Role, rows_to

log = logging.getLogger(__name__)

GRACE_S = 10
TASKS = """
tasks:
  - id: five
    agent: slow
    payload: {seconds: 5}
  - id: stubborn
    agent: stubborn
    payload: {seconds: 120}
"""


async def test_sigterm_lets_the_running_task_finish_and_exits_zero(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    await cluster.apply(TASKS)
    executor = cluster.start("executor", {"TASKSTREAM_SHUTDOWN_GRACE_S": str(GRACE_S)})
    await cluster.ready()
    instance = await cluster.emit("five")
    await cluster.reach(instance, Status.RUNNING)

    stop_s = await _sigterm_until_exited(cluster, executor, timeout_s=GRACE_S + 20)
    record_property("sigterm_exit_s", stop_s)
    log.info("executor.exited after_s=%s", stop_s)

    assert executor.proc.returncode == 0
    row = await cluster.store.get_instance(instance)
    assert row is not None and row.status is Status.SUCCESS
    [success] = rows_to(await cluster.store.history(instance), Status.SUCCESS)
    assert success.owner == executor.consumer
    assert executor.logged("executor.draining", in_flight=1)
    assert not executor.logged("instance.released")
    assert executor.logged("executor.stopped")
    assert await cluster.backlog() == (0, 0)
    alive_key: int = await cluster.redis.exists(cluster.keys.alive(executor.consumer))
    assert alive_key == 0


async def test_an_agent_that_ignores_cancellation_does_not_keep_the_executor_from_exiting(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    """After the grace the run is cancelled; its agent goes on. The executor waits
    `STUCK_S` for it, then the process's last `LEFTOVER_S`, and exits 0 with its liveness key
    removed, so a sweeper takes the run over at once."""
    await cluster.apply(TASKS)
    executor = cluster.start("executor", {"TASKSTREAM_SHUTDOWN_GRACE_S": "1"})
    await cluster.ready()
    instance = await cluster.emit("stubborn")
    await cluster.reach(instance, Status.RUNNING)

    bound_s = 1 + handover.STUCK_S + common.LEFTOVER_S
    stop_s = await _sigterm_until_exited(cluster, executor, timeout_s=bound_s + 20)
    record_property("stubborn_exit_s", stop_s)

    assert executor.proc.returncode == 0
    assert executor.logged("executor.runs_stuck", runs=1)
    row = await cluster.store.get_instance(instance)
    assert row is not None and row.status is Status.RUNNING
    alive_key: int = await cluster.redis.exists(cluster.keys.alive(executor.consumer))
    assert alive_key == 0


async def _sigterm_until_exited(cluster: Cluster, executor: Role, *, timeout_s: float) -> float:
    """SIGTERM `executor` and wait until it has exited; seconds it took, to 0.01 s."""
    executor.send(signal.SIGTERM)
    signalled = time.monotonic()

    async def exited() -> bool:
        return not executor.alive

    await cluster.until(exited, timeout_s=timeout_s, what="executor exited")
    return round(time.monotonic() - signalled, 2)
