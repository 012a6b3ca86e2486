"""Which Redis errors are an outage to wait out, and which replies name a missing group or a
change of role: the classification every role's Redis calls share (`streams` re-exports it).
"""

from __future__ import annotations

from typing import ClassVar

from redis._parsers.base import BaseParser
from redis.exceptions import (
    AuthenticationError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class ServerRefusal(ResponseError):
    """An error reply that passes by itself but that redis-py has no class of its own for,
    named by its first word (`WORD`), which the parser cuts off: `str` gives it back."""

    WORD: ClassVar[str] = ""

    def __str__(self) -> str:
        return f"{self.WORD} {super().__str__()}"


class PersistenceError(ServerRefusal):
    """MISCONF: the server refuses writes because its snapshots fail (a full or broken disk,
    `stop-writes-on-bgsave-error`)."""

    WORD = "MISCONF"


class ScriptBusyError(ServerRefusal):
    """BUSY: the server runs a script or function past its `busy-reply-threshold` (another
    client's, say) and runs no other command until that ends or is killed."""

    WORD = "BUSY"


class NoReplicasError(ServerRefusal):
    """NOREPLICAS: `min-replicas-to-write` is set and fewer replicas are connected: the server
    refuses writes until they are back."""

    WORD = "NOREPLICAS"


# redis-py turns an error reply into the class its first word names; these would be plain
# ResponseErrors, which callers take for a bug of ours instead of an outage. (BUSYGROUP is a
# word of its own, not BUSY.)
for _refusal in (PersistenceError, ScriptBusyError, NoReplicasError):
    BaseParser.EXCEPTION_CLASSES.setdefault(_refusal.WORD, _refusal)

DRIVER_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ReadOnlyError,
    MasterDownError,
    OutOfMemoryError,
    PersistenceError,
    ScriptBusyError,
    NoReplicasError,
)
"""Redis cannot serve us now: no connection, a timeout, or a server that refuses our writes
for the time being (READONLY from a replica after a failover, MASTERDOWN from a replica cut
off from its master, OOM at its memory limit, MISCONF while its disk fails, BUSY while a long
script runs, NOREPLICAS while its replicas are away; LOADING is a ConnectionError). Callers
pause and try again."""


def outage_text(exc: BaseException, limit: int = 300) -> str:
    """What a role logs of an outage it waits out (`*.dependency_down`), at most `limit`
    characters: a store error names its store already; a Redis error is named as Redis's,
    by its class (its own text may not say which server it is from), and a refused login
    says what to check."""
    if isinstance(exc, OSError) and not isinstance(exc, RedisError):  # a socket's, unnamed
        return f"{type(exc).__name__}: {exc}"[:limit]
    if not isinstance(exc, RedisError):
        return str(exc)[:limit]
    text = f"redis unavailable: {type(exc).__name__}: {exc}"
    if isinstance(exc, AuthenticationError):
        text += " (check the user and password in TASKSTREAM_REDIS_URL)"
    return text[:limit]


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
