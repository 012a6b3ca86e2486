"""Throwaway databases for tests: one fresh database per use, dropped afterwards.

Kinds:
- "sqlite": a file in a temporary directory.
- "mariadb": a database on the server of `TASKSTREAM_TEST_MYSQL_URL`
  (default `mysql://root@127.0.0.1:3306/test`). Always expected: an unreachable server fails
  the tests instead of skipping them.
- "postgres": a database on the server of `TASKSTREAM_TEST_POSTGRES_URL`
  (default `postgresql://postgres@127.0.0.1:5432/postgres`), used when its port answers.

Only databases named `ts_t_<hex>` created here are ever dropped; the admin URL's own database
is used for CREATE/DROP DATABASE only.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from taskstream.core.store.migrate import upgrade
from tests.support import db_templates
from tests.support.db_ahead import Ahead
from tests.support.db_servers import (
    DEFAULT_MYSQL_URL,
    DEFAULT_POSTGRES_URL,
    MYSQL_ENV,
    POSTGRES_ENV,
    admin_url,
    create_ddl,
    drop_ddl,
    server_ddl,
    with_database,
)

__all__ = [
    "DEFAULT_MYSQL_URL",
    "DEFAULT_POSTGRES_URL",
    "KINDS",
    "MYSQL_ENV",
    "POSTGRES_ENV",
    "admin_url",
    "available_kinds",
    "close",
    "empty_database",
    "migrated_database",
    "temp_database",
]

KINDS = ("sqlite", "mariadb", "postgres")
_PROBE_TIMEOUT_S = 1.0
_AHEAD = Ahead()


def _reachable(url: str) -> bool:
    parsed = make_url(url)
    try:
        with socket.create_connection(
            (parsed.host or "127.0.0.1", parsed.port or 5432), timeout=_PROBE_TIMEOUT_S
        ):
            return True
    except OSError:
        return False


def available_kinds() -> list[str]:
    """Kinds to test: sqlite and mariadb always, postgres when its port answers within 1 s."""
    kinds = ["sqlite", "mariadb"]
    if _reachable(admin_url("postgres")):
        kinds.append("postgres")
    return kinds


@asynccontextmanager
async def temp_database(kind: str) -> AsyncIterator[str]:
    """A fresh database of `kind` at the newest schema; yields its (user-form) URL, then
    drops it.

    It is a copy of a database migrated once per kind and test process
    (`tests.support.db_templates`), so it holds what `upgrade` leaves in an empty database:
    the schema and the `alembic_version` row. A server kind's copy was made while the test
    before it ran, and a PostgreSQL one is dropped on the thread that made it
    (`tests.support.db_ahead`). Tests whose subject is migrating use
    `migrated_database` or `empty_database`. Close every store opened on the URL before
    leaving the block.
    """
    _check_kind(kind)
    if kind == "sqlite":
        template = await db_templates.template(kind)
        async with _sqlite_database(_new_name(), copy_of=Path(template.source)) as url:
            yield url
        return
    made = _AHEAD.take(kind)
    try:
        name = await asyncio.wrap_future(made)
    except asyncio.CancelledError:
        _AHEAD.discard(kind, made)
        raise
    admin = admin_url(kind)
    try:
        yield with_database(admin, name)
    finally:
        if kind == "postgres":
            _AHEAD.give_back(kind, name)
        else:
            await server_ddl(admin, *drop_ddl(kind, name))


def close() -> None:
    """Drop what this process made ahead for tests that never came, and the templates; call
    it with no event loop running (pytest_sessionfinish does)."""
    _AHEAD.close()
    db_templates.drop_templates()


@asynccontextmanager
async def migrated_database(kind: str) -> AsyncIterator[str]:
    """A fresh database of `kind` that `upgrade` migrates from empty; dropped afterwards."""
    async with empty_database(kind) as url:
        await upgrade(url)
        yield url


@asynccontextmanager
async def empty_database(kind: str) -> AsyncIterator[str]:
    """A fresh database of `kind` with no tables (never migrated); dropped afterwards."""
    _check_kind(kind)
    name = _new_name()
    holder = _sqlite_database(name) if kind == "sqlite" else _server_database(kind, name)
    async with holder as url:
        yield url


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown database kind {kind!r}; expected one of {KINDS}")


def _new_name() -> str:
    return f"ts_t_{uuid.uuid4().hex}"


@asynccontextmanager
async def _server_database(kind: str, name: str) -> AsyncIterator[str]:
    """The empty database `name` on the server of `kind`."""
    admin = admin_url(kind)
    await server_ddl(admin, *create_ddl(kind, name))
    try:
        yield with_database(admin, name)
    finally:
        await server_ddl(admin, *drop_ddl(kind, name))


@asynccontextmanager
async def _sqlite_database(name: str, *, copy_of: Path | None = None) -> AsyncIterator[str]:
    """A database file `name` in a new temporary directory: a copy of `copy_of`, or an empty
    file (a database with no tables; only migrations make a file that is not there)."""
    directory = Path(tempfile.mkdtemp(prefix="ts_t_"))
    path = directory / f"{name}.db"
    try:
        if copy_of is not None:
            shutil.copyfile(copy_of, path)
        else:
            path.touch()
        yield f"sqlite:///{path}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
