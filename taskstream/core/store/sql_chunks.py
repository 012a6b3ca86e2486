"""Slicing of batch statements: how many ids, and how many bytes of values, one statement may
carry. Pure; the statements in `sql_queries`, `sql_batch`, `sql_finishes` and `sql_outbox`
cut their rows with these."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

CHUNK = 200
"""Ids (or keys) per batch statement: a few bound parameters each, far below every driver's
limit (SQLite 32766, PostgreSQL 32767, MySQL 65535)."""

_T = TypeVar("_T")


def chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    """`items` in slices of at most `CHUNK`."""
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


STATEMENT_BYTES = 4 * 1024 * 1024
"""Most bytes of values per multi-row statement: a quarter of the smallest default packet
limit of the servers (MariaDB's `max_allowed_packet`, 16 MiB), so sizes counted in characters
of utf8mb4 text (at most 4 bytes each) still fit."""

ROW_TEXT = 512
"""Characters counted for each row of a multi-row statement on top of its values: the SQL
sent around them (its markers, quotes and numbers, and a `CASE` arm naming the row's id for
each column the rows set apart), under 2 KiB a row, so 4 bytes a character covers it too.
Without it, rows whose values fill `STATEMENT_BYTES` with 4-byte characters (emoji) made a
statement just over the packet limit."""


def text_size(values: Mapping[str, Any]) -> int:
    """Characters of a row's text values (JSON documents, ids, keys, errors)."""
    return sum(len(v) for v in values.values() if isinstance(v, str))


def row_size(values: Mapping[str, Any]) -> int:
    """A row's size for `sized_chunks`, whose margin allows for up to 4 bytes per character
    (utf8mb4): its `text_size` and the `ROW_TEXT` of the statement around it."""
    return text_size(values) + ROW_TEXT


def sized_chunks(
    items: Sequence[_T], sizes: Sequence[int], max_bytes: int = STATEMENT_BYTES
) -> Iterator[Sequence[_T]]:
    """`items` in order, in slices of at most `CHUNK` whose `sizes` (bytes each) add up to at
    most `max_bytes`; an item larger than that on its own is a slice of one."""
    start, total = 0, 0
    for end, size in enumerate(sizes):
        if end > start and (end - start == CHUNK or total + size > max_bytes):
            yield items[start:end]
            start, total = end, 0
        total += size
    if start < len(items):
        yield items[start:]
