"""What a readiness marker may be called and dated (pure): the forms `depends_on` names and the
scheduler's business dates take, so a marker set in another form is refused, not stored where
no tick ever looks for it."""

from __future__ import annotations

import re
from datetime import date

from taskstream.core.spec_parts import NAME_PATTERN


def is_marker_name(name: object) -> bool:
    """`name` is one a task's `depends_on` may list (`NAME_PATTERN`, e.g. `raw_data.ready`)."""
    return isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) is not None


def is_business_date(text: object) -> bool:
    """`text` is a business date as the scheduler writes one: `YYYY-MM-DD`, a real day."""
    if not isinstance(text, str):
        return False
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
