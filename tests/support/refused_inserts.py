"""A real database made to fail a write part-way: a trigger that refuses every insert into a
table, on SQLite, MySQL / MariaDB and PostgreSQL. Statements before the refused insert run;
the insert fails with `MESSAGE`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

MESSAGE = "inserts refused by a test trigger"


def _ddl(dialect: str, table: str) -> list[str]:
    name = f"refuse_{table}"
    if dialect == "sqlite":
        return [
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
            f"BEGIN SELECT RAISE(FAIL, '{MESSAGE}'); END"
        ]
    if dialect == "mysql":
        return [
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW "
            f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'"
        ]
    return [
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$",
        f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
    ]


def _drop(dialect: str, table: str) -> list[str]:
    name = f"refuse_{table}"
    if dialect == "postgresql":
        return [f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}()"]
    return [f"DROP TRIGGER {name}"]


@asynccontextmanager
async def refused_inserts(engine: AsyncEngine, table: str) -> AsyncIterator[None]:
    """Every insert into `table` (one of ours: the name is not quoted) fails inside."""
    dialect = engine.dialect.name
    async with engine.begin() as conn:
        for statement in _ddl(dialect, table):
            await conn.execute(text(statement))
    try:
        yield
    finally:
        async with engine.begin() as conn:
            for statement in _drop(dialect, table):
                await conn.execute(text(statement))
