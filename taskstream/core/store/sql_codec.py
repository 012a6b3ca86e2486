"""Values in and out of the SQL store: JSON text, bounded strings, rows to port records.

JSON is canonical (`sort_keys`, compact separators, no NaN/Infinity) so equal values store as
equal text on every dialect, and a spec compares by its text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import RowMapping

from taskstream.core.errors import StoreCorrupt, StoreRefused
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import (
    DecisionRow,
    DefinitionRecord,
    HistoryRow,
    InstanceRow,
    UnreadableRow,
)
from taskstream.core.store.records import stored_json
from taskstream.core.store.tables import NOTE_LEN, REASON_LEN

ERROR_MAX_CHARS = 10_000
"""`last_error` is cut to this many characters (a MySQL TEXT holds 64 KiB of utf8mb4)."""


def dumps(value: Any, *, what: str) -> str:
    """Canonical JSON text of `value`; `StoreRefused` naming `what` when it is not JSON."""
    try:
        return stored_json(value)
    except (TypeError, ValueError) as exc:
        raise StoreRefused(f"{what} is not JSON-serialisable: {exc}") from exc


def loads(text: str | None, *, where: str | tuple[str, object, str] = "stored JSON") -> Any:
    """The value of stored JSON text; None for SQL NULL. `StoreCorrupt` naming `where`
    (`<table> row '<key>': <column>`, or the (table, key, column) to write it from, which
    reads of many rows pass so that the name is made only for a bad one) when the text is
    not JSON (a hand edit in SQL)."""
    if text is None:
        return None
    if text == "{}":  # most contexts: a new dict, without the parser
        return {}
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        named, column = (where, None) if isinstance(where, str) else (_where(*where), where[2])
        raise StoreCorrupt(f"{named} is not JSON ({exc}); left as it is", column=column) from None


def _where(table: str, key: object, column: str) -> str:
    """How a stored value is named in a `StoreCorrupt`: `<table> row '<key>': <column>`."""
    return f"{table} row {str(key)[:200]!r}: {column}"


def stored_status(m: Mapping[Any, Any], column: str, table: str, key: object) -> Status:
    """The `Status` in `column`; `StoreCorrupt` naming it when no state has that name."""
    try:
        return Status(m[column])
    except ValueError:
        raise StoreCorrupt(not_a_status(m[column], column, table, key), column=column) from None


def not_a_status(value: object, column: str, table: str, key: object) -> str:
    """What `StoreCorrupt` says of a row whose `column` holds `value`, which no state has."""
    return f"{_where(table, key, column)} is {str(value)[:40]!r}, not a status; left as it is"


def _fail_class(m: Mapping[Any, Any]) -> FailClass | None:
    if m["fail_class"] is None:
        return None
    try:
        return FailClass(m["fail_class"])
    except ValueError:
        where = _where("task_instances", m["id"], "fail_class")
        raise StoreCorrupt(
            f"{where} is {str(m['fail_class'])[:40]!r}, not a failure class; left as it is",
            column="fail_class",
        ) from None


def reason(text: str) -> str:
    """A history, decision or review reason, cut to the column's width, with what UTF-8
    cannot encode replaced (an agent's error text may hold a lone surrogate)."""
    return _encodable(text[:REASON_LEN])


def note(text: str | None) -> str | None:
    """A history note, cut to the column's width (characters); None stays None."""
    return None if text is None else _encodable(text[:NOTE_LEN])


def _encodable(text: str) -> str:
    """`text` with what UTF-8 cannot encode (a lone surrogate) replaced by `?` and NUL, which
    PostgreSQL's text refuses, by U+FFFD: every database kind stores the same text."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def error_text(text: str | None) -> str | None:
    """An error message, cut to `ERROR_MAX_CHARS`, with what a store cannot hold (a lone
    surrogate or a NUL in an exception's text) replaced: it must never make its write fail."""
    if text is None:
        return None
    return _encodable(text[:ERROR_MAX_CHARS])


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def instance_fields(m: Mapping[Any, Any]) -> dict[str, Any]:
    """A `task_instances` row as the keyword arguments of `InstanceRow` (so a caller that
    knows some columns changed builds the record once, without `dataclasses.replace`)."""
    return {
        "id": m["id"],
        "task_id": m["task_id"],
        "agent": m["agent"],
        "dedupe_key": m["dedupe_key"],
        "status": stored_status(m, "status", "task_instances", m["id"]),
        "attempt": int(m["attempt"]),
        "max_attempts": int(m["max_attempts"]),
        "priority": m["priority"],
        "scheduled_for_ms": int(m["scheduled_for_ms"]),
        "business_date": m["business_date"],
        "payload": loads(m["payload"], where=("task_instances", m["id"], "payload")),
        "result": loads(m["result"], where=("task_instances", m["id"], "result")),
        "context": loads(m["context"], where=("task_instances", m["id"], "context")),
        "fail_class": _fail_class(m),
        "last_error": m["last_error"],
        "lease_owner": m["lease_owner"],
        "lease_expires_at_ms": _opt_int(m["lease_expires_at_ms"]),
        "not_before_ms": _opt_int(m["not_before_ms"]),
        "deadline_ms": _opt_int(m["deadline_ms"]),
        "next_attempt_at_ms": _opt_int(m["next_attempt_at_ms"]),
        "trace_id": m["trace_id"],
        "created_at_ms": int(m["created_at_ms"]),
        "updated_at_ms": int(m["updated_at_ms"]),
    }


def instance_row(m: RowMapping) -> InstanceRow:
    """A `task_instances` row as the port's record."""
    return InstanceRow(**instance_fields(m))


def instance_or_unreadable(m: RowMapping) -> InstanceRow | UnreadableRow:
    """`instance_row`, or for a row holding what taskstream never writes its id, its place
    in an (updated_at_ms, id) order and the `StoreCorrupt` text, for a read of many rows
    that must go on past it."""
    try:
        return instance_row(m)
    except StoreCorrupt as exc:
        return UnreadableRow(
            id=str(m["id"]),
            updated_at_ms=int(m["updated_at_ms"]),
            error=str(exc),
            next_attempt_at_ms=_opt_int(m["next_attempt_at_ms"]),
            scheduled_for_ms=int(m["scheduled_for_ms"]),
        )


def history_row(m: RowMapping) -> HistoryRow:
    """An `instance_history` row as the port's record."""
    return HistoryRow(
        instance_id=m["instance_id"],
        from_status=(
            None
            if m["from_status"] is None
            else stored_status(m, "from_status", "instance_history", m["instance_id"])
        ),
        to_status=stored_status(m, "to_status", "instance_history", m["instance_id"]),
        attempt=int(m["attempt"]),
        owner=m["owner"],
        reason=m["reason"],
        at_ms=int(m["at_ms"]),
        note=m["note"],
    )


def decision_row(m: RowMapping) -> DecisionRow:
    """A `trigger_decisions` row as the port's record."""
    return DecisionRow(
        task_id=m["task_id"],
        fire_time_ms=int(m["fire_time_ms"]),
        decision=m["decision"],
        reason=m["reason"],
        details=loads(m["details"], where=("trigger_decisions", m["task_id"], "details")),
        instance_id=m["instance_id"],
        decided_at_ms=int(m["decided_at_ms"]),
    )


def definition_record(m: RowMapping) -> DefinitionRecord:
    """A `task_definitions` row as the port's record."""
    return DefinitionRecord(
        task_id=m["task_id"],
        spec=loads(m["spec"], where=("task_definitions", m["task_id"], "spec")),
        spec_hash=m["spec_hash"],
        paused=bool(m["paused"]),
        updated_at_ms=int(m["updated_at_ms"]),
        schedule_from_ms=None if m["schedule_from_ms"] is None else int(m["schedule_from_ms"]),
        cursor_ms=None if m["cursor_ms"] is None else int(m["cursor_ms"]),
    )
