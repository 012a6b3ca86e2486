"""Running one claimed attempt: params, payload limit, deadline and timeout, the agent call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ValidationError
from structlog.typing import FilteringBoundLogger

from taskstream.agents.base import AgentContext
from taskstream.core.clock import Clock
from taskstream.core.logging import get_logger
from taskstream.core.states import FailClass
from taskstream.core.store.port import Store
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.intake import Run
from taskstream.executor.outcome import RunEnd, deferred, failed, final, succeeded
from taskstream.executor.retry import Failure
from taskstream.ratelimit.breaker import Outcome

DEFAULT_TIMEOUT_S = 60.0


async def execute(
    run: Run,
    *,
    store: Store,
    clock: Clock,
    max_payload_bytes: int,
    on_marker: Callable[[], Awaitable[None]] | None = None,
    gate: UpstreamGate | None = None,
    log: FilteringBoundLogger | None = None,
) -> RunEnd:
    """Run the agent of `run` once and say how it ended. Never raises but for cancellation.

    `log`: the process's bound logger; binding ids to it is much cheaper than a new one."""
    row = run.row
    log = (log or get_logger()).bind(instance_id=row.id, task_id=row.task_id, attempt=run.token)
    if run.attempts_used > run.max_attempts:
        return final(
            "attempts_exhausted",
            FailClass.EXHAUSTED,
            f"attempt {run.attempts_used} of at most {run.max_attempts}",
        )
    size = len(json.dumps(row.payload))
    if size > max_payload_bytes:
        return final(
            "payload_too_large",
            FailClass.POISON,
            f"payload is {size} bytes, limit {max_payload_bytes}",
        )
    try:
        params = run.agent.params_model.model_validate(row.payload)
    except ValidationError as exc:
        return final("bad_params", FailClass.FATAL, str(exc))
    timeout_s = run.spec.timeout if run.spec else DEFAULT_TIMEOUT_S
    if row.deadline_ms is not None:
        timeout_s = min(timeout_s, (row.deadline_ms - clock.now_ms()) / 1000)
    if timeout_s <= 0:
        return failed(TimeoutError("deadline passed before the run started"))
    ctx = AgentContext(
        instance_id=row.id,
        task_id=row.task_id,
        attempt=run.token,
        idempotency_key=row.dedupe_key,
        scheduled_for_ms=row.scheduled_for_ms,
        log=log,
        side_effects=run.side_effects,
        effect_done=store.side_effect_done,
        business_date=row.business_date,
        set_marker=_marker_setter(store, on_marker),
    )
    upstreams = run.spec.upstreams if run.spec else ()
    if gate is not None and upstreams:
        wait_ms = await gate.admit(upstreams)
        if wait_ms is not None:
            return deferred(wait_ms)
    end = await _call(run, ctx, params, timeout_s)
    if gate is not None and upstreams:
        await gate.record(upstreams, _breaker_outcome(end))
    return end


async def _call(run: Run, ctx: AgentContext, params: BaseModel, timeout_s: float) -> RunEnd:
    try:
        async with asyncio.timeout(timeout_s):
            result = await run.agent.run(ctx, params)
    except Exception as exc:  # every failure of agent code becomes an outcome
        ctx.log.warning("instance.run_failed", error_type=type(exc).__name__)
        return failed(exc)
    return succeeded(result)


def _breaker_outcome(end: RunEnd) -> Outcome:
    """Retriable errors and timeouts count against an upstream; fatal ones are the task's."""
    if end.failure is None:
        return Outcome.SUCCESS
    if end.failure in (Failure.RETRIABLE, Failure.TIMEOUT):
        return Outcome.FAILURE
    return Outcome.IGNORE


def _marker_setter(
    store: Store, on_marker: Callable[[], Awaitable[None]] | None
) -> Callable[[str, str], Awaitable[bool]]:
    async def mark(name: str, business_date: str) -> bool:
        marked = await store.mark_ready(name, business_date)
        if on_marker is not None:
            await on_marker()
        return marked

    return mark
