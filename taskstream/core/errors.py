"""Typed errors. Every error taskstream raises on purpose derives from `TaskstreamError`.

Driver errors (SQLAlchemy, redis-py) are translated at the adapter edge into these, so callers
never catch a driver type.
"""

from __future__ import annotations


class TaskstreamError(Exception):
    """Root of every error raised on purpose by taskstream."""


class ConfigError(TaskstreamError):
    """Settings or task definitions are invalid. `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class UsageError(TaskstreamError):
    """A command's arguments cannot be used for what they name (a backfill range that holds
    no past fire time, a payload the task's dedupe key cannot be made from): exit 2, like
    arguments the command line itself refuses."""


class InvalidTransition(TaskstreamError):
    """A status change that the state table does not allow."""


class StoreError(TaskstreamError):
    """The store failed in a way that is not a lost race."""


class StoreUnavailable(StoreError):
    """The database cannot be reached. Nothing was written."""


class StoreConflict(StoreUnavailable):
    """The database rolled the transaction back to settle a conflict with another one: a
    deadlock, or a row lock waited for longer than its lock wait timeout. Nothing was written;
    the store sends the transaction again a few times at once before raising this, and a
    caller that gets it waits it out as an outage. `lock_wait`: it was a lock wait timeout,
    which already waited the server's whole timeout (tried again once only)."""

    def __init__(self, message: str, *, lock_wait: bool = False) -> None:
        super().__init__(message)
        self.lock_wait = lock_wait


class StoreRefused(StoreError):
    """The store refused a value it will not take: longer than its column, in an encoding it
    cannot hold, not JSON, or a statement over its packet limit. Nothing was written, and
    sending the same again is refused again (unlike `StoreUnavailable`)."""


class StoreCorrupt(StoreError):
    """A stored row holds what taskstream never writes (JSON that does not parse, a status no
    state machine has), say after a hand edit in SQL: named by table, row and column. The row
    is left as it is; reading it again fails again until it is mended. `column`: the column
    that holds it, when one is named."""

    def __init__(self, message: str, *, column: str | None = None) -> None:
        self.column = column
        super().__init__(message)


class SchemaMissing(StoreUnavailable):
    """The database has no taskstream tables (not migrated yet), or lacks columns (migrated
    by an older taskstream). An outage to the services, which wait for `taskstream migrate`
    as for a database that is down."""


class StoreDenied(StoreUnavailable):
    """The database refused the user a statement it has no privilege for (a GRANT missing
    or revoked). Nothing was written. Like `SchemaMissing`, an outage to the services, which
    wait until an operator grants the privilege; the message names what was refused."""


class StoreFileMissing(SchemaMissing):
    """A SQLite store's file does not exist (a typo in its path, or never migrated): only
    `migrate` and `up` make it; every other command and role opens the file that is there."""


class ClaimLost(TaskstreamError):
    """A run wrote on behalf of a claim (instance, token) that is no longer the instance's
    running one: its lease lapsed and the instance moved on. The write was not made."""


class QueueUnavailable(TaskstreamError):
    """Redis cannot be reached. Nothing was published or acknowledged."""


class ProtocolError(TaskstreamError):
    """A stream entry that does not decode. `reason` is a short machine-readable cause."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ClusterNotFound(TaskstreamError):
    """No URLs were given and no running cluster was found in the working directory."""


class ChangedMeanwhile(TaskstreamError):
    """An operator's compare-and-set found the instance moved on since it was looked at
    (another operator, or its own run, got there first). Nothing was written."""


class LetterKept(TaskstreamError):
    """A dead letter's replay was done (its message says what) but Redis failed before the
    letter was dropped: it stays on the dead-letter stream."""


class CommandDenied(QueueUnavailable):
    """Redis refused to run a command for us: its ACL denies the command, a key or a channel
    (NOPERM), or it does not know the command (renamed or disabled). Nothing was done. Unlike
    an outage it does not pass by itself (an operator grants the permission), but it is
    waited out the same way; `command` names what was refused, `reply` is the server's
    answer without the call's arguments (`core.denials`)."""

    def __init__(self, command: str, reply: str) -> None:
        self.command = command
        self.reply = reply
        super().__init__(f"redis refused {command}: {reply}")


class WrongType(CommandDenied):
    """A key of ours holds a value of another type (a `SET` by hand on a work stream, another
    application writing into the namespace): Redis refuses every stream command on it
    (WRONGTYPE). Like a denial it does not pass by itself (an operator deletes or renames the
    key) and is waited out the same way; `key` names the key, `kind` its type (`string`,
    `hash`, ...), as TYPE answers it."""

    def __init__(self, command: str, key: str, kind: str) -> None:
        self.key = key
        self.kind = kind
        super().__init__(command, f"WRONGTYPE {key} holds a {kind}, not a stream")
