"""What the breaker outage run reads from the cluster: the breaker's states as they change
(`BreakerWatch`, polling the shared hash on Redis), the offset between the test's clock and
the Redis server's, and the store's account of every instance and decision (`Ledger`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from taskstream.core import streams
from taskstream.core.states import SETTLED, Status
from taskstream.core.store.port import DecisionRow, InstanceRow, Store
from taskstream.executor.retry import attempts_used
from taskstream.ratelimit.breaker import BreakerStatus
from taskstream.ratelimit.redis_backend import RedisBreakers
from taskstream.scheduler.hold import held_upstreams
from taskstream.scheduler.verdict import COALESCED, DEFERRED, Decision
from tests.soak.outage_timeline import BreakerSeen

WATCH_EVERY_S = 0.05
"""How often the breaker's state is read (seconds); far below any state's duration here."""
MANY = 100_000
"""A limit above any number of rows this run makes."""


async def redis_offset_ms(redis: streams.Redis) -> int:
    """The Redis server's clock minus the wall clock of this process (ms), read once."""
    before = time.time_ns()
    seconds, micros = await redis.time()
    after = time.time_ns()
    local_ms = (before + after) // 2 // 1_000_000
    return int(seconds) * 1000 + int(micros) // 1000 - local_ms


@dataclass
class BreakerWatch:
    """Reads one breaker every `WATCH_EVERY_S` and keeps each new state it sees."""

    breakers: RedisBreakers
    name: str
    seen: list[BreakerSeen] = field(default_factory=list)

    async def _read(self) -> None:
        read = await self.breakers.states([self.name])
        state = read.states[self.name]
        latest = BreakerSeen(state.status, state.since_ms)
        if not self.seen or self.seen[-1] != latest:
            self.seen.append(latest)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[BreakerWatch]:
        """Watch while the block runs (and once more as it ends)."""
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await self._read()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), WATCH_EVERY_S)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            stop.set()
            await task
            await self._read()

    def closed_after_open(self) -> bool:
        """True once the breaker has been seen open and, later, closed."""
        opened = [i for i, s in enumerate(self.seen) if s.status is BreakerStatus.OPEN]
        return bool(opened) and self.seen[-1].status is BreakerStatus.CLOSED


@dataclass(frozen=True)
class Ledger:
    """The store's account of the run's tasks.

    `instances`: every instance row; `created`: the decisions that created an instance;
    `held`: decisions that held a tick back for the upstream; `attempts`: attempts
    each instance spent (runs deferred unrun or by an outage do not count).
    """

    instances: dict[str, InstanceRow]
    created: tuple[DecisionRow, ...]
    held: tuple[DecisionRow, ...]
    coalesced: int
    attempts: dict[str, int]
    reasons: dict[str, int]

    @property
    def decided(self) -> frozenset[str]:
        """The instance ids the decision log says were created."""
        return frozenset(d.instance_id for d in self.created if d.instance_id is not None)

    def by_status(self) -> dict[Status, int]:
        out: dict[Status, int] = {}
        for row in self.instances.values():
            out[row.status] = out.get(row.status, 0) + 1
        return out


async def unsettled(store: Store, task_ids: Sequence[str]) -> int:
    """How many instances of the tasks are not settled yet."""
    rows = [r for t in task_ids for r in await store.list_instances(task_id=t, limit=MANY)]
    return sum(1 for row in rows if row.status not in SETTLED)


async def ledger(store: Store, task_ids: Sequence[str], upstream: str) -> Ledger:
    """Read every instance, its history and every decision of `task_ids`."""
    instances: dict[str, InstanceRow] = {}
    decisions: list[DecisionRow] = []
    for task_id in task_ids:
        instances |= {r.id: r for r in await store.list_instances(task_id=task_id, limit=MANY)}
        decisions += await store.decisions(task_id, since_ms=0, limit=MANY)
    attempts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for instance_id, row in instances.items():
        history = await store.history(instance_id)
        attempts[instance_id] = attempts_used(row.attempt, [(h.reason, h.attempt) for h in history])
        for h in history:
            if h.from_status is Status.RUNNING:
                reasons[h.reason] = reasons.get(h.reason, 0) + 1
    held = tuple(d for d in decisions if upstream in held_by(d))
    return Ledger(
        instances=instances,
        created=tuple(d for d in decisions if d.instance_id is not None),
        held=held,
        coalesced=sum(1 for d in decisions if d.decision == COALESCED),
        attempts=attempts,
        reasons=reasons,
    )


def held_by(row: DecisionRow) -> tuple[str, ...]:
    """The upstreams whose open breaker held a stored decision's tick back; () when it was not
    a hold (`deferred` with a `held_by` detail)."""
    if row.decision != DEFERRED:
        return ()
    return held_upstreams(Decision(row.decision, row.reason, row.details))
