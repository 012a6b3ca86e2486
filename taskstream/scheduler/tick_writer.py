"""Writing what the scheduler decided for one tick: the instance a running decision emits,
the final decision record (only then is the tick done), the waiting decisions kept until they
are final, and the earlier runs a `replace` cancels.

Every write carries the leader's fencing token; a rejected write raises `Fenced`. A tick whose
own instance a pass made before it stopped (the store or Redis down before the record) is
recorded as it was done, never decided again into a second instance.
"""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from taskstream.core.outbox import Outbox
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import DecisionRow, Store
from taskstream.scheduler.emit import (
    created_earlier,
    emit_tick,
    ran_unrecorded,
    record_decision,
    record_missed,
)
from taskstream.scheduler.hold import released, waits_for
from taskstream.scheduler.leader import Fenced
from taskstream.scheduler.recall import TaskState
from taskstream.scheduler.replace import cancel_previous, replaced_ids
from taskstream.scheduler.verdict import MISSED, Decision


class TickWriter:
    """Records the decisions of one scheduler process. `token` is the leader token of the
    pass in progress (every task of a pass has the same); None without leadership (tests)."""

    def __init__(self, store: Store, outbox: Outbox, log: FilteringBoundLogger) -> None:
        self._store, self._outbox, self._log = store, outbox, log
        self.token: int | None = None

    async def settle(
        self, spec: TaskSpec, fire_ms: int, decision: Decision, now_ms: int, state: TaskState
    ) -> None:
        """`apply`, unless the decision runs nothing for a tick whose own instance a pass
        made and stopped before recording (catch-up checks the same): that tick ran."""
        emitted = fire_ms in state.emitted
        ran = None if emitted else await ran_unrecorded(self._store, spec, fire_ms, decision)
        if ran is None:
            await self.apply(spec, fire_ms, decision, now_ms, state)
        else:
            await self.done(spec, fire_ms, created_earlier(fire_ms), ran, now_ms, state)

    async def apply(
        self, spec: TaskSpec, fire_ms: int, decision: Decision, now_ms: int, state: TaskState
    ) -> None:
        emitted = state.emitted.get(fire_ms)
        if emitted is not None:
            # Emitted by a pass that failed before recording it: record what was done, as
            # deciding again could now say otherwise (or find its own instance a duplicate).
            await self.done(spec, fire_ms, *emitted, now_ms, state)
            return
        before = state.waiting.get(fire_ms)
        if not decision.final:
            # Recorded before it is remembered: a failed record is made again by the next pass.
            if before is None or waits_for(before) != waits_for(decision):
                await self.record(spec, fire_ms, decision, None, now_ms)
            state.waiting[fire_ms] = decision
            return
        decision = released(before, decision)
        instance_id = None
        if decision.runs:
            decision, instance_id = await self._run(spec, fire_ms, decision, now_ms, state)
        elif decision.decision == MISSED:
            instance_id = await record_missed(self._store, spec, fire_ms, token=self.token)
        await self.done(spec, fire_ms, decision, instance_id, now_ms, state)

    async def done(
        self,
        spec: TaskSpec,
        fire_ms: int,
        decision: Decision,
        instance_id: str | None,
        now_ms: int,
        state: TaskState,
    ) -> None:
        """Record a final decision; only then is the tick done. A pass that fails before (the
        store or Redis down) leaves the tick to the next pass. A run that replaces earlier
        ones cancels them here, after its own instance exists: a failed emit must not leave the
        task with neither."""
        if decision.runs:
            for replaced in replaced_ids(decision):
                await cancel_previous(self._store, replaced, by_fire_ms=fire_ms)
        await self.record(spec, fire_ms, decision, instance_id, now_ms)
        state.waiting.pop(fire_ms, None)
        state.decided.add(fire_ms)
        state.emitted.pop(fire_ms, None)

    async def _run(
        self, spec: TaskSpec, fire_ms: int, decision: Decision, now_ms: int, state: TaskState
    ) -> tuple[Decision, str]:
        """Emit the tick's instance; the decision as emitting it turned out is kept in `state`
        until it is recorded."""
        decision, instance_id = await emit_tick(
            self._store, self._outbox, spec, fire_ms, decision, now_ms, token=self.token
        )
        state.emitted[fire_ms] = (decision, instance_id)
        return decision, instance_id

    async def record(
        self, spec: TaskSpec, fire_ms: int, decision: Decision, instance_id: str | None, now_ms: int
    ) -> None:
        row = DecisionRow(
            spec.id,
            fire_ms,
            decision.decision,
            decision.reason,
            decision.details,
            instance_id,
            now_ms,
        )
        if not await record_decision(self._store, row, self._log, token=self.token):
            raise Fenced.refused("decision", spec.id)
