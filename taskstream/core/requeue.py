"""Requeue a FAILED instance (FAILED -> PENDING, recorded with who and why), then publish it:
`retry` and the replays of dead letters (`operations`, `lost_letters`) go through here.

The move is a compare-and-set at the attempt judged; once it commits, the requeue stands
whatever fails after it, and the command says what is left to the reconciler or executor.
"""

from __future__ import annotations

from datetime import UTC, datetime

from taskstream.core import streams
from taskstream.core.errors import ChangedMeanwhile, CommandDenied, StoreError, TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.outbox_entries import placed_entry, why_refused
from taskstream.core.reasons import REQUEUED
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow, Store


async def requeue(
    outbox: Outbox,
    instance_id: str,
    *,
    who: str,
    why: str,
    now_ms: int,
    judged: InstanceRow | None = None,
) -> str | None:
    """FAILED -> PENDING (recorded with who and why), then publish it. The attempt budget
    starts again from this point; the attempt counter (fencing token) moves on by one, so
    entries of the failed attempts left on a stream are acked as older ones.

    With `judged` (the FAILED row as the caller read and judged it), only that failure is
    requeued: `ChangedMeanwhile` when the instance has moved on since, nothing written.
    Refused (`TaskstreamError`, the row left FAILED) when the instance's deadline has passed
    at `now_ms` (epoch ms): its new attempt would fail before it starts.

    Returns None when published, else what is left (`_publish_requeued`): Redis down or
    refusing this user the publish, or the store failing after the requeue's commit. The
    requeue stands, and the reconciler publishes the PENDING row once Redis answers (the
    sweeper's user may publish)."""
    row = judged or await outbox.store.get_instance(instance_id)
    if row is not None and row.status is not Status.FAILED:
        last = await _last_requeue(outbox.store, instance_id)
        raise TaskstreamError(
            f"instance {instance_id} is {row.status}; only FAILED can be retried"
            + ("" if last is None else f" (last {last})")
        )
    row = _requeueable(row, instance_id, now_ms)
    cas = await outbox.store.transition(
        instance_id,
        Status.FAILED,
        Status.PENDING,
        reason=REQUEUED,
        attempt=row.attempt,
        owner=who,
        error=f"requeued by {who}: {why}",
        note=why,
    )
    if not cas.ok:
        last = await _last_requeue(outbox.store, instance_id)
        raise ChangedMeanwhile(
            f"instance {instance_id} changed meanwhile (now {cas.found}"
            + ("" if last is None else f"; {last}")
            + "); left as it is"
        )
    return await _publish_requeued(outbox, instance_id, now_ms)


async def _publish_requeued(outbox: Outbox, instance_id: str, now_ms: int) -> str | None:
    """Publish the instance a requeue just moved to PENDING; None when done, else what is
    left. The requeue is committed: a failure now (Redis, or the store going away) is no
    failure of the command, and what it left is finished by the reconciler (no entry: it
    publishes the PENDING row) or by the executor that reads the entry (`seen_on_stream`)."""
    try:
        fresh = await outbox.store.get_instance(instance_id)
    except StoreError as exc:
        return f"not published yet ({exc}); the reconciler publishes it"
    try:
        refused = None if fresh is None else await outbox.publish(fresh, now_ms=now_ms)
    except (*streams.DRIVER_ERRORS, CommandDenied) as exc:
        return f"not published yet ({redis_failure(exc)}); the reconciler publishes it"
    except StoreError as exc:
        return unrecorded_dispatch(exc)
    return None if refused is None else f"not published: the row cannot be an entry ({refused})"


def unrecorded_dispatch(exc: StoreError) -> str:
    """What a publish (`Outbox.publish`) that the store failed has done: its only store step
    is the last, the move to DISPATCHED after the XADD, so the entry is on its stream."""
    return (
        f"published; its move to DISPATCHED not recorded ({exc}): the executor that reads its"
        " entry records it"
    )


def redis_failure(exc: Exception) -> str:
    """What kept Redis from doing a step, for the operator: down (the error's type), or
    refusing the command (`CommandDenied`: the command and the server's reply)."""
    if isinstance(exc, CommandDenied):
        return str(exc)
    return f"redis unavailable: {type(exc).__name__}"


def _requeueable(row: InstanceRow | None, instance_id: str, now_ms: int) -> InstanceRow:
    """`row`, FAILED and able to be requeued at `now_ms`; else `TaskstreamError`."""
    if row is None:
        raise TaskstreamError(f"no instance with id {instance_id!r}")
    if row.status is not Status.FAILED:
        raise TaskstreamError(f"instance {instance_id} is {row.status}; only FAILED can be retried")
    if row.deadline_ms is not None and row.deadline_ms <= now_ms:
        raise TaskstreamError(
            f"instance {instance_id} is past its deadline ({_utc(row.deadline_ms)}): a new"
            " attempt would time out before it starts; left FAILED"
        )
    try:  # a row no entry can be made of would sit PENDING for good, past `retry`'s reach
        placed_entry(row, now_ms)
    except ValueError as exc:
        raise TaskstreamError(
            f"instance {instance_id} cannot be published ({why_refused(exc)}); left FAILED"
        ) from exc
    return row


def _utc(epoch_ms: int) -> str:
    """`epoch_ms` as an ISO 8601 UTC time to the second."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


async def _last_requeue(store: Store, instance_id: str) -> str | None:
    """Who last requeued the instance, when and why (`requeued by alice at ...: why`), so a
    `retry` run twice (a double click, a script run again) can tell its own first run's
    work from another's; None when it never was, or the history cannot be read now (the
    answer is only an aid: it must not turn a clear refusal into a store error)."""
    try:
        history = await store.history(instance_id)
    except StoreError:
        return None
    last = next((h for h in reversed(history) if h.reason == REQUEUED), None)
    if last is None:
        return None
    why = "" if last.note is None else f": {last.note}"
    return f"requeued by {last.owner} at {_utc(last.at_ms)}{why}"
