"""The sweeper: finds pending entries nobody is progressing and decides each from the store
(`sweep.decide`). Entries of a consumer whose liveness key has expired are taken at once;
others only once idle past `min_idle_ms` (heartbeats keep live runs' entries fresh). Each pass
also runs the reconciler, prunes dead consumers and trims streams by MINID."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from random import Random
from typing import TypeVar

from taskstream.core import notify, streams
from taskstream.core import streams_admin as admin
from taskstream.core.clock import Clock
from taskstream.core.definitions import DefinitionCache
from taskstream.core.denials import Holds, log_denied, pause_s, unless_held
from taskstream.core.errors import CommandDenied, ProtocolError, StoreCorrupt, StoreUnavailable
from taskstream.core.futures import unless_stopped
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys, decode
from taskstream.core.states import (
    FailClass,
)
from taskstream.core.store.port import InstanceRow, Store
from taskstream.executor import handover, letters, unreadable
from taskstream.executor.poisoning import fail_as_poison
from taskstream.executor.reconciler import Reconciler
from taskstream.executor.recovery import Recovery
from taskstream.executor.sweep import (
    LEFT_IN_TIMEOUT,
    Action,
    ReleaseNote,
    Verdict,
    decide,
    liveness_trusted,
)
from taskstream.executor.sweep_facts import SweepFacts

T = TypeVar("T")
DENIED = "denied"
"""The count of entries whose action Redis denied in a pass (`sweep_once`)."""


@dataclass(frozen=True, slots=True)
class SweeperConfig:
    """Intervals and limits, in ms unless named otherwise."""

    interval_s: float = 2.0
    min_idle_ms: int = 10_000
    unclaimed_ms: int = 30_000
    max_deliveries: int = 5
    batch: int = 500
    consumer_idle_ms: int = 300_000
    liveness_ttl_ms: int = 6_000
    """The executors' liveness TTL: after this sweeper saw Redis fail, consumers count as
    alive for this long (their keys expired in the outage, not with them)."""


class Sweeper:
    """One sweeper process (several may run: every action is a CAS or idempotent)."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        clock: Clock,
        config: SweeperConfig,
        rng: Random | None = None,
    ) -> None:
        self._store, self._redis, self._keys, self._clock = store, redis, keys, clock
        self._config = config
        self._defs = DefinitionCache(store)
        self._recovery = Recovery(store, self._defs, rng or Random())
        self._reconciler = Reconciler(
            store, redis, keys, clock, self._recovery, liveness_ttl_ms=config.liveness_ttl_ms
        )
        self._redis_failed_ms: int | None = None
        self._holds = Holds()
        """Entries and steps whose last try Redis denied, paused until due again."""
        self._denied_passes = 0
        self._log = get_logger(role="sweeper")

    def redis_failed(self) -> None:
        """Note that Redis just failed. Liveness keys expire during an outage longer than
        their TTL whether or not their executors live, so for one TTL after it an absent key
        proves nothing: runs are then judged by their leases alone, not timed out at once."""
        self._redis_failed_ms = self._clock.now_ms()

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every `interval_s` until `stop` is set; a dependency outage pauses a pass."""
        self._log.info("sweeper.started")
        # Just started, it cannot tell whether Redis was down before (a host rebooted, its
        # container came back first): live executors' keys may have expired, and they set
        # them again within a TTL. So it starts as if it had just seen Redis fail.
        self.redis_failed()
        while not stop.is_set():
            wait_s = self._config.interval_s
            try:
                await unless_stopped(self.sweep_once(), stop)
                self._denied_passes = 0
            except (StoreUnavailable, *streams.DRIVER_ERRORS) as exc:
                self._log.warning("sweeper.dependency_down", error=streams.outage_text(exc))
                if isinstance(exc, streams.DRIVER_ERRORS):
                    self.redis_failed()
            except CommandDenied as exc:  # a pass cannot even read the pending lists
                self._denied_passes += 1
                wait_s = max(wait_s, pause_s(self._denied_passes))
                log_denied(self._log, exc, retry_in_s=wait_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait_s)
        self._log.info("sweeper.stopped")

    async def sweep_once(self) -> dict[str, int]:
        """One pass over every work stream; returns how many entries got each action."""
        await self._defs.refresh()
        counts: dict[str, int] = {}
        for stream in self._keys.streams():
            for action in await self._sweep_stream(stream):
                counts[action] = counts.get(action, 0) + 1
            prune = partial(
                admin.prune_consumers,
                self._redis,
                self._keys,
                stream,
                idle_ms=self._config.consumer_idle_ms,
            )
            await self._unless_denied(f"prune {stream}", prune)
            await self._unless_denied(f"trim {stream}", partial(admin.trim, self._redis, stream))
        trusted = liveness_trusted(
            self._redis_failed_ms, now_ms=self._clock.now_ms(), ttl_ms=self._config.liveness_ttl_ms
        )
        reconcile = partial(self._reconciler.reconcile, liveness_trusted=trusted)
        counts["republished"] = await self._unless_denied("reconcile", reconcile) or 0
        handed_back = counts.get(Action.TIMEOUT.value) or counts.get(Action.RELEASE.value)
        if handed_back or counts["republished"]:
            await notify.hint(self._redis, self._keys, "retry")
        return counts

    async def _sweep_stream(self, stream: str) -> list[str]:
        """Every pending entry of `stream`, a page of `batch` at a time (oldest first): an
        entry behind a page of healthy long runs is looked at in the same pass."""
        actions: list[str] = []
        after: str | None = None
        while True:
            entries = await admin.pending(
                self._redis, stream, count=self._config.batch, after=after
            )
            actions += await self._sweep_page(stream, entries)
            if len(entries) < self._config.batch:
                return actions
            after = entries[-1].entry_id

    async def _sweep_page(self, stream: str, entries: list[admin.Pending]) -> list[str]:
        if not entries:
            return []
        owners = await admin.alive(self._redis, self._keys, {p.consumer for p in entries})
        now_ms, ttl_ms = self._clock.now_ms(), self._config.liveness_ttl_ms
        if not liveness_trusted(self._redis_failed_ms, now_ms=now_ms, ttl_ms=ttl_ms):
            owners = dict.fromkeys(owners, True)
        stuck = [
            p
            for p in entries
            if (not owners.get(p.consumer) or p.idle_ms >= self._config.min_idle_ms)
            and self._holds.due(f"{p.stream} {p.entry_id}", now_ms)
        ]
        if not stuck:
            return []
        found = await admin.fetch(self._redis, stream, [p.entry_id for p in stuck])
        actions: list[str] = []
        for p in stuck:
            # An entry whose ack or move Redis denies is left as it is (pending: neither
            # acked nor lost) and skipped until its pause is over, while the others go on.
            sweep = partial(
                self._sweep_found, p, found.get(p.entry_id), owners.get(p.consumer, False)
            )
            key, ids = f"{p.stream} {p.entry_id}", {"entry_id": p.entry_id, "stream": p.stream}
            action = await unless_held(self._holds, key, now_ms, self._log, sweep, **ids)
            actions.append(DENIED if action is None else action)
        return [a for a in actions if a]

    async def _sweep_found(self, p: admin.Pending, d: streams.Delivery | None, alive: bool) -> str:
        """Sweep one entry; "" for one deleted meanwhile (only acked)."""
        if d is None:
            await streams.ack(self._redis, p.stream, p.entry_id)
            return ""
        return await self._sweep_entry(p, d, alive)

    async def _unless_denied(self, step: str, make: Callable[[], Awaitable[T]]) -> T | None:
        """Run a step of the pass (`make()`) unless Redis denied it lately: a denial is
        logged and pauses that step alone (None), not the pass."""
        now_ms = self._clock.now_ms()
        return await unless_held(self._holds, step, now_ms, self._log, make, step=step)

    async def _sweep_entry(self, p: admin.Pending, d: streams.Delivery, alive: bool) -> str:
        try:
            entry = decode(d.fields)
        except ProtocolError as exc:
            moved = await self._dead(d, exc.reason)
            return (Action.DEAD_LETTER if moved else Action.LEAVE).value
        try:
            row = await self._store.get_instance(entry.instance_id)
        except StoreCorrupt as exc:  # poison (`unreadable`), not the end of the pass
            await unreadable.set_aside(self._store, self._log, entry, exc)
            moved = await letters.dead_letter(
                self._redis, self._keys, self._log, d, unreadable.CORRUPT_ROW, str(exc)
            )
            return (Action.DEAD_LETTER if moved else Action.LEAVE).value
        now_ms = self._clock.now_ms()
        facts = SweepFacts(self._store, self._redis, self._keys, now_ms)
        entry_facts, row_facts = await facts.gather(p, entry, row, alive)
        verdict = decide(
            entry_facts,
            row_facts,
            db_now_ms=now_ms,
            max_deliveries=self._config.max_deliveries,
            unclaimed_ms=self._config.unclaimed_ms,
        )
        self._log.info(
            "entry.swept",
            entry_id=d.entry_id,
            instance_id=entry.instance_id,
            action=verdict.action,
            reason=verdict.reason,
        )
        if verdict.action is Action.REDELIVER:
            again = entry.model_copy(update={"redeliveries": entry.redeliveries + p.deliveries})
            moved = await admin.redeliver(self._redis, d, again) is not None
            if not moved:
                letters.moved_meanwhile(self._log, d)
            return (Action.REDELIVER if moved else Action.LEAVE).value
        return (await self._act(verdict, d, row, entry_facts.released)).value

    async def _act(
        self,
        verdict: Verdict,
        d: streams.Delivery,
        instance: InstanceRow | None,
        note: ReleaseNote | None,
    ) -> Action:
        """Carry the verdict out (`note`: the release noted for the run); returns the action
        taken: LEAVE when a poison move or a release lost its CAS (the next pass decides again
        from the row as it is then) or another mover took the entry first."""
        if verdict.action is Action.POISON and instance is not None:
            failed = await self._poison(d, instance, verdict.reason)
            return Action.POISON if failed else Action.LEAVE
        if verdict.action is Action.ACK:
            await streams.ack(self._redis, d.stream, d.entry_id)
        elif verdict.action is Action.DEAD_LETTER:
            if not await self._dead(d, verdict.reason):
                return Action.LEAVE
        elif verdict.action is Action.TIMEOUT and instance is not None:
            await self._time_out(verdict, d, instance)
        elif verdict.action is Action.RELEASE and instance is not None and note is not None:
            released = await handover.make_release(
                self._store, self._redis, self._keys, instance, note, now_ms=self._clock.now_ms()
            )
            if not released:
                return Action.LEAVE  # the row moved on: the next pass decides from it
            await streams.ack(self._redis, d.stream, d.entry_id)
        return verdict.action

    async def _time_out(self, verdict: Verdict, d: streams.Delivery, row: InstanceRow) -> None:
        """Time the run out (or finish its move out of TIMEOUT), then ack its entry, or
        dead-letter it when that move is FAILED `poison`."""
        now_ms = self._clock.now_ms()
        if verdict.reason == LEFT_IN_TIMEOUT:
            done = await self._recovery.leave_timeout(row, now_ms=now_ms)
        else:
            done = await self._recovery.time_out(row, reason=verdict.reason, now_ms=now_ms)
        if done.ok and done.decision and done.decision.fail_class is FailClass.POISON:
            await self._dead(d, "poison")
        elif done.ok:
            await streams.ack(self._redis, d.stream, d.entry_id)

    async def _poison(self, d: streams.Delivery, row: InstanceRow, reason: str) -> bool:
        """Fail the instance as poison (`poisoning.fail_as_poison`) and dead-letter the entry;
        when the move loses its CAS the entry is left, and False returned."""
        if not await fail_as_poison(self._store, row, reason):
            self._log.info("entry.poison_lost", entry_id=d.entry_id, instance_id=row.id)
            return False
        await self._dead(d, "poison")
        return True

    async def _dead(self, d: streams.Delivery, reason: str) -> bool:
        """Dead-letter the entry; False when another mover took it first."""
        return await letters.dead_letter(self._redis, self._keys, self._log, d, reason, "swept")
