"""Throwaway databases for tests: one fresh, migrated database per use, dropped afterwards.

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

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from taskstream.core.store.migrate import upgrade
from taskstream.core.store.urls import normalize_url

MYSQL_ENV = "TASKSTREAM_TEST_MYSQL_URL"
POSTGRES_ENV = "TASKSTREAM_TEST_POSTGRES_URL"
DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
KINDS = ("sqlite", "mariadb", "postgres")
_PROBE_TIMEOUT_S = 1.0
_DROP_WAIT_S = 30


def admin_url(kind: str) -> str:
    """The server URL used to create and drop databases of `kind` ("mariadb" | "postgres")."""
    if kind == "mariadb":
        return os.environ.get(MYSQL_ENV, DEFAULT_MYSQL_URL)
    if kind == "postgres":
        return os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES_URL)
    raise ValueError(f"no admin URL for database kind {kind!r}")


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


def _with_database(url: str, name: str) -> str:
    parsed: URL = make_url(url).set(database=name)
    return parsed.render_as_string(hide_password=False)


async def _server_ddl(admin: str, *statements: str) -> None:
    engine = create_async_engine(
        normalize_url(admin), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


def _ddl(kind: str, name: str) -> tuple[list[str], list[str]]:
    # `name` is generated below from hex digits only, so quoting it is enough.
    if kind == "mariadb":
        return (
            [f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"],
            # A connection a test leaked would block the DROP for a day; fail instead.
            [
                f"SET SESSION lock_wait_timeout = {_DROP_WAIT_S}",
                f"DROP DATABASE IF EXISTS `{name}`",
            ],
        )
    return (
        [f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0"],
        [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'],
    )


@asynccontextmanager
async def _server_database(kind: str, name: str) -> AsyncIterator[str]:
    admin = admin_url(kind)
    create, drop = _ddl(kind, name)
    await _server_ddl(admin, *create)
    try:
        yield _with_database(admin, name)
    finally:
        await _server_ddl(admin, *drop)


@asynccontextmanager
async def _sqlite_database(name: str) -> AsyncIterator[str]:
    directory = Path(tempfile.mkdtemp(prefix="ts_t_"))
    try:
        yield f"sqlite:///{directory / name}.db"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def temp_database(kind: str) -> AsyncIterator[str]:
    """A fresh database of `kind`, migrated to head; yields its (user-form) URL, then drops it.

    Close every store opened on the URL before leaving the block.
    """
    async with empty_database(kind) as url:
        await upgrade(url)
        yield url


@asynccontextmanager
async def empty_database(kind: str) -> AsyncIterator[str]:
    """A fresh database of `kind` with no tables (never migrated); dropped afterwards."""
    if kind not in KINDS:
        raise ValueError(f"unknown database kind {kind!r}; expected one of {KINDS}")
    name = f"ts_t_{uuid.uuid4().hex}"
    holder = _sqlite_database(name) if kind == "sqlite" else _server_database(kind, name)
    async with holder as url:
        yield url
