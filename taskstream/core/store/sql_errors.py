"""Driver errors never leave the store: `translate_errors` turns them into `StoreConflict`
(a deadlock or a lock timeout rolled the transaction back: `sql_conflicts` sends it again),
`StoreUnavailable` (cannot reach / lost the connection: nothing was written, retry later),
`ConstraintViolation` (an integrity constraint, handled by the adapter), `SchemaMissing`,
`StoreDenied` (the user lacks a privilege or cannot log in: waited out like an outage until
it is mended),
`StoreFileMissing` (a SQLite file that is not there), `StoreRefused` (what trying again cannot
mend) or `StoreError`. Messages name the store by its redacted URL only.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import exc as sa_exc

from taskstream.core.errors import (
    SchemaMissing,
    StoreDenied,
    StoreError,
    StoreFileMissing,
    StoreRefused,
    StoreUnavailable,
)
from taskstream.core.store.sql_conflicts import conflict_error

_DETAIL_MAX = 300


class ConstraintViolation(StoreError):
    """An integrity constraint (UNIQUE, primary key, NOT NULL, foreign key) rejected a write
    and the transaction was rolled back. Callers expecting a duplicate confirm it by reading."""


class NoStoreFile(Exception):
    """A SQLite connect found no file at `path`; `translate_errors` names the store."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _detail(exc: BaseException) -> str:
    cause: Any = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    text = f"{type(cause).__name__}: {cause}".replace("\n", " ")
    return text[:_DETAIL_MAX]


_PASSING_SQLSTATES = frozenset({"25006"})
_PASSING_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "58"})
"""PostgreSQL errors that pass: read-only during a failover; and the classes connection
exception, insufficient resources, operator intervention (a cancelled statement, a statement
timeout, a shutdown) and system error. Nothing was written, and sending it again can succeed.
asyncpg reports them as generic errors; MySQL's equivalents (statement time 1969, read-only
1290) are already `OperationalError`s. Conflicts (a deadlock, a lock timeout, a serialization
failure) are told apart before these (`sql_conflicts`)."""


def _sqlstate(exc: Exception) -> str:
    """PostgreSQL's SQLSTATE of a driver error ("" when it has none)."""
    return str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")


def _is_unavailable(exc: Exception) -> bool:
    if isinstance(
        exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError | OSError
    ):
        return True
    state = _sqlstate(exc)
    if state in _PASSING_SQLSTATES or state[:2] in _PASSING_SQLSTATE_CLASSES:
        return True
    # Outside any statement means while connecting (e.g. PostgreSQL's unknown database or
    # role, which asyncpg reports as a generic error) or while committing on a lost link.
    return isinstance(exc, sa_exc.DBAPIError) and (
        exc.connection_invalidated or exc.statement is None
    )


_NO_TABLE = re.compile(
    r"no such table|\(1146,|Table '[^']*' doesn't exist|relation \"[^\"]*\" does not exist"
)
"""How SQLite, MySQL / MariaDB (error 1146) and PostgreSQL say a table does not exist."""
_NO_COLUMN = re.compile(
    r"no such column|has no column named|\(1054,"
    r"|column \"?[\w.]+\"?( of relation \"[^\"]*\")? does not exist"
)
"""How they say a column does not exist: a database migrated by an older taskstream."""


_DENIED = re.compile(r"\((1044|1142|1143|1227|1370),")
"""MySQL / MariaDB's refusals for want of a privilege: on a database (1044), a table (1142), a
column (1143), an administrative statement (1227) or a routine (1370)."""
_LOGIN = re.compile(r"\((1045|1698),")
"""MySQL / MariaDB's refusals of a login: a wrong password or an unknown user (1045), a user
that must log in another way (1698, `unix_socket` authentication)."""

_TOO_LARGE = re.compile(r"\(1153,")
"""MySQL / MariaDB error 1153 (ER_NET_PACKET_TOO_LARGE): a statement over the server's
`max_allowed_packet`. The same statement sent again is refused again."""


def refused(detail: str, display_url: str) -> StoreError | None:
    """The error for a refusal that trying again cannot mend, from a driver error's text:
    `StoreDenied` or `SchemaMissing` (outages that last until an operator grants the
    privilege, mends the login or migrates), or `StoreRefused` (not `StoreUnavailable`,
    which callers wait out and retry) for a statement over the server's packet limit; None
    for any other error."""
    if _DENIED.search(detail) is not None:
        return denied(detail, display_url)
    if _LOGIN.search(detail) is not None:
        return login_refused(detail, display_url)
    if _TOO_LARGE.search(detail) is not None:
        return StoreRefused(
            f"store {display_url} refused a statement over its packet limit ({detail})"
        )
    return schema_missing(detail, display_url)


