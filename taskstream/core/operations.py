"""Operator actions: list and replay dead letters; a FAILED instance is requeued by
`core.requeue` (`requeue` and `redis_failure` are named here too, for their callers).

Every action is a compare-and-set recorded in the history with who did it and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core.denials import commands
from taskstream.core.errors import (
    ChangedMeanwhile,
    CommandDenied,
    LetterKept,
    StoreError,
    TaskstreamError,
)
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import INSTANCE_ID_MAX
from taskstream.core.requeue import redis_failure, requeue, unrecorded_dispatch
from taskstream.core.states import Status, failed_as_poison, life_began, recorded_by_letter
from taskstream.core.store.port import InstanceRow, Store

__all__ = ["DEAD_ID", "DeadLetter", "redis_failure", "replay", "requeue"]


class DeadLetter(BaseModel):
    """One entry of the dead-letter stream, as read back (`_letters`): its id and every field
    as text. `instance_id` is the original entry's, when it has one of the protocol's form
    (else None: the letter names no instance it could be replayed for)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dead_id: str = Field(min_length=1)
    reason: str
    detail: str
    source_stream: str
    instance_id: str | None = Field(min_length=1, max_length=INSTANCE_ID_MAX)
    fields: dict[str, str]


async def _failed_by(store: Store, letter: DeadLetter, row: InstanceRow) -> bool:
    """The FAILED `row` failed as the letter says: as poison, at the letter's attempt (its
    entry's, or the run that entry started: not an attempt a requeue made, whose own entry
    may have been poisoned too; `recorded_by_letter`). A letter without a readable attempt
    is taken at its word only for a row that FAILED as poison: never over a `fatal` or
    `manual_review` verdict."""
    attempt = letter_attempt(letter.fields)
    if not failed_as_poison(row.status, row.fail_class):
        return False
    history = [] if attempt is None else await store.history(row.id)
    began = life_began((h.reason, h.attempt) for h in history)
    return recorded_by_letter([attempt], row.status, row.fail_class, row.attempt, life_began=began)


def letter_attempt(fields: Mapping[str, str]) -> int | None:
    """A letter's `orig.attempt`, of its `fields`; None when it is missing or not a number:
    ASCII digits only (`isdigit` also takes "²", which `int` refuses), and few enough for
    `int`."""
    text = fields.get("orig.attempt", "")
    if not (text.isascii() and text.isdigit()) or len(text) > ATTEMPT_DIGITS:
        return None
    return int(text)


ATTEMPT_DIGITS = 20
"""Digits of the largest attempt a letter is read with (a 64-bit counter's)."""


DEAD_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
"""A dead letter's id: its stream id, `ms-seq`, as `dead list` shows it."""


async def dead_letters(
    redis: streams.Redis,
    dead_key: str,
    *,
    limit: int,
    after: str | None = None,
    until: str | None = None,
) -> list[DeadLetter]:
    """The oldest `limit` dead letters (after the id `after`, up to and with the id `until`,
    when given)."""
    start = "-" if after is None else f"({after}"
    return _letters(await redis.xrange(dead_key, start, until or "+", count=limit))


async def newest_dead_letters(
    redis: streams.Redis,
    dead_key: str,
    *,
    limit: int,
    before: str | None = None,
    since_ms: int = 0,
) -> list[DeadLetter]:
    """The newest `limit` dead letters, newest first: older than the id `before` when given,
    and none whose id's time (Redis's clock, epoch ms) is before `since_ms`."""
    end = "+" if before is None else f"({before}"
    start = f"{since_ms}-0" if since_ms > 0 else "-"
    return _letters(await redis.xrevrange(dead_key, end, start, count=limit))


async def newest_dead_id(redis: streams.Redis, dead_key: str) -> str | None:
    """The id of the newest dead letter, None when there is none."""
    rows: Any = await redis.xrevrange(dead_key, "+", "-", count=1)
    return streams.as_text(rows[0][0]) if rows else None


async def dead_letter(redis: streams.Redis, dead_key: str, dead_id: str) -> DeadLetter | None:
    """The dead letter `dead_id`, None when there is none; one lookup, whatever the stream's
    length. Raises `TaskstreamError` for an id that is not a stream id."""
    if DEAD_ID.fullmatch(dead_id) is None:
        raise _not_an_id(dead_id)
    try:
        rows = await redis.xrange(dead_key, dead_id, dead_id, count=1)
    except ResponseError as exc:  # a part above 2**64 - 1
        raise _not_an_id(dead_id) from exc
    letters = _letters(rows)
    return letters[0] if letters else None


def _not_an_id(dead_id: str) -> TaskstreamError:
    return TaskstreamError(f"{dead_id!r} is not a dead letter id (ms-seq, as `dead list` shows)")


def _shown(value: bytes | str) -> str:
    """A dead letter's field as text; bytes that are not UTF-8 (written by some other
    program) are shown as `\\xff` escapes instead of failing the whole listing."""
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else value


