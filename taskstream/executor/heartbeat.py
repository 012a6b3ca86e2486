"""Heartbeat of one executor process: two loops, so that neither waits for the other.

The liveness loop refreshes the liveness key every third of the liveness TTL (the sweeper
reclaims the work of a consumer whose key has expired, without waiting for leases). It never
waits for the store: a store write held up by a lock wait, SQLite's busy timeout or an
exhausted pool must not make a live process look dead, which would time out its healthy runs.
Nor must an agent that holds the event loop: the executor keeps the key from a thread too
(`liveness`).

The lease loop beats every third of the liveness TTL, or of the shortest lease held when that
is shorter. When a third of the shortest lease has passed it extends every held lease by its
own run's lease length (one store write per distinct length, `WHERE attempt = token`), then
XCLAIMs our pending entries to ourselves (JUSTID) so their idle time resets without raising
their delivery count. A run whose lease is no longer held has been fenced: it is cancelled and
will not commit or ack. Runs stay tracked until their end is committed, so that a commit the
store makes wait keeps its lease. Leases are the store's truth: a process that keeps its key
but cannot write to the store lets its leases lapse and leaves its entries idle, and the
sweeper takes those runs over once the leases have expired.

Runs are tracked by claim, (instance id, token): a fenced run still winding down and a newer
attempt of the same instance claimed by this process are two runs. Both loops survive any
error (logged); only cancellation ends them early, because without the lease loop every lease
would lapse while the process kept claiming.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from asyncio import FIRST_COMPLETED
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.denials import commands, log_denied
from taskstream.core.errors import CommandDenied, StoreUnavailable
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys
from taskstream.core.store.port import Store
from taskstream.executor.intake import DEFAULT_LEASE_S, Run

OVERRUN_S = 10.0
"""How long past its time limit a run may go on (its agent not ending when cancelled) before
its attempt is ended as the timeout it is (`on_overrun`) and its lease let go: the slot stays
taken until the agent ends, but the instance retries (or fails) under its task's `retry_on`."""
ENDED_KEPT = 10_000
"""How many ended claims a process remembers (see `Heartbeat.ran`); about 1 MB."""


