"""`db_now_ms()`: the database server's clock as UTC epoch milliseconds, in SQL.

Leases, `created_at_ms`, `updated_at_ms` and history `at_ms` are computed from this expression
inside the statement that writes them, so every executor measures time with one clock (the
database's) whatever its own clock says.

Per dialect:
- MySQL / MariaDB: `NOW(3)` has millisecond precision and `UNIX_TIMESTAMP` of it is an exact
  DECIMAL(.., 3), so `* 1000` is an exact integer and the cast does not round. `NOW()` is read in
  the session time zone; the engine pins sessions to `+00:00` so a DST change of the server's zone
  cannot shift it.
- SQLite: `julianday('now')` is a double derived from a millisecond count; `ROUND` removes the
  representation error that a bare cast would truncate to the millisecond below.
- PostgreSQL: `statement_timestamp()`, floored to the millisecond. Like MySQL's `NOW()` and
  SQLite's `'now'` it is one value for the whole statement (so `created_at_ms` and
  `updated_at_ms` written together are equal) and, unlike `now()`, it is not frozen at the start
  of the transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class db_now_ms(FunctionElement[int]):
    """SQL expression for the database clock, UTC epoch milliseconds (BIGINT)."""

    type = BigInteger()
    inherit_cache = True
    name = "db_now_ms"


@compiles(db_now_ms)
def _default(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    raise CompileError(f"db_now_ms() is not defined for dialect {compiler.dialect.name!r}")


@compiles(db_now_ms, "mysql")
@compiles(db_now_ms, "mariadb")
def _mysql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"


@compiles(db_now_ms, "sqlite")
def _sqlite(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"


@compiles(db_now_ms, "postgresql")
def _postgresql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"
