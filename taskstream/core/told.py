"""What a process has already logged about a row, so that a row left as it is (refused, or
unreadable) is named once, again only when its reason changes, not on every pass."""

from __future__ import annotations

from collections import OrderedDict

TOLD_MAX = 1024
"""Rows remembered as logged, the most recently seen kept."""


class Told:
    """Row id -> the reason last logged for it, the newest `TOLD_MAX` rows."""

    def __init__(self) -> None:
        self._told: OrderedDict[str, str] = OrderedDict()

    def first_time(self, row_id: str, reason: str) -> bool:
        """Whether `reason` is news for `row_id` (then remembered as told): False when it
        was the last reason logged for that row."""
        if self._told.get(row_id) == reason:
            self._told.move_to_end(row_id)
            return False
        self._told[row_id] = reason
        self._told.move_to_end(row_id)
        while len(self._told) > TOLD_MAX:
            self._told.popitem(last=False)
        return True

    def forget(self, row_id: str) -> None:
        """The row is fine again: the next time it is not, it is logged."""
        self._told.pop(row_id, None)
