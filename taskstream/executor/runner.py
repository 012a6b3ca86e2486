"""Running one claimed attempt: params, payload limit, deadline and timeout, the agent call."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError
from structlog.typing import FilteringBoundLogger

from taskstream.agents.base import AgentContext
from taskstream.agents.errors import UpstreamDeferred
from taskstream.agents.upstream import UpstreamClient
from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.errors import QueueUnavailable, StoreUnavailable
from taskstream.core.futures import detached
from taskstream.core.logging import get_logger
from taskstream.core.states import FailClass
from taskstream.core.store.port import Store
from taskstream.core.store.records import stored_json, stored_payload_bytes
from taskstream.executor.admission import GIVE_BACK_S, UpstreamGate
from taskstream.executor.intake import Run
from taskstream.executor.outcome import RunEnd, deferred, failed, final, succeeded, timed_out
from taskstream.executor.retry import Failure
from taskstream.executor.run_context import agent_context
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.breaker import Outcome

DEFAULT_TIMEOUT_S = 60.0
ADMISSION_RETRY_MS = 1000
"""Wait before a run whose admission could not be decided (Redis or the store down) is
tried again (ms)."""
SETTLE_S = 5.0
"""Longest wait for the breakers to take an ended run's outcome (Redis); s."""
UNAVAILABLE = (QueueUnavailable, StoreUnavailable, *streams.DRIVER_ERRORS)


@dataclass(frozen=True, slots=True)
class RunEnv:
    """What every run of one executor process shares. `log` is the process's bound logger
    (binding a run's ids to it is much cheaper than a new logger); `http` is the process's
    connection pool for upstream calls (None: each run opens its own)."""

    store: Store
    clock: Clock
    max_payload_bytes: int
    on_marker: Callable[[], Awaitable[None]] | None = None
    gate: UpstreamGate | None = None
    log: FilteringBoundLogger | None = None
    http: httpx.AsyncClient | None = None


async def execute(run: Run, env: RunEnv) -> RunEnd:
    """Run the agent of `run` once and say how it ended. Never raises but for cancellation."""
    row = run.row
    log = (env.log or get_logger()).bind(instance_id=row.id, task_id=row.task_id, attempt=run.token)
    if run.attempts_used > run.max_attempts:
        return final(
            "attempts_exhausted",
            FailClass.EXHAUSTED,
            f"attempt {run.attempts_used} of at most {run.max_attempts}",
        )
    size = stored_payload_bytes(run.claimed)
    if size > env.max_payload_bytes:
        return final(
            "payload_too_large",
            FailClass.POISON,
            f"payload is {size} bytes, limit {env.max_payload_bytes}",
        )
    try:
        params = params_of(run.agent.params_model, row.payload)
    except ValidationError as exc:
        return final("bad_params", FailClass.FATAL, params_problem(exc))
    timeout_s = run.spec.timeout if run.spec else DEFAULT_TIMEOUT_S
    if time_limit(timeout_s, row.deadline_ms, env.clock.now_ms()).seconds <= 0:
        return timed_out(TOO_LATE, at_deadline=True)
    return await _admitted_call(run, log, params, timeout_s, env)


def params_of(model: type[BaseModel], payload: dict[str, Any]) -> BaseModel:
    """`payload` as `model` reads it. A payload is JSON, so it is read as pydantic reads JSON
    when the plain read fails: a strict model takes a date, an enum or a tuple from its JSON
    form there (a string, a list), where it refuses them as Python objects. The plain read
    first costs nothing when it passes, the usual case. `ValidationError` (the JSON read's)
    when the payload does not validate."""
    try:
        return model.model_validate(payload)
    except ValidationError:
        return model.model_validate_json(stored_json(payload))


def params_problem(exc: ValidationError) -> str:
    """Why a payload does not validate, one line per field: its path and what is wrong, never
    the value given (a payload may carry a credential, and the text is stored and shown)."""
    count = exc.error_count()
    lines = [f"{count} validation error{'s' if count != 1 else ''} for {exc.title}"]
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in error["loc"]) or "payload"
        lines.append(f"{where}: {error['msg']}")
    return "\n".join(lines)