def login_refused(detail: str, display_url: str) -> StoreDenied:
    """`StoreDenied` for a driver error's text that says the server refused the login."""
    return StoreDenied(
        f"store {display_url} refused this user's login ({detail}): check the user and"
        " password in TASKSTREAM_DATABASE_URL"
    )


def denied(detail: str, display_url: str) -> StoreDenied:
    """`StoreDenied` for a driver error's text that says the user lacks a privilege."""
    return StoreDenied(
        f"store {display_url} denied this user a statement ({detail}): grant the user the "
        "privilege it names (SELECT, INSERT and UPDATE on every taskstream table)"
    )


def schema_missing(detail: str, display_url: str) -> SchemaMissing | None:
    """`SchemaMissing` when a driver error's text says a table or a column does not exist:
    the database was never migrated, or was migrated by an older taskstream."""
    if _NO_TABLE.search(detail) is not None:
        what = "has no taskstream tables"
    elif _NO_COLUMN.search(detail) is not None:
        what = "is at an older schema than this taskstream's"
    else:
        return None
    return SchemaMissing(f"store {display_url} {what} ({detail}): run `taskstream migrate`")


_LASTING_SQLSTATES: dict[str, Callable[[str, str], StoreDenied]] = {
    "42501": denied,  # insufficient_privilege (the message follows the server's language)
    "28000": login_refused,  # invalid_authorization_specification: an unknown role, pg_hba
    "28P01": login_refused,  # invalid_password
}
"""PostgreSQL's refusals that last, by SQLSTATE, with the error each is named as."""


def _driver_errors(exc: Exception) -> Iterator[Exception]:
    """`exc`, then the driver errors it was raised while handling, newest first: MariaDB
    closes the connection after refusing a statement over its packet limit, so the rollback
    that follows fails too ("server has gone away"), and only the first error says why."""
    yield exc
    found: BaseException | None = exc
    while isinstance(found, sa_exc.DBAPIError) and found.orig is not None:
        found = found.orig.__context__
        if isinstance(found, sa_exc.DBAPIError):
            yield found


def _lasting(exc: Exception, display_url: str) -> StoreError | None:
    """`refused` of `exc` or of a driver error it was raised while handling; for PostgreSQL,
    the refusal its SQLSTATE names (`_LASTING_SQLSTATES`); else None."""
    for error in _driver_errors(exc):
        final = refused(_detail(error), display_url)
        if final is not None:
            return final
    lasting = _LASTING_SQLSTATES.get(_sqlstate(exc))
    return None if lasting is None else lasting(_detail(exc), display_url)


def translate(exc: Exception, display_url: str) -> StoreError:
    """The domain error for a driver error raised while using the store at `display_url`
    (a redacted URL: only that form may appear in the message)."""
    if isinstance(exc, sa_exc.IntegrityError):
        return ConstraintViolation(f"store {display_url}: constraint violated: {_detail(exc)}")
    final = _lasting(exc, display_url)
    if final is not None:
        return final
    conflict = conflict_error(exc, display_url, _detail(exc))
    if conflict is not None:
        return conflict
    if _is_unavailable(exc):
        return StoreUnavailable(f"store {display_url} unavailable: {_detail(exc)}")
    if isinstance(exc, sa_exc.DataError) or _sqlstate(exc).startswith("22"):
        # A value the column or encoding cannot hold (PostgreSQL's class 22, data exception).
        return StoreRefused(f"store {display_url} refused a value: {_detail(exc)}")
    return StoreError(f"store {display_url} failed: {_detail(exc)}")


@asynccontextmanager
async def translate_errors(display_url: str) -> AsyncIterator[None]:
    """Re-raise driver errors (SQLAlchemy, DBAPI, socket) from the body as store errors, a
    SQLite file that is not there as `StoreFileMissing`, and text a driver cannot encode (a
    lone surrogate, which SQLite's driver raises on) as `StoreRefused`, as PostgreSQL's
    server refuses it."""
    try:
        yield
    except (sa_exc.SQLAlchemyError, OSError) as exc:
        raise translate(exc, display_url) from exc
    except NoStoreFile as exc:
        raise StoreFileMissing(
            f"store {display_url}: no file {exc.path} (a typo in the URL?): "
            "run `taskstream migrate` to make it"
        ) from None
    except UnicodeEncodeError as exc:
        raise StoreRefused(f"store {display_url} refused a value: {_detail(exc)}") from exc
