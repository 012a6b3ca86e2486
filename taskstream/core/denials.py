"""Replies by which Redis refuses to run a command for us, rather than failing to serve it.

A denial is an ACL that denies the command, one of its keys or its channel (`NOPERM`, worded
differently inside a script), or a command the server does not know (renamed or disabled by
`rename-command`). Unlike an outage it does not pass by itself: an operator has to grant the
permission. The roles check their commands at start (`taskstream.core.redis_needs`); a denial
met later (an ACL changed under a running cluster) pauses the work it concerns, which is left
as it is (an entry stays pending: neither acked nor lost), logs `redis.denied` naming the
command, and tries again after `pause_s`, so a permission given back resumes the role without
a restart.

The functions of this module that read a reply are pure; `commands` wraps the stream shells
so that a denial leaves them as a `CommandDenied` naming what was refused.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import NoPermissionError, ResponseError
from structlog.typing import FilteringBoundLogger

from taskstream.core.errors import CommandDenied, WrongType

P = ParamSpec("P")
R = TypeVar("R")

MARKS = (
    "no permissions to",  # NOPERM: the command, a key or a channel (redis-py cuts the word)
    "The user executing the script can't",  # the same, met by a command a script runs
    "unknown command",  # renamed or disabled, or not in this server's version
    "Unknown Redis command",  # the same, called from a script
    "Invalid command passed to redis.acl_check_cmd",  # the same, checked by a script first
)
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
"""Pauses after successive denials of the same work: 1, 2, 4, ... s, at most this."""
REPLY_CHARS = 300
_RUN = re.compile(r"run the '([^']+)' command")
_UNKNOWN = re.compile(r"nknown command '([^']+)'")
_PIPELINE = re.compile(r"^Command # \d+ \((\S+)")
_PIPELINE_END = " of pipeline caused error: "
_ARGS = ", with args beginning with:"


def denied(exc: BaseException) -> bool:
    """The reply refuses the command (see the module doc), as opposed to an outage or a
    mistake in the call."""
    if isinstance(exc, NoPermissionError):
        return True
    return isinstance(exc, ResponseError) and any(m in str(exc) for m in MARKS)


def command_of(exc: BaseException, fallback: str) -> str:
    """The refused command as the reply names it (`XADD`, `XINFO|CONSUMERS`), else as a
    pipeline's error names its command, else `fallback` (what the caller ran)."""
    text = str(exc)
    for pattern in (_RUN, _UNKNOWN, _PIPELINE):
        if (found := pattern.search(text)) is not None:
            return found.group(1).upper()
    return fallback


def reply_of(exc: BaseException) -> str:
    """The server's reply, without the arguments that redis-py or the server quote with it
    (entry fields, key names' neighbours: no payload or secret reaches a log line)."""
    text = str(exc)
    if _PIPELINE_END in text:
        text = text.rpartition(_PIPELINE_END)[2]
    text = text.split(_ARGS, 1)[0].strip()
    if isinstance(exc, NoPermissionError) and not text.startswith("NOPERM"):
        text = f"NOPERM {text}"  # the parser cut the word that names it
    return text[:REPLY_CHARS]


def refused(exc: ResponseError, fallback: str, keys: tuple[str, ...] = ()) -> CommandDenied:
    """The `CommandDenied` for a denial `exc` of a call that ran `fallback`. A reply that
    denies "one of the keys" (or channels) gets the call's `keys` named after it (key names
    are no secret, and the reply does not say which)."""
    reply = reply_of(exc)
    if keys and ("keys" in reply or "channels" in reply):
        reply = f"{reply} ({', '.join(keys)})"[:REPLY_CHARS]
    return CommandDenied(command_of(exc, fallback), reply)


def commands(
    names: str,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Decorate an async Redis shell that runs `names` (e.g. "XACK XDEL"): a denial leaves it
    as `CommandDenied`, naming the command the reply names, else `names`."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return await fn(*args, **kwargs)
            except ResponseError as exc:
                if denied(exc):
                    raise refused(exc, names) from exc
                raise

        return call

    return wrap


def pause_s(denials: int) -> float:
    """Seconds to wait after the `denials`-th denial in a row (1-based) of the same work."""
    return min(MAX_PAUSE_S, FIRST_PAUSE_S * 2.0 ** min(max(denials, 1) - 1, 16))


def log_denied(log: FilteringBoundLogger, exc: CommandDenied, **fields: Any) -> None:
    """The `redis.denied` error line: the command, the reply, and the caller's `fields`
    (what was left, `retry_in_s`); `redis.wrong_type` with the `key` and its `type` instead
    for a key of another type (`WrongType`)."""
    if isinstance(exc, WrongType):
        log.error("redis.wrong_type", key=exc.key, type=exc.kind, command=exc.command, **fields)
        return
    log.error("redis.denied", command=exc.command, reply=exc.reply, **fields)


async def unless_held(
    holds: Holds,
    key: str,
    now_ms: int,
    log: FilteringBoundLogger,
    make: Callable[[], Awaitable[R]],
    **fields: Any,
) -> R | None:
    """`await make()`, unless `key` is held at `now_ms`; None then, or when Redis denies it:
    the denial is logged (`log_denied`, with `fields`) and holds `key` (`Holds.hold`)."""
    if not holds.due(key, now_ms):
        return None
    try:
        done = await make()
    except CommandDenied as exc:
        log_denied(log, exc, retry_in_s=holds.hold(key, now_ms), **fields)
        return None
    holds.clear(key)
    return done


class Holds:
    """Work (an entry, a step, by a key of the caller's) whose last try was denied, and when
    to try it again (`pause_s` after each denial in a row). Times are epoch ms of the caller's
    clock. At most `kept` keys: past that the oldest is forgotten, and tried again at once."""

    def __init__(self, kept: int = 10_000) -> None:
        self._held: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """key -> (denials in a row, due at ms)."""
        self._kept = kept

    def due(self, key: str, now_ms: int) -> bool:
        """Whether `key` may be tried at `now_ms`: never denied, or its pause is over."""
        held = self._held.get(key)
        return held is None or now_ms >= held[1]

    def hold(self, key: str, now_ms: int) -> float:
        """Note a denial of `key` at `now_ms`; the seconds until it is due again."""
        times = self._held.pop(key, (0, 0))[0] + 1
        wait_s = pause_s(times)
        self._held[key] = (times, now_ms + round(wait_s * 1000))
        while len(self._held) > self._kept:
            self._held.popitem(last=False)
        return wait_s

    def clear(self, key: str) -> None:
        """`key` was tried and not denied."""
        self._held.pop(key, None)
