"""Migrated templates for `temp_database`: the migrations run once per database kind and test
process, and every throwaway database after that is a copy of what they left.

Migrating an empty database costs about 0.2 s on SQLite and PostgreSQL and 1 to 1.5 s on
MariaDB (each of its DDL statements commits), and most tests want one; a copy costs a file
copy, one CREATE DATABASE ... TEMPLATE, or one CREATE TABLE per table.

- "sqlite": the migrated file. `upgrade` disposes its engine, so the write-ahead log is
  checkpointed into the file before the first copy (checked: nothing may lie beside it).
- "mariadb": `SHOW CREATE TABLE` of every table of the migrated database and INSERTs of its
  `alembic_version` rows, replayed in each copy with foreign key checks off (so table order
  does not matter); the migrated database is dropped once read. MariaDB cannot copy a
  database, and `CREATE TABLE ... LIKE` would leave the foreign keys out.
- "postgres": the migrated database, kept until `drop_templates` and named as the TEMPLATE
  of each copy; nothing connects to it after the migration (a copy needs that).

tests/contract/test_temp_databases.py checks each kind's copies against a database migrated
from empty.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from taskstream.core.store.migrate import upgrade
from taskstream.core.store.urls import normalize_url
from tests.support.db_servers import admin_url, create_ddl, drop_ddl, server_ddl, with_database

_VERSION = re.compile(r"\w+")


class TemplateError(RuntimeError):
    """The migrated database holds something a copy would not reproduce."""


@dataclass(frozen=True)
class Template:
    """What a fresh database of `kind` is copied from."""

    kind: str
    source: str = ""
    """SQLite: the migrated file's path; PostgreSQL: the migrated database's name."""
    statements: tuple[str, ...] = ()
    """MariaDB: what, run in an empty database, makes it the migrated one."""


_made: dict[str, Template] = {}


async def template(kind: str) -> Template:
    """The template of `kind` ("sqlite" | "mariadb" | "postgres"), migrated on first use."""
    found = _made.get(kind)
    if found is None:
        made = await _make(kind)
        found = _made.setdefault(kind, made)
        if found is not made:  # another task of this process made one meanwhile
            await _drop(made)
    return found


def drop_templates() -> None:
    """Remove every template this process made; call it with no event loop running."""
    while _made:
        _, made = _made.popitem()
        asyncio.run(_drop(made))


async def _make(kind: str) -> Template:
    name = f"ts_t_{uuid.uuid4().hex}"
    if kind == "sqlite":
        return await _sqlite_template(name)
    admin = admin_url(kind)
    url = with_database(admin, name)
    await server_ddl(admin, *create_ddl(kind, name))
    keep = False
    try:
        await upgrade(url)
        if kind == "mariadb":
            return Template(kind, statements=await _mysql_statements(url))
        keep = True
        return Template(kind, source=name)
    finally:
        if not keep:
            await server_ddl(admin, *drop_ddl(kind, name))


async def _sqlite_template(name: str) -> Template:
    folder = Path(tempfile.mkdtemp(prefix="ts_t_"))
    path = folder / f"{name}.db"
    try:
        await upgrade(f"sqlite:///{path}")
        _check_alone(path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Template("sqlite", source=str(path))


def _check_alone(path: Path) -> None:
    beside = sorted(p.name for p in path.parent.iterdir() if p != path)
    if beside:
        raise TemplateError(f"the migrated SQLite file has {beside} beside it")


async def _mysql_statements(url: str) -> tuple[str, ...]:
    """The DDL and rows that make an empty MariaDB database the one at `url`, which must hold
    base tables only, no rows besides `alembic_version`'s, and no triggers."""
    engine = create_async_engine(normalize_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            tables: list[Any] = list(await conn.exec_driver_sql("SHOW FULL TABLES"))
            kinds = {str(name): str(kind) for name, kind in tables}
            triggers = (await conn.exec_driver_sql("SHOW TRIGGERS")).all()
            creates = []
            for table in sorted(kinds):
                shown: Any = (await conn.exec_driver_sql(f"SHOW CREATE TABLE `{table}`")).one()
                creates.append(str(shown[1]))
            filled = [
                table
                for table in sorted(kinds)
                if table != "alembic_version"
                and (await conn.exec_driver_sql(f"SELECT 1 FROM `{table}` LIMIT 1")).first()
            ]
            versions = (
                (await conn.exec_driver_sql("SELECT version_num FROM alembic_version"))
                .scalars()
                .all()
            )
    finally:
        await engine.dispose()
    odd = {str(t): str(k) for t, k in kinds.items() if k != "BASE TABLE"}
    bad = [str(v) for v in versions if not _VERSION.fullmatch(str(v))]
    if odd or triggers or filled or bad:
        raise TemplateError(
            f"cannot copy: views {odd}, triggers {triggers}, rows in {filled}, versions {bad}"
        )
    inserts = [f"INSERT INTO alembic_version (version_num) VALUES ('{v}')" for v in versions]
    return ("SET SESSION foreign_key_checks = 0", *creates, *inserts)


async def _drop(made: Template) -> None:
    if made.kind == "sqlite":
        shutil.rmtree(Path(made.source).parent, ignore_errors=True)
    elif made.kind == "postgres":
        await server_ddl(admin_url(made.kind), *drop_ddl(made.kind, made.source))
