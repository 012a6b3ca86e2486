"""The context an agent is called with: a run's ids, and its side effect and marker calls,
each fenced by the run's claim."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from structlog.typing import FilteringBoundLogger

from taskstream.agents.base import AgentContext
from taskstream.agents.upstream import UpstreamClient
from taskstream.core.errors import ClaimLost
from taskstream.core.store.port import Store
from taskstream.executor.intake import Run


def agent_context(
    run: Run,
    store: Store,
    on_marker: Callable[[], Awaitable[None]] | None,
    log: FilteringBoundLogger,
    http: UpstreamClient,
) -> AgentContext:
    """The context `run`'s agent is called with: its ids, its fencing token, and the side
    effect and marker calls fenced by its claim."""
    row = run.row
    return AgentContext(
        instance_id=row.id,
        task_id=row.task_id,
        attempt=run.token,
        idempotency_key=row.dedupe_key,
        scheduled_for_ms=row.scheduled_for_ms,
        log=log,
        side_effects=run.side_effects,
        effect_done=_effect_checker(run, store),
        business_date=row.business_date,
        set_marker=_marker_setter(store, on_marker, (row.id, run.token)),
        upstreams=run.upstreams,
        http=http,
    )


def _effect_checker(run: Run, store: Store) -> Callable[[str], Awaitable[bool]]:
    """`once`'s check of a side effect key, refused (`ClaimLost`, ending the agent) once the
    run's attempt has ended without it: fenced, or past its time limit with its end already
    committed. An effect it started then would be committed by no one, and done again."""

    def refuse_when_ended() -> None:
        if run.fenced or run.overran:
            raise ClaimLost(
                f"instance {run.row.id} attempt {run.token} has ended"
                f" ({'fenced' if run.fenced else 'past its time limit'}): no side effect may start"
            )

    async def done(key: str) -> bool:
        refuse_when_ended()
        found = await store.side_effect_done(key)
        refuse_when_ended()  # it may have ended while the store answered
        return found

    return done


def _marker_setter(
    store: Store, on_marker: Callable[[], Awaitable[None]] | None, claim: tuple[str, int]
) -> Callable[[str, str], Awaitable[bool]]:
    """Markers fenced by the run's claim: a run whose lease lapsed and whose instance moved
    on (a zombie) releases no dependent task (`ClaimLost` ends its agent)."""

    async def mark(name: str, business_date: str) -> bool:
        marked = await store.mark_ready(name, business_date, claim=claim)
        if on_marker is not None:
            await on_marker()
        return marked

    return mark
