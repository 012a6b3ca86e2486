"""Must show (issue #5), clock skew, executors: a real executor whose wall clock runs 5 minutes
fast, and then one whose clock runs 5 minutes slow, run instances normally next to a true-clock
scheduler and sweeper.

Each phase starts one skewed executor (libfaketime; the test fails unless its log timestamps
show the skew) and gives it: calls through the `http` agent to an upstream limited to 1 call
per 3 s (the limiter defers two of them), a task whose first attempt fails and retries after
3 s, and a task that holds its run for 8 s on a 3 s lease (the sweeper checks leases every 2 s).

Every due time is judged on the database's clock, which the executor syncs to
(`core.timesync`): while the phase runs, the rows are sampled, and each RETRYING row's due time
must lie the intended wait after its write (`updated_at_ms`, written by the database), and each
RUNNING row's lease must end within its lease from the database's now. A 5 minute error in
either direction would be off by 300 s; the tolerance is 1 s.
"""

from __future__ import annotations

import itertools
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from taskstream.core.reasons import DEFERRED, LEASE_EXPIRED, OWNER_LOST
from taskstream.core.states import SETTLED, Status
from taskstream.core.store.port import HistoryRow
from taskstream.executor.outcome import defer_jitter_max_ms
from taskstream.ratelimit.window import Limits, guarded
from tests.fault.conftest import Cluster, RecordProperty, Role, rows_to, running_rows
from tests.soak.hammer_rig import Upstream, arrivals_upstream
from tests.support.arrivals import read_log
from tests.support.faketime import skew_env

pytestmark = pytest.mark.fault

SKEWS_S = (300, -300)
WINDOW_MS = 3_000
GUARDED_WINDOW_MS = guarded(Limits(1, WINDOW_MS)).window_ms
RETRY_MS = 3_000
LEASE_MS = 3_000
TOLERANCE_MS = 1_000
"""Slack on any one due time or lease measured against the database clock."""
DISPATCH_MS = 2_500
"""Bound from a due time to the next RUNNING: the scheduler publishes, the executor claims."""
PLAN = ("call", "call", "call", "again", "again", "hold")
TASKS = """
tasks:
  - id: call
    agent: http
    upstreams: [api]
    payload: {{url: "{url}", timeout: 10}}
  - id: again
    agent: flaky
    retry: {{max_attempts: 3, backoff: {{base: 3s, factor: 1}}, jitter: 0}}
    payload: {{fail_until: 1}}
  - id: hold
    agent: slow
    lease: 3s
    timeout: 30s
    payload: {{seconds: 8}}
"""


@dataclass
class Watch:
    """Samples of one phase's rows, on the database clock: per task, each RETRYING row's due
    time minus its write time, and each RUNNING row's lease end minus the database's now."""

    tasks: dict[str, str]
    due_after_write: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    lease_left: list[tuple[str, int]] = field(default_factory=list)

    async def sample(self, cluster: Cluster) -> bool:
        """Take one sample; True once every instance has settled."""
        now_ms = await cluster.store.db_now_ms()
        settled = True
        for instance_id, task in self.tasks.items():
            row = await cluster.store.get_instance(instance_id)
            assert row is not None
            if row.status is Status.RETRYING and row.next_attempt_at_ms is not None:
                key = (instance_id, row.updated_at_ms)
                self.due_after_write[key] = (task, row.next_attempt_at_ms - row.updated_at_ms)
            if row.status is Status.RUNNING and row.lease_expires_at_ms is not None:
                self.lease_left.append((task, row.lease_expires_at_ms - now_ms))
            settled = settled and row.status in SETTLED
        return settled

    def dues(self, task: str) -> list[int]:
        return [delta for name, delta in self.due_after_write.values() if name == task]


def _assert_clock_skewed(executor: Role, skew_s: int, spawned_at: float, seen_at: float) -> None:
    """The executor's first log line was stamped between our `spawned_at` and `seen_at`, plus
    its skew: so its `time.time()` really was off by `skew_s`."""
    stamp = datetime.fromisoformat(executor.logged("executor.started")[0]["timestamp"])
    low, high = stamp.timestamp() - seen_at, stamp.timestamp() - spawned_at
    assert low - 1 <= skew_s <= high + 1, (
        f"{executor.name}'s clock was {low:+.1f}..{high:+.1f} s off, expected {skew_s:+d} s: "
        "libfaketime did not apply"
    )


async def _start_executor(cluster: Cluster, lib: Path, skew_s: int) -> Role:
    spawned_at = time.time()
    executor = cluster.start("executor", skew_env(lib, skew_s))
    await cluster.ready(executor)
    _assert_clock_skewed(executor, skew_s, spawned_at, time.time())
    return executor


async def _stop(cluster: Cluster, role: Role) -> None:
    role.send(signal.SIGTERM)

    async def gone() -> bool:
        return not role.alive

    await cluster.until(gone, timeout_s=30, what=f"{role.name} stopped")