TOO_LATE = "deadline passed before the run started"
"""Why an attempt whose deadline came before its agent could be called ended."""


@dataclass(frozen=True, slots=True)
class TimeLimit:
    """How long (s) this attempt may run, and what set it: the task's `timeout` or the
    instance's deadline, when that comes first."""

    seconds: float
    source: str

    def expired(self) -> str:
        """Why an attempt that ran past this limit ended (in its `last_error`)."""
        return f"the attempt ran past its {self.source} ({self.seconds:g} s)"

    def ended(self) -> RunEnd:
        """The end of an attempt that ran past this limit: a timeout, at the deadline when
        the deadline set the limit."""
        return timed_out(self.expired(), at_deadline=self.source == "deadline")


def time_limit(timeout_s: float, deadline_ms: int | None, now_ms: int) -> TimeLimit:
    """The attempt's limit at `now_ms`: the task's `timeout_s`, or the seconds left before
    `deadline_ms` (epoch ms) when fewer (zero or negative: the deadline has passed)."""
    if deadline_ms is not None and (deadline_ms - now_ms) / 1000 < timeout_s:
        return TimeLimit((deadline_ms - now_ms) / 1000, "deadline")
    return TimeLimit(timeout_s, "timeout")


async def _admitted_call(
    run: Run,
    log: FilteringBoundLogger,
    params: BaseModel,
    timeout_s: float,
    env: RunEnv,
) -> RunEnd:
    """Admit the run to its declared upstreams (deferred when refused), run the agent with an
    HTTP client bound to the gate within its time limit (`timeout_s`, or less before the
    deadline), then record the outcomes no call recorded itself."""
    admitted = None if env.gate is None else await _admission(env.gate, run.upstreams, log)
    if isinstance(admitted, RunEnd):
        return admitted
    access = admitted
    # From here the agent's own timer runs: time spent in admission is not time it overran,
    # but it is time gone before the deadline, so the limit is taken now.
    limit = time_limit(timeout_s, run.row.deadline_ms, env.clock.now_ms())
    if limit.seconds <= 0:
        return await _too_late(access, log)
    http = UpstreamClient(access, http=env.http, log=log, clock=env.clock)
    ctx = agent_context(run, env.store, env.on_marker, log, http)
    run.ends_by_ms = env.clock.now_ms() + math.ceil(limit.seconds * 1000)
    try:
        end = await _call(run, ctx, params, limit)
    except asyncio.CancelledError:
        if access is not None and access.unsettled:  # a trial slot it took must not stay taken
            await _give_back(access, log)
        raise
    finally:
        await ctx.http.aclose()
    if access is None or not access.unsettled:  # a run with no upstreams, say: no I/O to wait on
        return end
    try:
        wait_ms = await _settle(access, _breaker_outcome(end))
    except Exception as exc:
        # The agent has run: its end stands; only the breakers miss this outcome.
        log.warning("upstream.settle_failed", error_type=type(exc).__name__, error=str(exc)[:300])
        return end
    if wait_ms is None:
        return end
    # This run's failure opened (or kept open) an upstream's breaker: the outage is known,
    # so the run waits it out without spending an attempt, as a failed call through ctx.http.
    # A longer wait the failure itself asked for (a `Retry-After`) is honoured, as the HTTP
    # client does for a call whose failure left the breaker open.
    return replace(deferred(max(wait_ms, end.retry_after_ms or 0)), error=end.error)


async def _too_late(access: RunUpstreams | None, log: FilteringBoundLogger) -> RunEnd:
    """The end of a run whose deadline passed while it was admitted: its agent is not called,
    and what its admission took is given back, window slots included (no call went out)."""
    if access is not None and access.unsettled:
        try:
            await access.withdraw()
        except Exception as exc:  # the slots then free when their window or trial passes
            log.warning("upstream.give_back_failed", error_type=type(exc).__name__)
    return timed_out(TOO_LATE, at_deadline=True)


async def _settle(access: RunUpstreams, outcome: Outcome) -> int | None:
    """`access.settle(outcome)` for a run whose agent has ended, within `SETTLE_S`, shielded:
    a stop's grace or a fence cancelling the run meanwhile must not drop its end (a released
    run would run again). Then the settle goes on alone and its wait (ms) is not used."""
    try:
        return await asyncio.shield(detached(access.settle(outcome), SETTLE_S))
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # taken: the cancellation ends nothing more of this run
        return None


