"""What a final decision makes in the store: the tick's instance (through the outbox) for a
run, a SKIPPED record for a missed fire time.

Emitting finds a duplicate when the tick's dedupe key exists. That is the tick's own instance,
not a duplicate, when a scheduler pass created it (reason `scheduled`) and stopped, or lost
its lease, before recording its decision: no decision names it, so this one does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

from structlog.typing import FilteringBoundLogger

from taskstream.core.outbox import Outbox
from taskstream.core.spec import MAX_DEDUPE_KEY_LEN, TaskSpec, instance_id_for
from taskstream.core.states import Status
from taskstream.core.store.port import DecisionRow, NewInstance, Store
from taskstream.scheduler.instances import SCHEDULED, new_instance, tick_instance_id
from taskstream.scheduler.leader import Fenced
from taskstream.scheduler.verdict import MISSED, SHOULD_RUN, SKIP_DUPLICATED, Decision

EXISTS = "an instance with this dedupe key exists"
_DIGEST_LEN = 24
"""Hex digits of sha256 ending a shortened `missed:` key (96 bits)."""
RECENT_DECISIONS = 50
"""Decisions read from the tick's fire time on to find one naming its instance."""


async def emit_tick(
    store: Store,
    outbox: Outbox,
    spec: TaskSpec,
    fire_ms: int,
    decision: Decision,
    now_ms: int,
    *,
    token: int | None = None,
) -> tuple[Decision, str]:
    """Emit the tick's instance; returns the decision as emitting it turned out (a duplicate
    is `skip_duplicated`; an instance created but not published says so) and the instance.
    `Fenced`, with nothing created, when a leader newer than `token` has taken the task."""
    emitted = await outbox.emit(new_instance(spec, fire_ms), now_ms=now_ms, token=token)
    if emitted.outcome == "fenced":
        raise Fenced.refused("instance", spec.id)
    if emitted.outcome == "duplicate":
        details = {**decision.details, "existing_status": str(emitted.status)}
        if await _unrecorded(store, spec.id, fire_ms, emitted.instance_id):
            details["recorded_after_creation"] = True
            decision = replace(decision, details=details)
        else:
            decision = Decision(SKIP_DUPLICATED, EXISTS, details)
    elif emitted.outcome == "unpublished":
        # Created but not on a stream (Redis failed): the reconciler publishes it.
        decision = replace(decision, details={**decision.details, "outcome": "unpublished"})
    return decision, emitted.instance_id


CREATED_EARLIER = "its instance exists: a scheduler pass created it and stopped before recording"


async def own_unrecorded(store: Store, spec: TaskSpec, fires_ms: Sequence[int]) -> dict[int, str]:
    """Those of `fires_ms` whose own instance exists though no decision names it (a pass
    created it, then lost its lease or its process before recording), each with its id.
    Deciding such a tick again (say `coalesced` or `missed` by catch-up) would misreport it.
    Ticks whose dedupe key is shared (`{business_date}`) share an id; only the tick the
    instance was made for owns it."""
    ids = {fire_ms: tick_instance_id(spec, fire_ms) for fire_ms in fires_ms}
    found = await store.existing_instances(sorted(set(ids.values()))) if ids else set()
    return {
        fire_ms: instance_id
        for fire_ms, instance_id in sorted(ids.items())
        if instance_id in found and await _unrecorded(store, spec.id, fire_ms, instance_id)
    }


async def ran_unrecorded(
    store: Store, spec: TaskSpec, fire_ms: int, decision: Decision
) -> str | None:
    """The tick's own instance when `decision` is final and runs nothing but a pass created
    that instance and stopped before recording it: the tick ran, and the record must say so
    (`created_earlier`) rather than skip it. None otherwise."""
    if decision.runs or not decision.final:
        return None
    return (await own_unrecorded(store, spec, [fire_ms])).get(fire_ms)


def created_earlier(fire_ms: int) -> Decision:
    """The decision recorded for a tick `own_unrecorded` found: it runs (it did already)."""
    details = {"fire_time_ms": fire_ms, "recorded_after_creation": True}
    return Decision(SHOULD_RUN, CREATED_EARLIER, details)


