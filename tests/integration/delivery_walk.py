"""A seeded random walk over the executor side of DESIGN.md §6 (real Redis, real store, one
fixed clock), checking the delivery guarantees after every step.

Steps: trigger an instance (its agent succeeds, fails retriably for a while, for ever, fails
fatally, or takes a while), run an executor until it is idle, stop one with no grace while a
run of its own is open, a consumer that reads and maybe claims (and maybe commits) entries and
then dies as a kill -9 leaves it (entries in its pending list, runs RUNNING under its lease or
committed but not acked, no liveness key), advance the clock, a sweeper pass, a reconciler
pass, a scheduler pass, a duplicate XADD of an instance's entry (of its current attempt or an
older one), and Redis losing the work streams. Every step ends by itself.

Invariants, from the store's rows and history: the claims of an instance that count as
attempts (`runs_counted`) never exceed its `max_attempts`; at most one move into SUCCESS per
instance; every move is one the state table allows, and the moves chain (each from where the
last one went, the row at the last); a settled row never changes again. At the end the
cluster is driven to quiescence and every instance must be settled."""

from __future__ import annotations

import dataclasses
from random import Random
from typing import Any

from taskstream.core import streams
from taskstream.core.errors import ProtocolError
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import GROUP, Priority, decode
from taskstream.core.reasons import DEFERRED, RELEASED
from taskstream.core.states import SETTLED, Status, can_transition
from taskstream.core.store.port import ClaimRequest, FinishRequest, HistoryRow, InstanceRow
from tests.integration.harness import Harness, Running, until

TASKS = """
tasks:
  - id: ok
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s}, jitter: 0}
  - id: flaky
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s, factor: 2, max: 10s}, jitter: 0}
    payload: {fail_until: 1}
  - id: hopeless
    agent: flaky
    retry: {max_attempts: 2, backoff: {base: 2s}, jitter: 0}
    payload: {fail_until: 99}
  - id: fatal
    agent: flaky
    retry: {max_attempts: 3}
    payload: {fail_until: 99, kind: fatal}
  - id: slow
    agent: slow
    timeout: 30s
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {seconds: 0.2}
"""
TASK_IDS = ("ok", "flaky", "hopeless", "fatal", "slow")
MAX_INSTANCES = 5
UNRUN = (RELEASED, DEFERRED, "attempts_exhausted")
ADVANCES_MS = (300, 1_500, 5_000, 12_000, 45_000, 200_000)
STEPS = (
    "trigger",
    "trigger",
    "execute",
    "execute",
    "kill",
    "kill",
    "interrupt",
    "advance",
    "advance",
    "sweep",
    "reconcile",
    "schedule",
    "duplicate",
    "empty_redis",
)


