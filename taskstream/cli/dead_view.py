"""What `dead list` prints: the dead letters on the stream, then the lost ones (instances the
store shows FAILED `poison` whose letter Redis lost), as tables or as one JSON list whose
items say which they are (`lost`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Column, Table

from taskstream.core.lost_letters import LostAmong, LostLetter
from taskstream.core.operations import DeadLetter
from taskstream.core.spec import INSTANCE_ID_LENGTH, format_utc_ms


def letters_json(letters: list[DeadLetter], lost: list[LostLetter]) -> list[dict[str, object]]:
    """One item per letter (`lost` false) and per lost letter (`lost` true, `dead_id` and
    `source_stream` null, with the instance's task, attempt and `failed_at_ms`)."""
    return [*(_letter_row(x) for x in letters), *(_lost_row(x) for x in lost)]


def _letter_row(letter: DeadLetter) -> dict[str, object]:
    return {
        "lost": False,
        "dead_id": letter.dead_id,
        "reason": letter.reason,
        "detail": letter.detail,
        "source_stream": letter.source_stream,
        "instance_id": letter.instance_id,
        "fields": letter.fields,
    }


def _lost_row(lost: LostLetter) -> dict[str, object]:
    row = lost.row
    return {
        "lost": True,
        "dead_id": None,
        "reason": lost.reason,
        "detail": row.last_error or "",
        "source_stream": None,
        "instance_id": row.id,
        "fields": {},
        "task_id": row.task_id,
        "attempt": row.attempt,
        "failed_at_ms": row.updated_at_ms,
    }


def print_letters(console: Console, letters: list[DeadLetter]) -> None:
    """The letters on the stream, one row each."""
    table = Table()
    table.add_column("dead_id", no_wrap=True)
    table.add_column("reason")
    table.add_column("detail")
    table.add_column("instance_id", no_wrap=True, min_width=INSTANCE_ID_LENGTH)
    table.add_column("source")
    for letter in letters:
        table.add_row(
            letter.dead_id,
            _cut(letter.reason, 40),
            _cut(letter.detail, 60),
            # A letter naming no instance of the protocol's form shows what it holds, cut.
            _cut(letter.instance_id or letter.fields.get("orig.instance_id", ""), 40),
            _cut(letter.source_stream, 60),
        )
    console.print(table)


def print_lost(console: Console, found: LostAmong) -> None:
    """The lost letters, under a line saying what they are, among which failures they were
    looked for, and how to requeue them; only that line when there are none and older
    failures were not judged, nothing when none is lost at all."""
    lost = found.lost
    if not lost:
        if not found.all_examined:
            console.print(f"lost letters: none {examined_text(found)}")
        return
    among = "" if found.all_examined else f" ({examined_text(found)})"
    console.print(
        "lost letters: instances FAILED poison in the store whose dead letter is not on the"
        f" stream (Redis lost it), the latest failure first{among}; `taskstream dead replay"
        " INSTANCE_ID` requeues one, `--all` every one"
    )
    # The id is what `dead replay` takes: never cut it, however narrow the terminal.
    table = Table(Column("instance_id", no_wrap=True, min_width=INSTANCE_ID_LENGTH))
    for name in ("task", "attempt", "failed_at (UTC)", "reason", "last_error"):
        table.add_column(name)
    for x in lost:
        table.add_row(
            x.row.id,
            _cut(x.row.task_id, 40),
            str(x.row.attempt),
            format_utc_ms(x.row.updated_at_ms),
            _cut(x.reason, 40),
            _cut(x.row.last_error or "", 60),
        )
    console.print(table)


def examined_text(found: LostAmong) -> str:
    """Among which failures the lost letters were looked for, when not among all of them."""
    return (
        f"among the latest {found.examined:,} poison failures; older ones were not examined"
        " (`taskstream dead replay --all` examines every one)"
    )


def _cut(text: str, width: int) -> str:
    """`text` to at most `width` characters, an ellipsis marking a cut: a letter another
    program wrote may carry fields of any length, which would squeeze every other column
    (the dead ids `dead replay ID` needs among them) to nothing."""
    return text if len(text) <= width else text[: width - 1] + "…"
