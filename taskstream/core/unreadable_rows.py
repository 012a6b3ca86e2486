"""Rows that a read of many could not decode (`UnreadableRow`: a hand edit in SQL left what
taskstream never writes). A pass over such a read goes on with the others and names each bad
row once per process, again only when its error changes, so that a row left for a person to
mend neither stops the pass nor fills the log on every pass. The row is left as it is."""

from __future__ import annotations

from collections.abc import Iterable

from structlog.typing import FilteringBoundLogger

from taskstream.core.store.port import InstanceRow, UnreadableRow
from taskstream.core.told import Told

ERROR_CHARS = 300
"""Characters of a row's error that its log line carries."""


class UnreadableRows:
    """The rows of reads of many that were read, for one process's passes (module
    docstring); `instance.unreadable` on `log` for each bad row, once until its error
    changes."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self._log = log
        self._told = Told()

    def readable(self, rows: Iterable[InstanceRow | UnreadableRow]) -> list[InstanceRow]:
        """The rows that were read, in order; the others logged (once) and passed over."""
        readable: list[InstanceRow] = []
        for row in rows:
            if isinstance(row, InstanceRow):
                self._told.forget(row.id)
                readable.append(row)
            else:
                self.tell(row)
        return readable

    def tell(self, row: UnreadableRow) -> None:
        """Log `row` unless it was logged with the same error already."""
        if self._told.first_time(row.id, row.error):
            self._log.error(
                "instance.unreadable", instance_id=row.id, error=row.error[:ERROR_CHARS]
            )
