"""Handling one delivery: decode, claim (CAS + fencing token), run the agent, commit, ack.

A delivery is acknowledged only after its outcome is committed, or when the store shows there
is nothing left to do for it. Entries that cannot be handled at all go to the dead-letter
stream with a reason; the loop never crashes on them.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from pydantic import ValidationError

from taskstream.agents.base import Agent, AgentContext
from taskstream.agents.registry import Registry, UnknownAgent
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.errors import ProtocolError
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys, WorkEntry, decode
from taskstream.core.states import SETTLED, FailClass, Status
from taskstream.core.store.port import Claim, InstanceRow, Store
from taskstream.executor.outcome import Outcome, failed, succeeded

if TYPE_CHECKING:
    from taskstream.executor.service import ExecutorConfig

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_LEASE_S = 150.0


class Handler:
    """Handles deliveries for one executor process."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        registry: Registry,
        defs: DefinitionCache,
        config: ExecutorConfig,
    ) -> None:
        self._store = store
        self._redis = redis
        self._keys = keys
        self._registry = registry
        self._defs = defs
        self._config = config
        self._log = get_logger(role="executor", consumer=config.consumer)

    async def handle(self, delivery: streams.Delivery) -> None:
        """Handle one delivery to completion or to a deliberate 'leave it'."""
        try:
            entry = decode(delivery.fields)
        except ProtocolError as exc:
            await self._dead(delivery, exc.reason, exc.detail)
            return
        try:
            agent = self._registry.get(entry.agent)
        except UnknownAgent:
            await self._poison_unclaimed(delivery, entry, "unknown_agent")
            return
        spec = self._defs.get(entry.task_id)
        lease_s = spec.effective_lease_s if spec else DEFAULT_LEASE_S
        claim = await self._claim(delivery, entry, lease_s)
        if claim is None:
            return
        row = await self._store.get_instance(entry.instance_id)
        if row is None:
            return
        timeout_s = spec.timeout if spec else DEFAULT_TIMEOUT_S
        outcome = await self._run(agent, entry, row, claim, timeout_s)
        await asyncio.shield(self._commit(delivery, entry, claim, outcome))

    async def _claim(
        self, delivery: streams.Delivery, entry: WorkEntry, lease_s: float
    ) -> Claim | None:
        """CAS DISPATCHED -> RUNNING. A lost claim is a duplicate delivery: ack it when the
        instance is settled, else leave it for its owner or the sweeper."""
        claim = await self._try_claim(entry, lease_s)
        if claim is not None:
            return claim
        row = await self._store.get_instance(entry.instance_id)
        if row is None:
            await self._dead(delivery, "unknown_instance", entry.instance_id)
            return None
        if row.status is Status.PENDING:
            # The entry is on the stream, so its XADD happened: finish the outbox step here.
            await self._store.transition(
                row.id,
                Status.PENDING,
                Status.DISPATCHED,
                reason="seen_on_stream",
                attempt=entry.attempt,
            )
            claim = await self._try_claim(entry, lease_s)
            if claim is not None:
                return claim
            row = await self._store.get_instance(entry.instance_id) or row
        log = self._log.bind(instance_id=row.id, task_id=row.task_id)
        if row.status in SETTLED:
            await streams.ack(self._redis, delivery.stream, delivery.entry_id)
            log.info("instance.duplicate_acked", status=row.status)
        else:
            log.info("instance.claim_lost", status=row.status, attempt=row.attempt)
        return None

    async def _try_claim(self, entry: WorkEntry, lease_s: float) -> Claim | None:
        claim = await self._store.claim(
            entry.instance_id,
            expected_attempt=entry.attempt,
            owner=self._config.consumer,
            lease_s=lease_s,
        )
        if claim is not None:
            self._log.info(
                "instance.claimed",
                instance_id=entry.instance_id,
                task_id=entry.task_id,
                attempt=claim.token,
            )
        return claim

    async def _run(
        self, agent: Agent, entry: WorkEntry, row: InstanceRow, claim: Claim, timeout_s: float
    ) -> Outcome:
        log = self._log.bind(instance_id=row.id, task_id=row.task_id, attempt=claim.token)
        if len(json.dumps(row.payload)) > self._config.max_payload_bytes:
            return Outcome(
                Status.FAILED,
                "payload_too_large",
                None,
                FailClass.POISON,
                f"payload over {self._config.max_payload_bytes} bytes",
            )
        try:
            params = agent.params_model.model_validate(row.payload)
        except ValidationError as exc:
            return Outcome(Status.FAILED, "bad_params", None, FailClass.FATAL, str(exc)[:2000])
        ctx = AgentContext(
            instance_id=row.id,
            task_id=row.task_id,
            attempt=claim.token,
            idempotency_key=row.dedupe_key,
            scheduled_for_ms=row.scheduled_for_ms,
            log=log,
        )
        try:
            async with asyncio.timeout(timeout_s):
                result = await agent.run(ctx, params)
        except Exception as exc:  # every failure of agent code becomes an outcome
            log.warning("instance.run_failed", error_type=type(exc).__name__)
            return failed(exc)
        return succeeded(result)

    async def _commit(
        self, delivery: streams.Delivery, entry: WorkEntry, claim: Claim, outcome: Outcome
    ) -> None:
        log = self._log.bind(
            instance_id=entry.instance_id, task_id=entry.task_id, attempt=claim.token
        )
        cas = await self._store.finish(
            entry.instance_id,
            token=claim.token,
            dst=outcome.status,
            reason=outcome.reason,
            result=outcome.result,
            fail_class=outcome.fail_class,
            error=outcome.error,
        )
        if not cas.ok:
            log.warning("instance.fenced", found=cas.found)
            return
        if outcome.fail_class is FailClass.POISON:
            await self._dead(delivery, outcome.reason, outcome.error or "")
        else:
            await streams.ack(self._redis, delivery.stream, delivery.entry_id)
        log.info("instance.committed", status=outcome.status, fail_class=outcome.fail_class)

    async def _poison_unclaimed(
        self, delivery: streams.Delivery, entry: WorkEntry, reason: str
    ) -> None:
        await self._store.transition(
            entry.instance_id,
            Status.DISPATCHED,
            Status.FAILED,
            reason=reason,
            attempt=entry.attempt,
            fail_class=FailClass.POISON,
            error=f"{reason}: {entry.agent}",
        )
        await self._dead(delivery, reason, entry.agent)

    async def _dead(self, delivery: streams.Delivery, reason: str, detail: str) -> None:
        dead_id = await streams.dead_letter(self._redis, self._keys, delivery, reason, detail)
        self._log.warning(
            "entry.dead_lettered",
            entry_id=delivery.entry_id,
            stream=delivery.stream,
            reason=reason,
            dead_id=dead_id,
        )
