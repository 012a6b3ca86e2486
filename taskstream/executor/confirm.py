"""Whether a finish that lost its CAS after a retried commit had in fact landed."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from taskstream.core.errors import StoreError
from taskstream.core.states import Status
from taskstream.core.store.port import CasResult, FinishRequest, Store
from taskstream.core.store.records import made_move


async def landed(
    store: Store, finish: FinishRequest, result: CasResult, log: FilteringBoundLogger
) -> bool:
    """After a retried commit, whether a lost CAS lost to this very run: an earlier try was
    applied but its answer was lost (the link dropped after the server's COMMIT). The proof
    is the run's own move in the history: RUNNING -> its end, at its token, under its owner,
    with its reason; only the lease holder writes that move, once per token. A store error
    here leaves the run fenced, as before (the sweeper acks it)."""
    if result.found is not finish.dst:
        return False
    try:
        history = await store.history(finish.instance_id)
    except StoreError:
        return False
    mine = made_move(
        history,
        finish.dst,
        attempt=finish.token,
        owner=finish.owner,
        reason=finish.reason,
        from_status=Status.RUNNING,
    )
    if not mine:
        return False
    log.info("instance.commit_confirmed", instance_id=finish.instance_id, attempt=finish.token)
    return True
