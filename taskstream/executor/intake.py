"""Intake: turn a batch of deliveries into claimed runs.

Entries that do not decode, name an unknown agent, or name an instance whose row cannot be
read (`unreadable`), are dead-lettered (the second and third also fail the instance as
poison, the third when its row allows). The rest are claimed in one store transaction (CAS
DISPATCHED -> RUNNING with attempt + 1, the fencing token); an entry seen before its
PENDING/RETRYING -> DISPATCHED step has that step completed by the claim (its XADD evidently
happened). A lost claim is a duplicate delivery: acked when the instance is settled; one
whose row has become claimable since is claimed again; an instance this consumer claimed
but runs nowhere (its batch failed after the claim committed) is adopted and run with the
token it holds; anything else is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from taskstream.agents.base import Agent
from taskstream.agents.registry import Registry, UnknownAgent
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.errors import CommandDenied, ProtocolError, StoreCorrupt
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys, WorkEntry, decode
from taskstream.core.spec import TaskSpec
from taskstream.core.spec_parts import RetryPolicy
from taskstream.core.states import AWAITING_CLAIM, SETTLED, Status
from taskstream.core.store.port import Claimed, ClaimRequest, InstanceRow, Store
from taskstream.executor import letters, unreadable
from taskstream.executor.claims import WonClaims
from taskstream.executor.letters import owed_letter
from taskstream.executor.retry import attempts_used, policy_of
from taskstream.executor.strangers import Strangers

DEFAULT_LEASE_S = 150.0


@dataclass(slots=True)
class Run:
    """One claimed attempt: where it came from, what it runs, and its fencing token."""

    delivery: streams.Delivery
    entry: WorkEntry
    agent: Agent
    spec: TaskSpec | None
    claimed: Claimed
    side_effects: list[str] = field(default_factory=list)
    fenced: bool = False
    duplicates: list[streams.Delivery] = field(default_factory=list)
    """Other deliveries of the same attempt read in the same batch: acked with this run."""
    given_back: int = 0
    """Earlier attempts that do not count: released unrun, or before a manual requeue."""
    ends_by_ms: int | None = None
    """When the attempt's time limit ends (epoch ms, the executor's clock); set as it starts."""
    overran: bool = False
    """Its agent went on `heartbeat.OVERRUN_S` past the time limit, ignoring the cancellation:
    the attempt's end was queued as a timeout, and whatever the agent does later is dropped."""

    @property
    def token(self) -> int:
        return self.claimed.token

    @property
    def attempts_used(self) -> int:
        """Attempts of this instance that count against `max_attempts`, this one included."""
        return self.token - self.given_back

    @property
    def policy(self) -> RetryPolicy:
        """The task's retry policy; when no stored definition names the task, the default
        policy with the attempt limit stored with the instance."""
        return policy_of(self.spec, self.row.max_attempts)

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The upstreams the task declares (first = the main one)."""
        return self.spec.upstreams if self.spec else ()

    @property
    def row(self) -> InstanceRow:
        return self.claimed.row


async def count_budgets(store: Store, runs: Sequence[Run]) -> None:
    """Read which earlier attempts of each run count (`Run.attempts_used`) from its history:
    those released unrun or before a manual requeue do not. One read for the retries among
    `runs` (attempt above 1), so a batch of runs released together and claimed again does
    not read one history after another; first attempts, the bulk of the work, read nothing."""
    retried = [run for run in runs if run.token > 1]
    if not retried:
        return
    histories = await store.histories([run.row.id for run in retried])
    for run in retried:
        history = [(h.reason, h.attempt) for h in histories.get(run.row.id, [])]
        run.given_back = run.token - attempts_used(run.token, history)


@dataclass(frozen=True, slots=True)
class _Candidate:
    delivery: streams.Delivery
    entry: WorkEntry
    agent: Agent


class Intake:
    """Decodes and claims deliveries for one consumer."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        registry: Registry,
        defs: DefinitionCache,
        consumer: str,
        *,
        held: Callable[[str, int], bool],
    ) -> None:
        """`held(instance_id, token)`: a run of this process holds or held that claim of the
        instance (running, its end waiting to commit, or ended), so it is not to be adopted."""
        self._store, self._redis, self._keys = store, redis, keys
        self._registry, self._defs, self._consumer = registry, defs, consumer
        self._held = held
        self._claims: WonClaims[_Candidate] = WonClaims(lambda c: c.entry.instance_id)
        self._strangers = Strangers(store, consumer, ack=self._ack_duplicate, dead=self.dead)
        self._log = get_logger(role="executor", consumer=consumer)

    async def admit(self, deliveries: list[streams.Delivery]) -> list[Run]:
        """Claim what can be claimed; settle or leave the rest."""
        found = [c for d in deliveries if (c := await self._candidate(d)) is not None]
        if any(self._defs.get(c.entry.task_id) is None for c in found):
            # A task applied since the last check: without its spec the run would get the
            # defaults (one attempt, the default timeout and lease, no upstream admission).
            await self._defs.refresh(force=True)
        candidates, dupes = _split_duplicates(found)
        if not candidates:
            return []
        won = self._claims.start(candidates)
        won.update(await self._claim(candidates))
        lost = [c for c in candidates if c.entry.instance_id not in won]
        if lost:
            retried = await self._after_lost(lost, won)
            won.update(await self._claim(retried) if retried else {})
        runs = self._runs(candidates, won)
        # An entry of another attempt of an instance claimed in this batch (a stale one read
        # with the current one) is acked with the run, as a repeat is.
        dupes += [c for c in candidates if c.entry.instance_id in won and not _claimed_by(c, won)]
        for dupe in dupes:
            if (owner := runs.get(dupe.entry.instance_id)) is not None:
                owner.duplicates.append(dupe.delivery)
        # Earlier attempts given back (released, deferred, before a requeue) count neither
        # against the limit nor towards the backoff; a first attempt has none.
        await count_budgets(self._store, list(runs.values()))
        self._claims.done()
        return list(runs.values())

    async def unstarted(self, wait_s: float) -> tuple[list[Run], list[tuple[str, int]]]:
        """Runs, never started, for the claims of an admission that a stop cancelled after
        they were won (`WonClaims`), for the caller to hand back; and the claims, as
        (instance id, token), that may have landed unseen (their reply was lost in a store
        outage), for the caller to note."""
        candidates, won, unsure = await self._claims.unstarted(wait_s)
        maybe = [(c.entry.instance_id, c.entry.attempt + 1) for c in unsure]
        return list(self._runs(candidates, won).values()), maybe

    def _runs(self, candidates: list[_Candidate], won: Mapping[str, Claimed]) -> dict[str, Run]:
        return {
            c.entry.instance_id: Run(
                c.delivery,
                c.entry,
                c.agent,
                self._defs.get(c.entry.task_id),
                won[c.entry.instance_id],
            )
            for c in candidates
            if _claimed_by(c, won)
        }

    async def _candidate(self, delivery: streams.Delivery) -> _Candidate | None:
        try:
            entry = decode(delivery.fields)
        except ProtocolError as exc:
            await self.dead(delivery, exc.reason, exc.detail)
            return None
        try:
            return _Candidate(delivery, entry, self._registry.get(entry.agent))
        except UnknownAgent:
            await self._strangers.fail(delivery, entry)
            return None

    async def _claim(self, candidates: list[_Candidate]) -> dict[str, Claimed]:
        requests = [
            ClaimRequest(c.entry.instance_id, c.entry.attempt, self._lease_s(c.entry.task_id))
            for c in candidates
        ]
        won = await self._claims.call(
            self._store.claim_many(requests, owner=self._consumer), candidates
        )
        if won:
            # One line per batch: at thousands of runs per second a line per run would cost
            # more CPU than the run itself. Each run is named `id@attempt`.
            self._log.info(
                "instances.claimed",
                count=len(won),
                runs=[f"{i}@{c.token}" for i, c in won.items()],
            )
        return won

    def _lease_s(self, task_id: str) -> float:
        spec = self._defs.get(task_id)
        return spec.effective_lease_s if spec else DEFAULT_LEASE_S

    async def _after_lost(
        self, lost: list[_Candidate], won: dict[str, Claimed]
    ) -> list[_Candidate]:
        """Settle lost claims; return those worth claiming again. Our own claims are adopted
        into `won` as each is found, so a stop cancelling this still hands them back."""
        again: list[_Candidate] = []
        for c in lost:
            try:
                row = await self._store.get_instance(c.entry.instance_id)
            except StoreCorrupt as exc:  # the claim left it: poison (`unreadable`)
                await unreadable.set_aside(
                    self._store, self._log, c.entry, exc, owner=self._consumer
                )
                await self.dead(c.delivery, unreadable.CORRUPT_ROW, str(exc))
                continue
            if row is None:
                await self.dead(c.delivery, "unknown_instance", c.entry.instance_id)
            elif (claim := self._ours(row, c.entry)) is not None:
                won[row.id] = claim
                self._log.warning("instance.adopted", instance_id=row.id, attempt=row.attempt)
            elif _claimable(row, c.entry):
                again.append(c)  # the claim itself completes a dispatch still to land
            elif (owed := await owed_letter(self._store, c.entry.attempt, row)) is not None:
                # Failed as poison by the sweeper, whose move of this entry to the dead-letter
                # stream did not happen (Redis failed): the entry is still that letter.
                await self.dead(c.delivery, owed, "swept")
            elif _done_with(row, c.entry):
                await self._ack_duplicate(c.delivery, row.id, row.status)
            else:
                self._log.info(
                    "instance.claim_lost",
                    instance_id=row.id,
                    status=row.status,
                    attempt=row.attempt,
                )
        return again

    def _ours(self, row: InstanceRow, entry: WorkEntry) -> Claimed | None:
        """The claim to adopt when the entry's attempt is RUNNING under a claim of this
        consumer that no run of this process holds or held: the batch that claimed it failed
        after its commit (or the commit's reply was lost), so nobody would run it before its
        lease expires. None otherwise."""
        expires = row.lease_expires_at_ms
        if row.status is not Status.RUNNING or row.attempt != entry.attempt + 1 or expires is None:
            return None
        if row.lease_owner != self._consumer or self._held(row.id, row.attempt):
            return None
        return Claimed(token=row.attempt, lease_expires_at_ms=expires, row=row)

    async def _ack_duplicate(
        self, delivery: streams.Delivery, instance_id: str, status: Status | None
    ) -> None:
        """Ack an entry nothing is left to do for (its instance moved on without it)."""
        try:
            await streams.ack(self._redis, delivery.stream, delivery.entry_id)
        except CommandDenied as exc:
            letters.left_pending(self._log, delivery, exc)
            return
        self._log.info("instance.duplicate_acked", instance_id=instance_id, status=status)

    async def dead(self, delivery: streams.Delivery, reason: str, detail: str) -> None:
        """Move an entry to the dead-letter stream with its reason, unless another mover (the
        sweeper) took it from the pending list first (`letters.dead_letter`)."""
        try:
            await letters.dead_letter(self._redis, self._keys, self._log, delivery, reason, detail)
        except CommandDenied as exc:
            letters.left_pending(self._log, delivery, exc)


