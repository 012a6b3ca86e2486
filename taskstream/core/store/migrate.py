"""Schema migrations as a Python API: `upgrade(url)` and `current_revision(url)`.

The Alembic configuration is built here, with `script_location` pointing at the `migrations`
folder next to this module, so migrations run the same from a source tree and from an
installed wheel; there is no alembic.ini. Alembic runs synchronously on the async engine's
connection (`run_sync`), with the store's session setup (SQLite WAL/locking, MySQL time zone).

Concurrent upgrades (several containers starting at once) are serialized: a named lock on
MySQL/MariaDB, a transaction-scoped advisory lock on PostgreSQL, the write lock taken by
`BEGIN IMMEDIATE` on SQLite. The second upgrader then finds the schema at head and does nothing.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util.exc import CommandError
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from taskstream.core.errors import StoreError, StoreFileMissing, StoreUnavailable
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_errors import translate_errors
from taskstream.core.store.tables import metadata
from taskstream.core.store.urls import normalize_url, redact_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
HEAD = "head"
LOCK_NAME = "taskstream_migrate"
LOCK_TIMEOUT_S = 120
_PG_LOCK_KEY = 0x7473_6D69_6772  # "tsmigr": any fixed bigint shared by every upgrader


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the packaged migrations; `connection` is what env.py runs on."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _lock(connection: Connection) -> None:
    backend = connection.dialect.name
    if backend in ("mysql", "mariadb"):
        # DDL waiting for a table's metadata lock would otherwise wait for a day or more.
        connection.execute(text("SET SESSION lock_wait_timeout = :s"), {"s": LOCK_TIMEOUT_S})
        # A session lock: released when the connection closes after the upgrade.
        got = connection.execute(
            text("SELECT GET_LOCK(:name, :timeout)"),
            {"name": LOCK_NAME, "timeout": LOCK_TIMEOUT_S},
        ).scalar()
        if got != 1:
            raise StoreUnavailable(f"another migration held {LOCK_NAME!r} for {LOCK_TIMEOUT_S}s")
    elif backend == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


class _Incomplete(Exception):
    """At the newest revision, yet without tables or columns the migrations made."""


def _upgrade(connection: Connection) -> None:
    _lock(connection)
    command.upgrade(alembic_config(connection), HEAD)
    if missing := _missing(connection):
        raise _Incomplete(", ".join(missing))


def _missing(connection: Connection) -> list[str]:
    """The tables and columns of `tables.metadata` the database does not have: the
    migrations made them, so only a hand (or a restore of part of a backup) removed them."""
    found = inspect(connection)
    missing: list[str] = []
    for table in metadata.sorted_tables:
        if not found.has_table(table.name):
            missing.append(f"table {table.name}")
            continue
        have = {column["name"] for column in found.get_columns(table.name)}
        missing.extend(f"column {table.name}.{c.name}" for c in table.columns if c.name not in have)
    return missing


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(url: str) -> None:
    """Bring the database at `url` (a user URL) to the newest schema. Idempotent. Makes a
    SQLite file that is not there (no other engine does).

    Raises `StoreUnavailable` when the database cannot be reached, `StoreError` when a
    migration fails, the database is at a revision this version does not know (newer code
    migrated it), or it lacks a table or column the migrations made (`_missing`).
    """
    display_url = redact_url(url)
    engine = make_engine(
        normalize_url(url), read_timeout_s=None, idle_transaction_s=None, create=True
    )
    try:
        async with translate_errors(display_url), engine.begin() as conn:
            await conn.run_sync(_upgrade)
    except CommandError as exc:
        raise StoreError(f"cannot migrate {display_url}: {exc}") from exc
    except _Incomplete as exc:
        raise StoreError(
            f"store {display_url} is at the newest schema revision but lacks {exc} (dropped "
            "by hand?): the migrations will not make them again; restore them from a backup"
        ) from None
    finally:
        await engine.dispose()


async def current_revision(url: str) -> str | None:
    """The schema revision of the database at `url`; None before the first migration
    (a SQLite file that is not there yet, which this does not make)."""
    engine = make_engine(normalize_url(url))
    try:
        async with translate_errors(redact_url(url)), engine.connect() as conn:
            return await conn.run_sync(_revision)
    except StoreFileMissing:
        return None
    finally:
        await engine.dispose()
