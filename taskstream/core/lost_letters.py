"""Dead letters Redis lost: instances the store shows FAILED `poison` whose failure no letter
on the dead-letter stream records.

The store is the truth. A Redis restored from an older snapshot, restarted without its data or
flushed loses the letters written since; their instances stay FAILED `poison`, which the
reconciler leaves alone (FAILED is settled). `dead list` lists them as lost, `dead replay
INSTANCE_ID` and `dead replay --all` requeue them, and `status` counts them.

A letter records an instance's failure when `dead replay` of it would requeue that failure
(`states.recorded_by_letter`): a letter of an earlier life (before a `retry` by hand) records
none of the current one. Between a poison failure's commit and its letter's XADD (a moment;
longer while Redis is down, until the sweeper writes the letter the entry owes) the instance
is listed as lost too; requeueing it then is harmless: its leftover entry is of an older
attempt, and acked.

The store deletes nothing, so a long-lived cluster holds many instances FAILED `poison`, nearly
all with their letter on the stream. `status` and `dead list` judge only the latest
`LOST_EXAMINED` and say so (`latest_lost`); `dead replay --all` judges every one. Either way
the stream is read newest first and only back to the oldest failure judged, less the clock
margin `CLOCK_MARGIN_MS` (`Letters`), not from its start.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from taskstream.core import streams
from taskstream.core.errors import ChangedMeanwhile, TaskstreamError
from taskstream.core.operations import (
    left_as_it_is,
    letter_attempt,
    newest_dead_letters,
    requeue,
)
from taskstream.core.outbox import Outbox
from taskstream.core.states import (
    Status,
    failed_as_poison,
    last_failure,
    life_began,
    recorded_by_letter,
)
from taskstream.core.store.port import HistoryRow, InstanceRow, Store, UnreadableRow

PAGE = 200
"""Rows FAILED `poison` read from the store at a time."""

SCAN_PAGE = 1000
"""Dead letters read from the stream at a time, to learn which instances they name."""

LOST_EXAMINED = 1000
"""Poison failures, the latest ones, that `status` and `dead list` judge (`dead list` more
when its `--limit` is higher). The store deletes nothing: a long-lived cluster holds many
more, nearly all with their letter on the stream, and judging all of them at every `status`
would read them all and the whole dead-letter stream. `dead replay --all` judges all."""

CLOCK_MARGIN_MS = 3_600_000
"""How far the Redis server's clock may be behind the database's (1 hour), for reading the
dead-letter stream: every writer of a letter (the sweeper, the committer, an executor that
does not know the agent, the paths writing a letter an entry still owes) XADDs it after the
instance's move to FAILED has committed, so the letter's id (Redis's clock) is at or after
the failure's `updated_at_ms` (the database's clock) less the skew between the two clocks.
The letters that can record failures at or after T are therefore those from T less this
margin on; older letters are not read. With Redis's clock behind by more than this, the
oldest failures judged may be listed as lost though their letter is on the stream (requeueing
one then does what replaying its letter would)."""

REPLAY_NOTE = "replay of a lost dead letter"
"""The note of the history row of a lost letter's requeue (`inspect` shows it)."""


@dataclass(frozen=True, slots=True)
class LostLetter:
    """An instance FAILED `poison` whose failure no dead letter on the stream records."""

    row: InstanceRow
    """The row as it was judged (a replay requeues only this failure)."""
    reason: str
    """The reason its move to FAILED recorded (`unknown_agent`, `after_owner_lost`, ...)."""


@dataclass(frozen=True, slots=True)
class LostAmong:
    """The lost letters among the latest poison failures (`latest_lost`)."""

    lost: list[LostLetter]
    """The latest failure first."""
    examined: int
    """How many of the latest poison failures were judged."""
    all_examined: bool
    """No older poison failure was left unjudged: `lost` is every lost letter there is."""


Lettered = dict[str, list[tuple[str, int | None]]]
"""Instance id -> (dead letter id, the letter's entry attempt or None), newest first."""


class Letters:
    """The letters on the dead-letter stream, by the instance they name: read newest first,
    `SCAN_PAGE` at a time, and only as far back as the failures asked about need."""

    def __init__(self, redis: streams.Redis, dead_key: str) -> None:
        self._redis, self._dead_key = redis, dead_key
        self._found: Lettered = {}
        self._oldest: str | None = None
        """The id of the oldest letter read."""
        self._since_ms: int | None = None
        """Every letter from this time on (Redis's clock, epoch ms) has been read."""

    async def recording(self, failed_ms: int) -> Lettered:
        """Every letter that can record a failure at or after `failed_ms` (epoch ms, database
        clock): those from `failed_ms` less `CLOCK_MARGIN_MS` on, each read once, the first
        time it is needed."""
        since_ms = failed_ms - CLOCK_MARGIN_MS
        if self._since_ms is not None and self._since_ms <= since_ms:
            return self._found
        while page := await newest_dead_letters(
            self._redis, self._dead_key, limit=SCAN_PAGE, before=self._oldest, since_ms=since_ms
        ):
            for letter in page:
                if letter.instance_id:
                    attempt = letter_attempt(letter.fields)
                    self._found.setdefault(letter.instance_id, []).append((letter.dead_id, attempt))
            self._oldest = page[-1].dead_id
            if len(page) < SCAN_PAGE:
                break
        self._since_ms = since_ms
        return self._found


def recorded(
    letters: Sequence[tuple[str, int | None]], row: InstanceRow, history: Sequence[HistoryRow]
) -> bool:
    """Some of `letters` (of `row`'s instance) records the failure `row` is in."""
    began = life_began((h.reason, h.attempt) for h in history)
    attempts = [a for _, a in letters]
    return recorded_by_letter(attempts, row.status, row.fail_class, row.attempt, life_began=began)


