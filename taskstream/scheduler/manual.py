"""Operator-driven scheduling: manual triggers and bounded backfills (DESIGN.md §7); plan
previews are `scheduler.preview`, reading back what was decided is `scheduler.trail`.

A manual or backfilled run goes through the same path as a scheduled one: `new_instance`
derives its id from the rendered dedupe key and the outbox inserts it under the store's UNIQUE
key, so a second run for the same key is `skip_duplicated`, never a second instance. Every
outcome is recorded as a `DecisionRow`, so `taskstream explain` shows manual runs too.

All instants are UTC epoch milliseconds; `now_ms` is passed in, no clock is read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from taskstream.core.errors import StoreError, TaskstreamError, UsageError
from taskstream.core.outbox import Emitted, Outbox
from taskstream.core.spec import TaskSpec, format_utc_ms
from taskstream.core.store.port import DecisionRow, NewInstance
from taskstream.scheduler import verdict
from taskstream.scheduler.calendar import (
    CalendarBlock,
)
from taskstream.scheduler.instances import new_instance, scheduled_trigger
from taskstream.scheduler.maintenance import skipping_block
from taskstream.scheduler.ticks import Trigger, fire_times

DEFAULT_BACKFILL_LIMIT: Final = 1000
"""Most fire times one backfill may create; a wider range is refused, not truncated."""
_COUNT_CAP_FACTOR: Final = 10
"""A refused cron range is counted up to this many times the limit (then "more than N")."""
_EXISTS: Final = "an instance with this dedupe key exists"


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What one backfill did. `fire_times`: fire times (ms) found in the range, oldest first;
    `published` + `unpublished` + `duplicate` + `skipped_calendar` == len(fire_times).
    `unpublished`: instances created while Redis failed, left to the reconciler."""

    fire_times: tuple[int, ...]
    published: int
    duplicate: int
    skipped_calendar: int
    instance_ids: tuple[str, ...]
    unpublished: int = 0


class DecisionUnrecorded(TaskstreamError):
    """A manual trigger emitted (`emitted`: its run is made, or found a duplicate) and the
    store then failed to record its decision: the run stands, `explain` does not show it."""

    def __init__(self, emitted: Emitted, cause: StoreError) -> None:
        self.emitted = emitted
        super().__init__(
            f"the decision of this run was not recorded ({cause}): `taskstream explain` does"
            " not show it; the run was made, do not trigger it again"
        )


def _instance(
    spec: TaskSpec,
    fire_ms: int,
    reason: str,
    payload: dict[str, Any] | None,
    now_ms: int,
    who: str | None,
) -> NewInstance:
    """The instance an operator (`who`) makes; its deadline counts from `now_ms` for a fire
    time already past."""
    try:
        return new_instance(
            spec, fire_ms, reason=reason, payload=payload, made_at_ms=now_ms, created_by=who
        )
    except ValueError as exc:
        raise UsageError(f"task {spec.id!r}: {exc}") from exc


async def trigger(
    outbox: Outbox,
    spec: TaskSpec,
    *,
    now_ms: int,
    payload: dict[str, Any] | None = None,
    at_ms: int | None = None,
    who: str | None = None,
) -> Emitted:
    """Run `spec` once now, as the fire time `at_ms` (default `now_ms`), with `payload`
    replacing the task's payload when given; `who` (the operator) is recorded with the
    instance's creation and in the decision (`details["by"]`).

    Returns the outbox outcome: "published" and "unpublished" (created while Redis failed:
    the reconciler publishes it) record `should_run`, "duplicate" (an instance with the same
    dedupe key exists, whatever its status) records `skip_duplicated`.
    UsageError when the dedupe key cannot be rendered (a `{payload.x}` field missing);
    `DecisionUnrecorded`, with the outcome, when the store fails after the emit.
    """
    fire_ms = now_ms if at_ms is None else at_ms
    new = _instance(spec, fire_ms, "manual", payload, now_ms, who)
    emitted = await outbox.emit(new, now_ms=now_ms)
    details: dict[str, Any] = {
        "fire_time_ms": fire_ms,
        "now_ms": now_ms,
        verdict.MANUAL: True,
        "dedupe_key": new.dedupe_key,
        "payload_override": payload is not None,
        "outcome": emitted.outcome,
        "by": who,
    }
    decision, reason = verdict.SHOULD_RUN, "manual trigger"
    if emitted.outcome == "duplicate":
        details["existing_status"] = None if emitted.status is None else emitted.status.value
        decision, reason = verdict.SKIP_DUPLICATED, f"manual trigger: {_EXISTS}"
    try:
        await outbox.store.record_decision(
            DecisionRow(spec.id, fire_ms, decision, reason, details, emitted.instance_id, now_ms)
        )
    except StoreError as exc:
        raise DecisionUnrecorded(emitted, exc) from exc
    return emitted


