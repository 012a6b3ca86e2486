"""Poison work next to normal work: entries that do not decode, an unknown protocol version,
an unknown agent, an oversize payload and an agent that kills its executor every time each
end on the dead-letter stream with their reason; the normal instances all succeed.

The `crash` instance is retried after each lost run (its `max_attempts` is high) until the
sweeper sees more lost runs than `max_deliveries` (default 5): its sixth run, the first over
the limit, fails it as poison. Executors killed by it are restarted by the test.

Lost runs are found sooner than with the defaults (`FAST_RECOVERY`: liveness keys live 3 s
instead of 6, the sweeper passes every second instead of every 2): each of the six lost runs
waits for that detection, and nothing here depends on its length.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from taskstream.core.protocol import Priority
from taskstream.core.states import FailClass, Status
from tests.fault.conftest import Cluster, rows_to, running_rows

MAX_DELIVERIES = 5
"""The default of `TASKSTREAM_MAX_DELIVERIES`."""
MAX_PAYLOAD_BYTES = 2048
NORMAL = 10
MAX_RESTARTS = 20
EXECUTORS = 2
FAST_RECOVERY = {"TASKSTREAM_LIVENESS_TTL_S": "3", "TASKSTREAM_SWEEP_INTERVAL_S": "1"}
EXPECTED_DEAD = ["bad_encoding", "unknown_version", "unknown_agent", "payload_too_large", "poison"]

TASKS = f"""
tasks:
  - id: normal
    agent: slow
    retry: {{max_attempts: 5, backoff: {{base: 1s, factor: 1}}, jitter: 0}}
    payload: {{seconds: 0.1}}
  - id: crash
    agent: crash
    retry: {{max_attempts: 10, backoff: {{base: 1s, factor: 1}}, jitter: 0}}
  - id: stranger
    agent: no-such-agent
  - id: big
    agent: slow
    payload: {{seconds: 0, blob: "{"x" * (MAX_PAYLOAD_BYTES + 100)}"}}
"""

BAD_ENCODING = {b"v": b"1", b"instance_id": b"\xff\xfe", b"task_id": b"\xc3\x28"}
UNKNOWN_VERSION = {
    "v": "99",
    "instance_id": "from-the-future",
    "task_id": "normal",
    "agent": "slow",
    "attempt": "0",
    "scheduled_for_ms": "0",
    "emitted_at_ms": "0",
}


class Restarter:
    """Keeps `EXECUTORS` executors running: any that died is replaced, at most `limit` times."""

    def __init__(self, cluster: Cluster, limit: int) -> None:
        self.cluster, self.limit, self.started = cluster, limit, 0

    def __call__(self) -> None:
        for _ in range(EXECUTORS - len(self.cluster.executors())):
            self.started += 1
            assert self.started <= EXECUTORS + self.limit, "executors keep dying"
            limit = {"TASKSTREAM_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES)}
            self.cluster.start("executor", {**limit, **FAST_RECOVERY})


@pytest.mark.timeout(240)
async def test_poison_ends_in_the_dead_letter_stream_and_normal_work_succeeds(
    cluster: Cluster,
) -> None:
    await cluster.apply(TASKS)
    keep = Restarter(cluster, MAX_RESTARTS)
    cluster.start("scheduler")
    cluster.start("sweeper", FAST_RECOVERY)
    keep()
    await cluster.ready()
    stream = cluster.keys.stream(Priority.DEFAULT)
    await cluster.redis.xadd(stream, BAD_ENCODING)  # type: ignore[arg-type]
    await cluster.redis.xadd(stream, UNKNOWN_VERSION)  # type: ignore[arg-type]
    normal = [await cluster.emit("normal", i) for i in range(NORMAL)]
    poison = {name: await cluster.emit(name) for name in ("crash", "stranger", "big")}
    everything = normal + list(poison.values())

    async def all_settled() -> bool:
        # The store's FAILED commit comes before the entry's move to the dead-letter stream
        # (a crash between the two is repaired by the next sweep), so wait for both.
        settled = len(await cluster.settled(everything)) == len(everything)
        return settled and len(await cluster.dead_letters()) >= len(EXPECTED_DEAD)

    await cluster.until(
        all_settled, timeout_s=200, what="all settled, all dead-lettered", tick=keep
    )

    for instance in normal:
        row = await cluster.store.get_instance(instance)
        assert row is not None and row.status is Status.SUCCESS, row
    for name, instance in poison.items():
        row = await cluster.store.get_instance(instance)
        assert row is not None, name
        assert (row.status, row.fail_class) == (Status.FAILED, FailClass.POISON), name

    dead = await cluster.dead_letters()
    reasons = Counter(d["reason"] for d in dead)
    assert reasons == Counter(EXPECTED_DEAD)
    by_reason = {d["reason"]: d.get("orig.instance_id") for d in dead}
    assert by_reason["unknown_agent"] == poison["stranger"]
    assert by_reason["payload_too_large"] == poison["big"]
    assert by_reason["poison"] == poison["crash"]
    assert by_reason["unknown_version"] == "from-the-future"

    crash = await cluster.store.history(poison["crash"])
    assert len(running_rows(crash)) == MAX_DELIVERIES + 1
    assert [h.reason for h in rows_to(crash, Status.TIMEOUT)] == ["owner_lost"] * MAX_DELIVERIES
    assert [h.reason for h in rows_to(crash, Status.FAILED)] == ["poison"]
    died = [r for r in cluster.executors(dead_too=True) if not r.alive]
    assert [r.proc.returncode for r in died] == [-signal.SIGKILL] * (MAX_DELIVERIES + 1)
    await cluster.drained()
