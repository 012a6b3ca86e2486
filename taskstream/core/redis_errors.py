"""Which Redis errors are an outage to wait out, and which replies name a missing group or a
change of role: the classification every role's Redis calls share (`streams` re-exports it).
"""

from __future__ import annotations

from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MasterDownError, OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class PersistenceError(ResponseError):
    """MISCONF: the server refuses writes because its snapshots fail (a full or broken disk,
    `stop-writes-on-bgsave-error`). redis-py has no class of its own for it."""

    def __str__(self) -> str:
        return f"MISCONF {super().__str__()}"  # the parser cut the word that names it


class ScriptBusyError(ResponseError):
    """BUSY: the server runs a script or function past its `busy-reply-threshold` (another
    client's, say) and runs no other command until that ends or is killed."""

    def __str__(self) -> str:
        return f"BUSY {super().__str__()}"


# redis-py turns an error reply into the class its first word names; MISCONF and BUSY would be
# plain ResponseErrors, which callers take for a bug of ours instead of an outage.
BaseParser.EXCEPTION_CLASSES.setdefault("MISCONF", PersistenceError)
BaseParser.EXCEPTION_CLASSES.setdefault("BUSY", ScriptBusyError)

DRIVER_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ReadOnlyError,
    MasterDownError,
    OutOfMemoryError,
    PersistenceError,
    ScriptBusyError,
)
"""Redis cannot serve us now: no connection, a timeout, or a server that refuses our writes
for the time being (READONLY from a replica after a failover, MASTERDOWN from a replica cut
off from its master, OOM at its memory limit, MISCONF while its disk fails, BUSY while a long
script runs). Callers pause and try again."""


def group_missing(exc: ResponseError) -> bool:
    """The reply says a work stream or its group is gone (Redis restarted empty, the keys
    deleted): `NOGROUP` to a command, or `UNBLOCKED` to a blocked read whose stream was
    deleted meanwhile (Redis 7; Valkey answers that read `NOGROUP`). `ensure_groups` mends it.
    Looked for anywhere in the message: redis-py puts a pipeline's command before it."""
    text = str(exc)
    return "NOGROUP" in text or ("UNBLOCKED" in text and not role_changed(exc))


def role_changed(exc: ResponseError) -> bool:
    """The reply ends a blocked read because the server changed role (`UNBLOCKED ...
    instance state changed (master -> replica?)`: a failover demoted it). An outage, to be
    waited out like `READONLY`, not a missing group."""
    text = str(exc)
    return "UNBLOCKED" in text and "instance state changed" in text