async def _unrecorded(store: Store, task_id: str, fire_ms: int, instance_id: str) -> bool:
    """Reads the facts for `unrecorded_own`: the instance, its creation and the tick's
    decisions. An instance of another task (tasks whose `dedupe_key` leaves out
    `{task_id}` share keys) is never this task's own."""
    row = await store.get_instance(instance_id)
    if row is None or row.task_id != task_id:
        return False
    history = await store.history(instance_id)
    if not history:
        return False
    recorded = await store.decisions(task_id, since_ms=fire_ms, limit=RECENT_DECISIONS)
    named = [d.instance_id for d in recorded]
    return unrecorded_own(history[0].reason, named, instance_id, row.scheduled_for_ms, fire_ms)


def unrecorded_own(
    created_reason: str,
    named: Sequence[str | None],
    instance_id: str,
    made_for_ms: int,
    fire_ms: int,
) -> bool:
    """Whether the existing `instance_id` is the one a scheduler pass creates for the tick
    at `fire_ms`: created with reason `scheduled` (not by a backfill or a manual trigger)
    for this very fire time (`made_for_ms`; under a key shared by several ticks, such as
    `{business_date}`, an earlier tick's instance is a duplicate), and none of the tick's
    recorded decisions (`named`: the instance each names) names it."""
    return created_reason == SCHEDULED and made_for_ms == fire_ms and instance_id not in named


async def record_missed(
    store: Store, spec: TaskSpec, fire_ms: int, *, token: int | None = None
) -> str:
    """A missed fire time leaves a SKIPPED instance (reason `missed`) for the record, created
    SKIPPED in one transaction: a PENDING one would be published, and so run, by the
    reconciler. A row an earlier version left PENDING is moved on too. `Fenced`, with
    nothing created, when a leader newer than `token` has taken the task."""
    new = missed_instance(spec, fire_ms)
    created = await store.create_instance(new, skipped=MISSED, token=token)
    if created.fenced:
        raise Fenced.refused("instance", spec.id)
    if not created.created:
        await store.transition(created.instance_id, Status.PENDING, Status.SKIPPED, reason=MISSED)
    return created.instance_id


def missed_instance(spec: TaskSpec, fire_ms: int) -> NewInstance:
    """The record of a missed fire time (created SKIPPED). Its dedupe key is prefixed
    `missed:` so an explicit backfill can still run the tick."""
    base = new_instance(spec, fire_ms, reason=MISSED)
    key = missed_key(base.dedupe_key)
    return replace(base, id=instance_id_for(key), dedupe_key=key)


def missed_key(dedupe_key: str) -> str:
    """`missed:` + the tick's dedupe key. One too long for the column keeps its head and ends
    in a digest of the whole key: cutting the tail alone would give ticks whose keys differ
    only there (the fire time usually comes last) one record between them."""
    key = f"missed:{dedupe_key}"
    if len(key) <= MAX_DEDUPE_KEY_LEN:
        return key
    digest = hashlib.sha256(dedupe_key.encode()).hexdigest()[:_DIGEST_LEN]
    return f"{key[: MAX_DEDUPE_KEY_LEN - _DIGEST_LEN - 1]}~{digest}"


async def record_decision(
    store: Store, row: DecisionRow, log: FilteringBoundLogger, *, token: int | None = None
) -> bool:
    """Record a tick's decision (the values it saw included) and log `trigger.decided`.
    False, with nothing recorded, when a leader newer than `token` has taken the task over."""
    if not await store.record_decision(row, token=token):
        return False
    log.info(
        "trigger.decided",
        task_id=row.task_id,
        fire_time_ms=row.fire_time_ms,
        decision=row.decision,
        instance_id=row.instance_id,
    )
    return True


RECALL_PAGE = 5000
"""Decision rows read per query when a scheduler reads back what was decided past a cursor."""
RECALL_MOST = 500_000
"""Most decision rows read back per task (a hundred pages): ticks beyond are decided again."""


async def decisions_after(store: Store, task_id: str, cursor_ms: int) -> list[DecisionRow]:
    """Every decision recorded past `cursor_ms` (up to `RECALL_MOST`), by fire time then
    insertion, read a page at a time. A page ends on whole fire times: the rows of the fire
    time it cut are read again with the next page, so each comes once and in order."""
    rows: list[DecisionRow] = []
    since = cursor_ms + 1
    while len(rows) < RECALL_MOST:
        page = await store.decisions(task_id, since_ms=since, limit=RECALL_PAGE)
        if len(page) < RECALL_PAGE:
            return rows + page
        last = page[-1].fire_time_ms
        whole = [row for row in page if row.fire_time_ms < last]
        if not whole:  # one fire time fills the page: take it as read, and go past it
            whole, last = page, last + 1
        rows += whole
        since = last
    return rows