async def _judge(
    store: Store, letters: Letters, page: Sequence[InstanceRow | UnreadableRow]
) -> list[LostLetter]:
    """The lost letters of `page`'s rows (FAILED `poison`, the latest failure first), in
    order. A row that cannot be read (failed as `corrupt_row` after a hand edit in SQL) is
    not judged: no replay could run it before it is mended."""
    rows = [r for r in page if isinstance(r, InstanceRow)]
    if not rows:
        return []
    found = await letters.recording(min(r.updated_at_ms for r in rows))
    histories = await store.histories([r.id for r in rows])
    lost = []
    for row in rows:
        history = histories.get(row.id, [])
        if not recorded(found.get(row.id, []), row, history):
            lost.append(LostLetter(row, _failed_reason(history)))
    return lost


async def lost_letters(
    store: Store, redis: streams.Redis, dead_key: str, *, failed_until_ms: int | None = None
) -> AsyncGenerator[LostLetter]:
    """The instances FAILED `poison` whose failure no letter on the stream records, the latest
    failure first (those that failed at or before `failed_until_ms`, epoch ms, when given):
    every one, for `dead replay --all`. The stream is read as the failures judged need it,
    newest first, each letter once, down to the oldest failure less `CLOCK_MARGIN_MS`."""
    # (t + 1, "") comes after every row that failed at t or before, and before every later one.
    before = None if failed_until_ms is None else (failed_until_ms + 1, "")
    letters = Letters(redis, dead_key)
    while rows := await store.poisoned(limit=PAGE, before=before):
        for lost in await _judge(store, letters, rows):
            yield lost
        before = (rows[-1].updated_at_ms, rows[-1].id)


def _failed_reason(history: Sequence[HistoryRow]) -> str:
    return last_failure((h.to_status, h.reason) for h in history) or ""


async def latest_lost(
    store: Store, redis: streams.Redis, dead_key: str, *, examine: int, count: int | None = None
) -> LostAmong:
    """The lost letters among the latest `examine` (at least 1) poison failures, the latest
    first; the search stops at the `count`th when given. Older failures are not read, nor
    the letters only they could need."""
    letters = Letters(redis, dead_key)
    found: list[LostLetter] = []
    examined, more = 0, True
    before: tuple[int, str] | None = None
    while more and examined < examine and (count is None or len(found) < count):
        want = min(PAGE, examine - examined)
        # One row past those wanted tells whether older ones are left unjudged.
        rows = await store.poisoned(limit=want + 1, before=before)
        rows, more = rows[:want], len(rows) > want
        if not rows:
            break
        room = None if count is None else count - len(found)
        judged, lost = _up_to(rows, await _judge(store, letters, rows), room)
        found += lost
        examined += judged
        more = more or judged < len(rows)
        before = (rows[-1].updated_at_ms, rows[-1].id)
    return LostAmong(found, examined, all_examined=not more)


def _up_to(
    rows: Sequence[InstanceRow | UnreadableRow], lost: list[LostLetter], room: int | None
) -> tuple[int, list[LostLetter]]:
    """How many of `rows` count as judged, and their lost letters `lost`, when at most `room`
    more are wanted (None: any number): the rows up to the `room`th lost one."""
    if room is None or len(lost) < room:
        return len(rows), lost
    last = lost[room - 1].row.id
    return 1 + next(i for i, r in enumerate(rows) if r.id == last), lost[:room]


async def lost_letter(
    store: Store, redis: streams.Redis, dead_key: str, instance_id: str
) -> LostLetter:
    """The lost letter of `instance_id`; `TaskstreamError` saying why there is none: no such
    instance, not FAILED `poison`, or a letter on the stream records its failure."""
    row = await store.get_instance(instance_id)
    if row is None:
        raise TaskstreamError(f"no instance with id {instance_id!r}")
    if row.status is Status.FAILED and not failed_as_poison(row.status, row.fail_class):
        raise TaskstreamError(
            f"instance {instance_id} failed {row.fail_class}, not as poison: it never had a"
            f" dead letter; `taskstream retry {instance_id} --reason ...` requeues it"
        )
    if row.status is not Status.FAILED:
        raise TaskstreamError(
            f"instance {instance_id} is {row.status}: only an instance FAILED poison can have"
            " lost its dead letter"
        )
    found = await Letters(redis, dead_key).recording(row.updated_at_ms)
    history = await store.history(instance_id)
    recording = [d for d, a in found.get(instance_id, []) if recorded([(d, a)], row, history)]
    if recording:
        dead_id = recording[0]
        raise TaskstreamError(
            f"instance {instance_id}: its dead letter {dead_id} is on the stream; replay that"
            f" (`taskstream dead replay {dead_id}`)"
        )
    return LostLetter(row, _failed_reason(history))


async def replay_lost(outbox: Outbox, lost: LostLetter, *, who: str, now_ms: int) -> str:
    """Requeue the failure of a lost letter (FAILED -> PENDING, recorded with who and
    `REPLAY_NOTE`), then publish it; returns what was done. When the instance moved on since
    it was judged (a `retry` or another replay got there first), what it is now, left as it
    is. `TaskstreamError` (the instance left FAILED) when it cannot be requeued: past its
    deadline, or no entry can be made of it."""
    instance_id = lost.row.id
    try:
        late = await requeue(
            outbox, instance_id, who=who, why=REPLAY_NOTE, now_ms=now_ms, judged=lost.row
        )
    except ChangedMeanwhile:
        now = await outbox.store.get_instance(instance_id)
        if now is None:
            raise TaskstreamError(f"no instance with id {instance_id!r}") from None
        return left_as_it_is(now)
    return "requeued" if late is None else f"requeued, {late}"