async def _admission(
    gate: UpstreamGate, upstreams: tuple[str, ...], log: FilteringBoundLogger
) -> RunUpstreams | RunEnd:
    """The gate bound for the run when it may call its upstreams now; else how it ends."""
    try:
        admitted = await gate.admit_run(upstreams) if upstreams else gate.bind(())
    except UNAVAILABLE as exc:
        # Admission cannot be decided: wait, as for a refusal, without spending an attempt.
        log.warning("upstream.admission_unavailable", error=str(exc)[:300])
        return deferred(ADMISSION_RETRY_MS)
    except Exception as exc:  # an unexpected error: a retriable failure, attempts bound it
        log.error("upstream.admission_failed", error_type=type(exc).__name__)
        return failed(exc)
    if isinstance(admitted, int):
        return deferred(admitted)
    return admitted


AGENT_FAILURES = (BaseException,)
"""What agent code may raise, caught after a cancellation (which is handled first): not only
an `Exception`. `sys.exit()` or a stray `KeyboardInterrupt` from an agent fails its attempt,
not the executor (asyncio would let them out of the event loop, stopping every run of the
process); `GeneratorExit` or a library's own `BaseException` (gevent's `Timeout`, say) fails
it too, where it would end the run's task with no outcome, its run RUNNING until its lease
ran out."""


async def _call(run: Run, ctx: AgentContext, params: BaseModel, limit: TimeLimit) -> RunEnd:
    timer = asyncio.timeout(limit.seconds)
    try:
        async with timer:
            result = await run.agent.run(ctx, params)
    except TimeoutError as exc:
        ctx.log.warning("instance.run_failed", error_type="TimeoutError")
        # asyncio's own TimeoutError says nothing; name the limit the attempt ran past.
        return limit.ended() if timer.expired() else failed(exc)
    except UpstreamDeferred as exc:  # a call refused by its limiter or breaker: not an attempt
        _raise_if_cut_short(exc)
        ctx.log.info("instance.upstream_deferred", upstream=exc.upstream)
        return deferred(exc.retry_after_ms)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the run itself is cancelled: a stop or a fence
        # Work of the agent's own was cancelled and it let that out: a failure like another.
        ctx.log.warning("instance.run_failed", error_type="CancelledError")
        return failed(exc)
    except AGENT_FAILURES as exc:  # every failure of agent code becomes an outcome
        _raise_if_cut_short(exc)
        if timer.expired():  # it raised something else on its way out of the time limit
            ctx.log.warning("instance.run_failed", error_type="TimeoutError")
            return limit.ended()
        ctx.log.warning("instance.run_failed", error_type=type(exc).__name__)
        return failed(exc)
    return succeeded(result)


def _raise_if_cut_short(exc: BaseException) -> None:
    """A cancellation when the run itself is being cancelled (a stop, a fence) and its agent
    let out something else on the way (a cleanup that failed, a wrapper of every error): the
    run was cut short, to be released or dropped, not failed as an attempt."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def _give_back(access: RunUpstreams, log: FilteringBoundLogger) -> None:
    """Settle a cancelled run's admission as saying nothing (its half-open trial slots
    freed), within `GIVE_BACK_S` and shielded from the cancellation; best effort. Its window
    slots stay: the agent ran, and may have made its calls with HTTP code of its own."""
    try:
        await asyncio.shield(detached(access.settle(Outcome.IGNORE), GIVE_BACK_S))
    except Exception as exc:  # the slots then free when their trial times out
        log.warning("upstream.give_back_failed", error_type=type(exc).__name__)


def _breaker_outcome(end: RunEnd) -> Outcome:
    """Retriable errors and timeouts count against an upstream; fatal ones are the task's, and
    a deferred run said nothing about its upstreams."""
    if end.defer_ms is not None:
        return Outcome.IGNORE
    if end.failure is None:
        return Outcome.SUCCESS
    if end.failure in (Failure.RETRIABLE, Failure.TIMEOUT):
        return Outcome.FAILURE
    return Outcome.IGNORE
