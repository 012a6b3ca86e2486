"""A throwaway database copied from a migrated template (`temp_database`) is the database
`upgrade` builds from empty: the same tables, columns, keys, indexes, table options and
revision, and no rows but the revision's, on every database kind."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from taskstream.core.store.migrate import current_revision
from taskstream.core.store.sql import SqlStore
from tests.support.databases import available_kinds, migrated_database, temp_database

Schema = dict[str, Any]


def _table(conn: Connection, name: str) -> dict[str, Any]:
    found = inspect(conn)
    columns = [{**c, "type": repr(c["type"])} for c in found.get_columns(name)]
    return {
        "columns": columns,
        "primary key": found.get_pk_constraint(name),
        "foreign keys": found.get_foreign_keys(name),
        "indexes": found.get_indexes(name),
        "unique": found.get_unique_constraints(name),
        "checks": found.get_check_constraints(name),
        "options": found.get_table_options(name),
        "rows": conn.execute(text(f"SELECT COUNT(*) FROM {name}")).scalar_one(),
    }


def _raw(conn: Connection) -> list[Any]:
    """What the server itself says of the schema where that is one query away."""
    if conn.dialect.name == "sqlite":
        return list(conn.execute(text("SELECT type, name, tbl_name, sql FROM sqlite_master")))
    if conn.dialect.name == "mysql":
        names = sorted(inspect(conn).get_table_names())
        return [conn.execute(text(f"SHOW CREATE TABLE `{n}`")).one()[1] for n in names]
    return []


def _dump(conn: Connection) -> Schema:
    names = sorted(inspect(conn).get_table_names())
    return {
        "tables": {name: _table(conn, name) for name in names},
        "views": inspect(conn).get_view_names(),
        "raw": _raw(conn),
    }


async def _schema(url: str) -> tuple[Schema, str | None]:
    store = await SqlStore.connect(url)
    try:
        async with store.engine.connect() as conn:
            schema = await conn.run_sync(_dump)
    finally:
        await store.close()
    return schema, await current_revision(url)


@pytest.mark.parametrize("kind", available_kinds())
async def test_a_copy_is_the_database_the_migrations_build(kind: str) -> None:
    async with migrated_database(kind) as url:
        migrated = await _schema(url)
    copies = []
    for _ in range(2):  # the first copy may have made the template; the second reuses it
        async with temp_database(kind) as url:
            copies.append(await _schema(url))

    assert migrated[0]["tables"], "the migrations must have made tables"
    assert migrated[1] is not None
    assert copies == [migrated, migrated]