def _next_running_gaps(history: list[HistoryRow], reason: str) -> list[int]:
    """For each move to RETRYING with `reason`: ms until the next move to RUNNING."""
    gaps: list[int] = []
    for i, row in enumerate(history):
        if row.to_status is Status.RETRYING and row.reason == reason:
            later = [h.at_ms for h in history[i + 1 :] if h.to_status is Status.RUNNING]
            assert later, f"{row.instance_id} never ran again after {reason}"
            gaps.append(later[0] - row.at_ms)
    return gaps


def _assert_history(watch: Watch, histories: dict[str, list[HistoryRow]], owner: str) -> None:
    """Claimed by the skewed executor only; deferred, retried and held as planned."""
    for instance_id, history in histories.items():
        task = watch.tasks[instance_id]
        assert {h.owner for h in running_rows(history)} == {owner}, history
        assert history[-1].to_status is Status.SUCCESS, history
        assert not rows_to(history, Status.TIMEOUT), history
        assert not {h.reason for h in history} & {OWNER_LOST, LEASE_EXPIRED}, history
        reasons = [h.reason for h in rows_to(history, Status.RETRYING)]
        if task == "call":
            assert set(reasons) <= {DEFERRED}, history
            assert all(
                g <= GUARDED_WINDOW_MS + DISPATCH_MS for g in _next_running_gaps(history, DEFERRED)
            ), history
        elif task == "again":
            assert reasons == ["retriable_error"], history
            (gap,) = _next_running_gaps(history, "retriable_error")
            assert RETRY_MS - TOLERANCE_MS <= gap <= RETRY_MS + DISPATCH_MS, history
        else:
            assert reasons == [] and len(running_rows(history)) == 1, history


def _assert_due_times(watch: Watch) -> None:
    """Due times and leases agree with the database clock, not shifted by the skew."""
    deferrals, retries = watch.dues("call"), watch.dues("again")
    assert deferrals and retries, f"no RETRYING row sampled: {watch.due_after_write}"
    longest = GUARDED_WINDOW_MS + defer_jitter_max_ms(GUARDED_WINDOW_MS) + TOLERANCE_MS
    assert all(-TOLERANCE_MS <= d <= longest for d in deferrals), deferrals
    assert all(abs(d - RETRY_MS) <= TOLERANCE_MS for d in retries), retries
    held = [left for task, left in watch.lease_left if task == "hold"]
    assert held, "the held run's lease was never sampled"
    assert all(0 < left <= LEASE_MS + TOLERANCE_MS for left in held), held


def _assert_arrivals(arrivals: list[float]) -> None:
    """The upstream got the three calls at most 1 per 3 s, each on time after its deferral."""
    assert len(arrivals) == PLAN.count("call"), arrivals
    gaps_ms = [round((b - a) * 1000) for a, b in itertools.pairwise(arrivals)]
    longest = GUARDED_WINDOW_MS + defer_jitter_max_ms(GUARDED_WINDOW_MS) + DISPATCH_MS
    assert all(WINDOW_MS <= g <= longest for g in gaps_ms), gaps_ms


async def _phase(cluster: Cluster, upstream: Upstream, lib: Path, skew_s: int) -> dict[str, object]:
    executor = await _start_executor(cluster, lib, skew_s)
    before = len(read_log(upstream.log))
    base_ms = 10_000 * (len(cluster.executors(dead_too=True)))
    ids = {await cluster.emit(task, base_ms + i): task for i, task in enumerate(PLAN)}
    watch = Watch(ids)
    await cluster.until(
        lambda: watch.sample(cluster), timeout_s=90, what=f"skew {skew_s:+d} s: all settled"
    )
    histories = {i: await cluster.store.history(i) for i in ids}
    _assert_history(watch, histories, executor.consumer)
    _assert_due_times(watch)
    _assert_arrivals(read_log(upstream.log)[before:])
    assert not executor.logged("instance.fenced")
    await _stop(cluster, executor)
    return {"skew_s": skew_s, "due_after_write_ms": sorted(watch.due_after_write.values())}


@pytest.mark.timeout(300)
async def test_skewed_executors_run_instances_normally(
    cluster: Cluster, libfaketime: Path, record_property: RecordProperty
) -> None:
    await cluster.store.upsert_upstreams({"api": {"limit": 1, "window": WINDOW_MS / 1000}})
    async with arrivals_upstream(cluster.env, cluster.logs) as upstream:
        await cluster.apply(TASKS.format(url=upstream.url))
        cluster.start("scheduler")
        cluster.start("sweeper")
        await cluster.ready()
        for skew_s in SKEWS_S:
            found = await _phase(cluster, upstream, libfaketime, skew_s)
            record_property(f"skew{skew_s:+d}", found)
            print("skewed executor:", found)
    await cluster.drained()