def _count_text(trigger: Trigger, from_ms: int, to_ms: int, limit: int) -> str:
    """The number of fire times in [from_ms, to_ms], exact for `every`; a cron is walked only
    up to `_COUNT_CAP_FACTOR` x `limit` matches."""
    if trigger.every_ms is not None:
        every = trigger.every_ms
        return str(to_ms // every - (from_ms - 1) // every)
    cap = limit * _COUNT_CAP_FACTOR
    found = len(fire_times(trigger, from_ms - 1, to_ms, limit=cap + 1))
    return f"more than {cap}" if found > cap else str(found)


def backfill_times(
    spec: TaskSpec, *, from_ms: int, to_ms: int, now_ms: int, limit: int
) -> list[int]:
    """The fire times of `spec` in [from_ms, to_ms] (ms), oldest first.

    TaskstreamError for an on-demand task; UsageError for an empty or future range
    (`to_ms > now_ms`), or
    more than `limit` fire times (the message names how many).
    """
    trigger = scheduled_trigger(spec)
    if from_ms > to_ms:
        raise UsageError(f"backfill range is empty: from {from_ms} is after to {to_ms}")
    if to_ms > now_ms:
        raise UsageError("backfill covers past fire times only: the range ends after now")
    found = fire_times(trigger, from_ms - 1, to_ms, limit=limit + 1)
    if len(found) > limit:
        count = _count_text(trigger, from_ms, to_ms, limit)
        raise UsageError(
            f"backfill of {spec.id!r} covers {count} fire times, over the limit of {limit}; "
            "narrow the range or raise the limit"
        )
    return found


async def backfill(
    outbox: Outbox,
    spec: TaskSpec,
    *,
    from_ms: int,
    to_ms: int,
    now_ms: int,
    limit: int = DEFAULT_BACKFILL_LIMIT,
    who: str | None = None,
) -> BackfillResult:
    """Create one instance per fire time of `spec` in [from_ms, to_ms] (ms), oldest first.

    Fire times the calendar forbids are recorded `skip_calendar` and not created; an existing
    dedupe key is `skip_duplicated`. A maintenance window forbids a fire time only when the
    task's catch-up is disabled: otherwise the scheduled tick would have waited for the
    window's end and run, and a backfill's run starts now. Every instance is rendered before
    any is written, so a bad dedupe template writes nothing. `who` (the operator) is recorded
    as `trigger` records it. Errors as `backfill_times`.
    """
    times = backfill_times(spec, from_ms=from_ms, to_ms=to_ms, now_ms=now_ms, limit=limit)
    blocks = {at_ms: skipping_block(spec, at_ms) for at_ms in times}
    news = {
        at: _instance(spec, at, "backfill", None, now_ms, who)
        for at, b in blocks.items()
        if b is None
    }
    counts = {verdict.SHOULD_RUN: 0, verdict.SKIP_DUPLICATED: 0, verdict.SKIP_CALENDAR: 0}
    ids: list[str] = []
    unpublished = 0
    for done, fire_ms in enumerate(times):
        block = blocks[fire_ms]
        try:
            if block is None:
                row = await _emit_row(outbox, spec, news[fire_ms], now_ms)
            else:
                row = _calendar_row(spec, fire_ms, block, now_ms, who)
            await outbox.store.record_decision(row)
        except StoreError as exc:
            raise _stopped(spec, fire_ms, done, exc) from exc
        counts[row.decision] += 1
        unpublished += row.details.get("outcome") == "unpublished"
        if row.instance_id is not None:
            ids.append(row.instance_id)
    return BackfillResult(
        tuple(times),
        counts[verdict.SHOULD_RUN] - unpublished,
        counts[verdict.SKIP_DUPLICATED],
        counts[verdict.SKIP_CALENDAR],
        tuple(ids),
        unpublished,
    )


def _stopped(spec: TaskSpec, fire_ms: int, done: int, exc: StoreError) -> TaskstreamError:
    """The error of a backfill the store stopped at `fire_ms`, after `done` fire times: each
    is created (or found) and recorded in turn, so running the same backfill again finishes
    it, the ones done being `skip_duplicated` (the instance of the one it stopped at may be
    created already, with no `should_run` of its own)."""
    return TaskstreamError(
        f"backfill of {spec.id!r} stopped at fire time {format_utc_ms(fire_ms)} ({exc}): the"
        f" {done} fire time(s) before it are done; run the same backfill again to finish it"
        " (the fire times already created are then skip_duplicated)"
    )


def _calendar_row(
    spec: TaskSpec, fire_ms: int, block: CalendarBlock, now_ms: int, who: str | None
) -> DecisionRow:
    """The `skip_calendar` decision of a backfilled fire time, with the values the rule saw."""
    seen: dict[str, Any] = {"fire_time_ms": fire_ms, "now_ms": now_ms, verdict.BACKFILL: True}
    seen["by"] = who
    seen["calendar"] = {**block.details, "rule": block.rule, "checked": "fire"}
    reason = f"backfill: calendar: {block.reason}"
    return DecisionRow(spec.id, fire_ms, verdict.SKIP_CALENDAR, reason, seen, None, now_ms)


async def _emit_row(outbox: Outbox, spec: TaskSpec, new: NewInstance, now_ms: int) -> DecisionRow:
    """Emit one backfilled instance; `should_run`, or `skip_duplicated` for an existing key."""
    fire_ms = new.scheduled_for_ms
    emitted = await outbox.emit(new, now_ms=now_ms)
    seen: dict[str, Any] = {"fire_time_ms": fire_ms, "now_ms": now_ms, verdict.BACKFILL: True}
    seen |= {"dedupe_key": new.dedupe_key, "outcome": emitted.outcome, "by": new.created_by}
    decision, reason = verdict.SHOULD_RUN, "backfill"
    if emitted.outcome == "duplicate":
        seen["existing_status"] = None if emitted.status is None else emitted.status.value
        decision, reason = verdict.SKIP_DUPLICATED, f"backfill: {_EXISTS}"
    return DecisionRow(spec.id, fire_ms, decision, reason, seen, emitted.instance_id, now_ms)