class Heartbeat:
    """Keeps this process visibly alive and its leases held."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        consumer: str,
        clock: Clock,
        *,
        liveness_ttl_s: float,
        on_overrun: Callable[[Run], None] | None = None,
    ) -> None:
        """`on_overrun(run)` is called once for a run found `OVERRUN_S` past its time limit
        (the executor queues its end as a timeout)."""
        self._store, self._redis, self._keys = store, redis, keys
        self._on_overrun = on_overrun
        self._consumer, self._clock = consumer, clock
        self._ttl_ms = round(liveness_ttl_s * 1000)
        self._runs: dict[tuple[str, int], tuple[Run, asyncio.Task[None]]] = {}
        self._ended: OrderedDict[tuple[str, int], None] = OrderedDict()
        """Claims of runs no longer tracked, oldest first, at most `ENDED_KEPT`."""
        self._last_extend_ms = 0
        self._extend_now = False
        """A run whose lease may lapse before the next scheduled extension is tracked: the
        next beat extends every lease, however recent the last extension."""
        self._sooner = asyncio.Event()
        """Set when the lease loop is to beat again at once (cleared as a beat starts, so a
        run tracked during a beat wakes the pause after it)."""
        self._waiting_s = math.inf
        """How long the lease loop's current sleep lasts (s; inf when it is not sleeping)."""
        self._log = get_logger(role="executor", consumer=consumer)

    @property
    def ttl_ms(self) -> int:
        """The liveness key's TTL (ms)."""
        return self._ttl_ms

    @property
    def alive_interval_s(self) -> float:
        """Seconds between refreshes of the liveness key: a third of its TTL, at least 0.2 s."""
        return max(0.2, self._ttl_ms / 3000)

    @property
    def interval_s(self) -> float:
        """Seconds between lease beats: a third of the liveness TTL (an extension that failed
        is tried again that soon), or of the shortest lease held when that is shorter (a lease
        must be extended before it lapses); at least 0.2 s."""
        third_s = self._ttl_ms / 3000
        if self._runs:
            third_s = min(third_s, min(_lease_s(run) for run, _ in self._runs.values()) / 3)
        return max(0.2, third_s)

    def track(self, run: Run, task: asyncio.Task[None]) -> None:
        """Extend `run`'s lease with the others from now on. A lease with less than two
        thirds of its length left (a claim adopted after an outage, whose reply was lost) is
        extended at the next beat: the next scheduled one may come after it lapses."""
        self._runs[(run.row.id, run.token)] = (run, task)
        lease_ms = _lease_s(run) * 1000
        if run.claimed.lease_expires_at_ms - self._clock.now_ms() < lease_ms * 2 / 3:
            self._extend_now = True
            self._sooner.set()
        elif max(0.2, _lease_s(run) / 3) < self._waiting_s:
            self._sooner.set()  # the lease loop sleeps longer than this run's lease allows

    def untrack(self, run: Run) -> None:
        claim = (run.row.id, run.token)
        if self._runs.pop(claim, None) is not None:
            self._ended[claim] = None
            if len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)  # O(1), where a dict's first key is not

    def holds(self, instance_id: str, token: int) -> bool:
        """A tracked run holds this claim of the instance: claimed here at `token`, its end
        not yet committed."""
        return (instance_id, token) in self._runs

    def ran(self, instance_id: str, token: int) -> bool:
        """A run of this process holds this claim, or held it (among the last `ENDED_KEPT`
        that ended). A claim of ours that no run ever held is one to adopt (its claim batch
        failed after the commit); one whose run ended is not, even when a duplicate delivery
        read the row before that run's commit and still finds it RUNNING."""
        claim = (instance_id, token)
        return claim in self._runs or claim in self._ended

    def entries(self) -> set[tuple[str, str]]:
        """(stream, entry id) of every delivery a tracked run holds, its duplicates included."""
        return {
            (d.stream, d.entry_id)
            for run, _ in self._runs.values()
            for d in (run.delivery, *run.duplicates)
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the liveness key and the leases until `stop` is set, each on a loop of its own.
        The liveness key is left to expire; `clear` removes it."""
        async with asyncio.TaskGroup() as loops:
            loops.create_task(self._loop(stop, "liveness", self.refresh, self._rest))
            loops.create_task(self._loop(stop, "leases", self.beat, self._pause))

    async def _loop(
        self,
        stop: asyncio.Event,
        part: str,
        step: Callable[[], Awaitable[None]],
        pause: Callable[[asyncio.Event], Awaitable[None]],
    ) -> None:
        while not stop.is_set():
            try:
                await self._beat_once(part, step)
            except Exception as exc:  # the loop must outlive any one beat
                self._log.error(
                    "heartbeat.failed",
                    part=part,
                    error_type=type(exc).__name__,
                    error=str(exc)[:300],
                )
            await pause(stop)

    async def _rest(self, stop: asyncio.Event) -> None:
        """Sleep `alive_interval_s`, or less when `stop` is set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=self.alive_interval_s)

    async def _pause(self, stop: asyncio.Event) -> None:
        """Sleep `interval_s`, or less when `stop` is set or a run with a shorter lease is
        tracked meanwhile (or was, during the beat before)."""
        self._waiting_s = self.interval_s
        woken = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._sooner.wait())]
        try:
            await asyncio.wait(woken, timeout=self._waiting_s, return_when=FIRST_COMPLETED)
        finally:
            for waiter in woken:
                waiter.cancel()
            self._waiting_s = math.inf

    async def _beat_once(self, part: str, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except (StoreUnavailable, *streams.DRIVER_ERRORS) as exc:
            self._log.warning(
                "heartbeat.dependency_down", part=part, error=streams.outage_text(exc)
            )
        except CommandDenied as exc:  # tried again at the next beat, as after an outage
            log_denied(self._log, exc, part=part)
        except ResponseError as exc:
            if not streams.group_missing(exc):
                raise
            await streams.ensure_groups(self._redis, self._keys)

    async def refresh(self) -> None:
        """Set the liveness key again, for the liveness TTL (Redis only)."""
        await streams.mark_alive(self._redis, self._keys, self._consumer, self._ttl_ms)

    async def beat(self) -> None:
        """Extend the leases when a third of the shortest has passed. The liveness key is not
        this beat's: it is refreshed however long the store takes here."""
        self._sooner.clear()
        if self._runs:
            await self._extend_due()

    async def _extend_due(self) -> None:
        now = self._clock.now_ms()
        shortest = min(_lease_s(run) for run, _ in self._runs.values())
        if not self._extend_now and now - self._last_extend_ms < shortest * 1000 / 3:
            return
        # Cleared before the extension: a run tracked while it is under way is not in it, and
        # asks again for the next beat.
        self._extend_now = False
        try:
            await self.extend()
        except BaseException:
            self._extend_now = True
            raise
        # Only once written: after a failed extension (store away) the next beat tries again,
        # instead of a third of a lease later when the sweeper may already see them expired.
        self._last_extend_ms = now

    async def extend(self) -> None:
        """Extend every tracked run's lease by its own lease length (store), cancel the runs
        that no longer hold one, then reset their entries' idle time (Redis). A run still going
        `OVERRUN_S` past its time limit (its agent ignored the cancellation) is let go: handed
        to `on_overrun` once and cancelled again, then neither extended nor touched."""
        runs = dict(self._runs)
        overran = overran_claims(runs, self._clock.now_ms())
        for claim in overran:
            run, task = runs[claim]
            if not run.overran and not run.fenced:
                self._let_go(run, task)
        kept = {claim: tracked for claim, tracked in runs.items() if claim not in overran}
        by_length: dict[float, list[tuple[str, int]]] = {}
        for claim, (run, _) in kept.items():
            by_length.setdefault(_lease_s(run), []).append(claim)
        held: set[tuple[str, int]] = set()
        for lease_s, claims in sorted(by_length.items()):
            held |= await self._store.extend_leases(claims, lease_s=lease_s)
        self._fence(kept, held)
        await streams.touch(self._redis, self._consumer, [run.delivery for run, _ in kept.values()])

    def _let_go(self, run: Run, task: asyncio.Task[None]) -> None:
        run.overran = True
        self._log.error(
            "instance.overran", instance_id=run.row.id, attempt=run.token, ends_by_ms=run.ends_by_ms
        )
        task.cancel()
        if self._on_overrun is not None:
            self._on_overrun(run)

    def _fence(
        self,
        runs: dict[tuple[str, int], tuple[Run, asyncio.Task[None]]],
        held: set[tuple[str, int]],
    ) -> None:
        for claim, (run, task) in runs.items():
            # A run whose agent returned is committing (or just committed): its commit decides,
            # and logs, whether it was fenced.
            if claim not in held and not task.done():
                if not run.fenced:  # once, though an agent that ignores it is cancelled again
                    self._log.warning(
                        "instance.fenced", instance_id=run.row.id, attempt=run.token, at="heartbeat"
                    )
                run.fenced = True
                task.cancel()

    @commands("DEL")
    async def clear(self) -> None:
        await self._redis.delete(self._keys.alive(self._consumer))


def overran_claims(
    runs: Mapping[tuple[str, int], tuple[Run, asyncio.Task[None]]], now_ms: int
) -> set[tuple[str, int]]:
    """Claims of `runs` whose agent is still going `OVERRUN_S` after its time limit at
    `now_ms` (epoch ms, the executor's clock)."""
    late = now_ms - round(OVERRUN_S * 1000)
    return {
        claim
        for claim, (run, task) in runs.items()
        if run.ends_by_ms is not None and run.ends_by_ms < late and not task.done()
    }


def _lease_s(run: Run) -> float:
    return run.spec.effective_lease_s if run.spec else DEFAULT_LEASE_S
