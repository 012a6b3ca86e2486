"""History reasons that code reads back (not only writes), shared by every package."""

from __future__ import annotations

from typing import Final

REQUEUED: Final = "requeued"
"""A manual FAILED -> PENDING requeue: the attempt budget starts again from here."""

RELEASED: Final = "released"
"""A run handed back unrun at shutdown: it does not count as an attempt."""

DEFERRED: Final = "deferred"
"""A run refused by its upstream's limiter or breaker before the agent ran: not an attempt."""

OWNER_LOST: Final = "owner_lost"
"""A run whose executor stopped heartbeating (crashed, killed, paused)."""

SEEN_ON_STREAM: Final = "seen_on_stream"
"""PENDING/RETRYING -> DISPATCHED by whoever found the row's entry on a stream (its XADD
happened; the outbox's own CAS did not)."""

LEASE_EXPIRED: Final = "lease_expired"
"""A run whose lease ran out."""

AFTER: Final = "after_"
"""Prefix of the reason of a move out of TIMEOUT (to RETRYING or FAILED): `after_` and why the
run timed out (`after_owner_lost`, `after_lease_expired`, `after_timeout`)."""


def after(why: str) -> str:
    """The reason of the move out of TIMEOUT of a run that timed out for `why`."""
    return AFTER + why