@dataclasses.dataclass
class Walk:
    """One walk: the harness, its sweeper and reconciler, the instances it made, and the
    settled rows it saw."""

    h: Harness
    rng: Random
    ids: list[str] = dataclasses.field(default_factory=list)
    settled: dict[str, InstanceRow] = dataclasses.field(default_factory=dict)
    log: list[str] = dataclasses.field(default_factory=list)
    fired: int = 0
    ghosts: int = 0

    def __post_init__(self) -> None:
        # One of each for the whole walk, as the long-running roles are: the reconciler
        # remembers which owners' keys it found absent.
        self.sweeper = self.h.sweeper()
        self.reconciler = self.h.reconciler()

    async def step(self, name: str) -> None:
        self.log.append(name)
        await getattr(self, f"_{name}")()
        await self.check()

    async def _trigger(self) -> None:
        if len(self.ids) >= MAX_INSTANCES:
            return
        self.fired += 1
        task_id = self.rng.choice(TASK_IDS)
        row = await self.h.trigger(TASKS, task_id, fire_ms=self.h.clock.now_ms() + self.fired)
        self.ids.append(row.id)
        self.log[-1] += f" {task_id} {row.id}"

    async def _execute(self) -> None:
        await execute_until_idle(self.h, f"ex{len(self.log)}")

    async def _interrupt(self) -> None:
        """An executor stopped with no grace while a run of its own is open (when one opens
        soon): the run is handed back (`released`)."""
        await execute_until_idle(self.h, f"ex{len(self.log)}", interrupt=True)

    async def _kill(self) -> None:
        """A consumer reads one or two entries, claims some of them as the executor would,
        commits some of those, and dies: no release, no ack, no liveness key."""
        self.ghosts += 1
        ghost = f"ghost{self.ghosts}"
        await streams.ensure_groups(self.h.redis, self.h.keys)  # as an executor's start does
        read = await streams.read(
            self.h.redis, self.h.keys, ghost, count=self.rng.randint(1, 2), block_ms=1
        )
        claims = []
        for d in read:
            fields = _entry_of(d)
            if fields is not None and self.rng.random() < 0.7:
                claims.append(ClaimRequest(fields[0], fields[1], 30))
        won = await self.h.store.claim_many(claims, owner=ghost) if claims else {}
        # Some die between the commit and the XACK: the redelivery must find the row settled.
        ends = [
            FinishRequest(i, c.token, Status.SUCCESS, "completed", owner=ghost)
            for i, c in won.items()
            if self.rng.random() < 0.3
        ]
        if ends:
            await self.h.store.finish_many(ends)
        await self.h.redis.delete(self.h.keys.alive(ghost))
        self.log[-1] += f" read={len(read)} claimed={len(won)} committed={len(ends)}"

    async def _advance(self) -> None:
        ms = self.rng.choice(ADVANCES_MS)
        self.h.clock.advance(ms)
        self.log[-1] += f" {ms}"

    async def _sweep(self) -> None:
        await self.sweeper.sweep_once()

    async def _reconcile(self) -> None:
        await self.reconciler.reconcile()

    async def _schedule(self) -> None:
        await self.h.scheduler().run_pass()

    async def _duplicate(self) -> None:
        if not self.ids:
            return
        row = await self.h.store.get_instance(self.rng.choice(self.ids))
        assert row is not None
        attempt = self.rng.randint(max(0, row.attempt - 1), row.attempt)
        entry = row_entry(dataclasses.replace(row, attempt=attempt), self.h.clock.now_ms())
        await streams.publish_many(self.h.redis, self.h.keys, [(Priority.DEFAULT, entry)])
        self.log[-1] += f" {row.id}@{attempt}"

    async def _empty_redis(self) -> None:
        await self.h.redis.delete(*self.h.keys.streams())

    async def check(self) -> None:
        """The invariants, over every instance the walk made."""
        histories = await self.h.store.histories(self.ids)
        for instance_id in self.ids:
            row = await self.h.store.get_instance(instance_id)
            assert row is not None
            what = f"{instance_id} ({row.task_id}) after {self.log}"
            moves = histories.get(instance_id, [])
            assert runs_counted(moves) <= row.max_attempts, what
            assert sum(m.to_status is Status.SUCCESS for m in moves) <= 1, what
            at: Status | None = None
            for m in moves:
                assert m.from_status == at, f"{what}: {m.from_status} after {at}"
                assert at is None or can_transition(at, m.to_status), f"{what}: {at}->{m}"
                at = m.to_status
            assert at is row.status, what
            before = self.settled.get(instance_id)
            if before is not None:
                assert row == before, f"{what}: settled {before.status} changed to {row}"
            elif row.status in SETTLED:
                self.settled[instance_id] = row

    async def quiesce(self, rounds: int = 12) -> None:
        """Drive the cluster until every instance is settled (bounded), then check."""
        for _ in range(rounds):
            if len(self.settled) == len(self.ids):
                return
            for name in ("advance_far", "sweep", "reconcile", "schedule", "execute"):
                self.log.append(name)
                if name == "advance_far":
                    self.h.clock.advance(60_000)
                else:
                    await getattr(self, f"_{name}")()
                await self.check()
        stuck = [i for i in self.ids if i not in self.settled]
        raise AssertionError(f"not settled: {stuck} after {self.log}")


def runs_counted(moves: list[HistoryRow]) -> int:
    """Claims of an instance that count against its `max_attempts`: every move into RUNNING
    but those handed back unrun (`released`, `deferred`) and those failed unrun for being
    over the limit (`attempts_exhausted`). The `attempt` column, a fencing token, counts
    every claim (see `retry.attempts_used`)."""
    claims = sum(m.to_status is Status.RUNNING for m in moves)
    unrun = sum(m.from_status is Status.RUNNING and m.reason in UNRUN for m in moves)
    return claims - unrun


def _entry_of(d: streams.Delivery) -> tuple[str, int] | None:
    try:
        entry = decode(d.fields)
    except ProtocolError:
        return None
    return entry.instance_id, entry.attempt


async def execute_until_idle(h: Harness, consumer: str, *, interrupt: bool = False) -> None:
    """Run an executor until nothing is left for it to read and none of its runs is open
    (seen twice in a row), then stop it. With `interrupt`, stop it with no grace as soon as
    one of its runs is open, if that comes first."""
    ex = h.executor(consumer, grace_s=0)
    running = Running(ex)
    quiet = 0

    async def idle() -> bool:
        nonlocal quiet
        open_runs = await _leased_to(h, consumer)
        if interrupt and open_runs:
            return True
        busy = open_runs or bool(ex._running) or await _undelivered(h)
        quiet = 0 if busy else quiet + 1
        return quiet >= 2

    try:
        await until(idle)
    finally:
        await running.close()


async def _undelivered(h: Harness) -> bool:
    """Whether some work stream holds an entry the group has not delivered yet."""
    for stream in h.keys.streams():
        if not await h.redis.exists(stream):
            continue
        info: Any = await h.redis.xinfo_stream(stream)
        if info["length"] == 0:
            continue
        last = info["last-generated-id"]
        groups: Any = await h.redis.xinfo_groups(stream)
        for g in groups:
            if g["name"] in (GROUP, GROUP.encode()) and g["last-delivered-id"] != last:
                return True
    return False


async def _leased_to(h: Harness, consumer: str) -> bool:
    rows = await h.store.stale([Status.RUNNING], updated_before_ms=2**62, limit=1000)
    return any(isinstance(r, InstanceRow) and r.lease_owner == consumer for r in rows)


async def walk(h: Harness, seed: int, steps: int) -> Walk:
    """Apply the tasks, take `steps` random steps of `seed`, then drive to quiescence."""
    await h.apply(TASKS)
    w = Walk(h, Random(seed))
    for _ in range(steps):
        await w.step(w.rng.choice(STEPS))
    await w.quiesce()
    return w