def _claimed_by(c: _Candidate, won: Mapping[str, Claimed]) -> bool:
    """The claim won for the instance of `c` is that of its entry's attempt."""
    claimed = won.get(c.entry.instance_id)
    return claimed is not None and claimed.token == c.entry.attempt + 1


def _split_duplicates(found: list[_Candidate]) -> tuple[list[_Candidate], list[_Candidate]]:
    """First delivery of each (instance, attempt) in a batch, and the repeats."""
    seen: set[tuple[str, int]] = set()
    first: list[_Candidate] = []
    repeats: list[_Candidate] = []
    for c in found:
        key = (c.entry.instance_id, c.entry.attempt)
        (repeats if key in seen else first).append(c)
        seen.add(key)
    return first, repeats


def _claimable(row: InstanceRow, entry: WorkEntry) -> bool:
    """The entry is for the row's next attempt, which another try of the claim can take: the
    row is DISPATCHED, or still PENDING/RETRYING (the outbox's CAS had not landed; the entry
    is on the stream, so its XADD happened, and `claim_many` completes that step)."""
    return row.status in AWAITING_CLAIM and row.attempt == entry.attempt


def _done_with(row: InstanceRow, entry: WorkEntry) -> bool:
    """True when nothing remains to do for this entry: the instance is settled, or moved past
    the entry's attempt (a run of that attempt still in progress elsewhere does not count)."""
    if row.status in SETTLED:
        return True
    running_it = row.status is Status.RUNNING and row.attempt == entry.attempt + 1
    return row.attempt > entry.attempt and not running_it