def _letters(rows: Any) -> list[DeadLetter]:
    return [_letter(dead_id, raw) for dead_id, raw in rows]


def _letter(dead_id: bytes | str, raw: Mapping[bytes | str, bytes | str] | None) -> DeadLetter:
    """A letter validated as `DeadLetter`; one whose original instance id is not of the
    protocol's form (written by some other program) is kept, naming no instance."""
    fields = {_shown(k): _shown(v) for k, v in (raw or {}).items()}
    values = {
        "dead_id": _shown(dead_id),
        "reason": fields.get("reason", ""),
        "detail": fields.get("detail", ""),
        "source_stream": fields.get("source_stream", ""),
        "instance_id": fields.get("orig.instance_id"),
        "fields": fields,
    }
    try:
        return DeadLetter.model_validate(values)
    except ValidationError:
        return DeadLetter.model_validate(values | {"instance_id": None})


async def replay(outbox: Outbox, letter: DeadLetter, *, who: str, now_ms: int) -> str:
    """Send a dead letter's instance through again and drop the letter. Returns what was done.

    A FAILED instance is requeued, when its failure is the letter's (`poison`, at the
    letter's attempt): one requeued since and failed again otherwise (`fatal`, a manual
    review) is left as it is. Only the failure judged is requeued: when the instance moved
    on meanwhile (another replay or `retry` got there first), what it found is reported
    instead. One waiting for a claim (PENDING, DISPATCHED) is published again; one further
    on (RUNNING, TIMEOUT, RETRYING) is left to the executors, sweeper and scheduler: an
    entry for its current attempt would later let its retry start at once, skipping the
    backoff. A letter with no instance (it never decoded), or whose instance cannot be
    requeued or published, cannot be replayed and is kept (`TaskstreamError`). A publish
    whose store fails after its XADD is done (`_republish`) and drops the letter. When Redis
    fails or refuses the XDEL after the replay was done, before the letter is dropped:
    `LetterKept`, saying what was done.
    """
    row = await _named(outbox.store, letter)
    if row.status is Status.FAILED and await _failed_by(outbox.store, letter, row):
        done = await _requeue_judged(outbox, letter, row, who=who, now_ms=now_ms)
    elif row.status in (Status.PENDING, Status.DISPATCHED):
        done = await _republish(outbox, letter, row, now_ms)
    else:
        done = left_as_it_is(row)
    try:
        await _drop_letter(outbox.redis, outbox.keys.dead, letter.dead_id)
    except (*streams.DRIVER_ERRORS, CommandDenied) as exc:  # what was done stands: say it
        raise LetterKept(f"{done}; letter kept ({redis_failure(exc)})") from exc
    return done


async def _republish(outbox: Outbox, letter: DeadLetter, row: InstanceRow, now_ms: int) -> str:
    """Publish a letter's instance that waits for a claim; what was done. A store that fails
    after the XADD (the move to DISPATCHED, the publish's only store step) leaves the entry on
    the stream, which an executor claims: the replay is done, and the letter is dropped, so
    that running it again does not publish the instance once more."""
    try:
        refused = await outbox.publish(row, now_ms=now_ms)
    except StoreError as exc:
        return unrecorded_dispatch(exc)
    if refused is not None:
        raise TaskstreamError(
            f"dead letter {letter.dead_id}: instance {row.id} cannot be published ({refused}); kept"
        )
    return "published"


@commands("XDEL")
async def _drop_letter(redis: streams.Redis, dead_key: str, dead_id: str) -> None:
    await redis.xdel(dead_key, dead_id)


async def _named(store: Store, letter: DeadLetter) -> InstanceRow:
    """The letter's instance; `TaskstreamError` (the letter kept) when there is none."""
    row = await store.get_instance(letter.instance_id) if letter.instance_id else None
    if row is None:
        raise TaskstreamError(f"dead letter {letter.dead_id} names no instance; kept")
    return row


async def _requeue_judged(
    outbox: Outbox, letter: DeadLetter, row: InstanceRow, *, who: str, now_ms: int
) -> str:
    """Requeue `row`'s failure, the one judged the letter's; when the instance moved on
    meanwhile, what it is now, left as it is."""
    why = f"replay of {letter.dead_id}"
    try:
        late = await requeue(outbox, row.id, who=who, why=why, now_ms=now_ms, judged=row)
    except ChangedMeanwhile:
        return left_as_it_is(await _named(outbox.store, letter))
    return "requeued" if late is None else f"requeued, {late}"


def left_as_it_is(row: InstanceRow) -> str:
    """What a replay that leaves `row` as it is says about it."""
    if row.status is Status.FAILED:
        return f"failed since, not by this letter ({row.fail_class}), left as it is"
    if row.status in (Status.SUCCESS, Status.SKIPPED):
        return f"already {row.status}"
    if row.status in (Status.PENDING, Status.DISPATCHED):
        return f"requeued meanwhile ({row.status}), left as it is"
    return f"in flight ({row.status}), left as it is"
