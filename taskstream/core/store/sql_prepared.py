"""Statements built once per shape, and the two ways of sending them.

The batch writes on the hot path (the executor's claims and finishes) send a few statements
per transaction, for one instance or for hundreds. Building a Core statement for each call,
computing its cache key and going through the engine's execution path cost the client more
CPU than the server spends on the statement: on the benchmark hosts about 0.33 ms for a
one-row SELECT through the engine against 0.1 ms through the driver alone, and several ms
per instance for a claim and a finish of one row. So:

- A `Template` is a Core statement whose every value is a named `bindparam` (or a constant),
  built once per shape (e.g. the number of ids) by a memoized builder (`sql_templates`).
- A `RowsTemplate` is a one-row INSERT built the same way, sent for many rows at once.
- `CoreRunner` sends templates through an `AsyncConnection`: any dialect, in a transaction
  the caller opened with the engine.
- `DriverRunner` sends them through the DBAPI driver's own cursor (MySQL / MariaDB, asyncmy):
  each template is compiled once per dialect to SQL text with positional markers, and the
  values always travel separately, so the statements stay parameterised. The transaction
  around it is `sql_driver.driver_transaction`.

Both return the same things: an UPDATE's matched-row count, or rows as plain dicts keyed by
column label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Executable

_Text = TypeVar("_Text")


class CompiledText(NamedTuple):
    """A template as one dialect's SQL text: the bind names in marker order, and the values
    of the constants the template carries (the caller's values override them)."""

    sql: str
    names: tuple[str, ...]
    constants: dict[str, Any]

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for `sql`: each marker's value from `params`, else the
        template's constant; `KeyError` naming a bind that has neither."""
        constants = self.constants
        return [params[n] if n in params else constants[n] for n in self.names]


@dataclass(eq=False)
class _PerDialect(Generic[_Text]):
    """A statement built for one shape; its compiled text is kept per dialect."""

    statement: Executable
    _texts: dict[str, _Text] = field(default_factory=dict, repr=False)

    def text_for(self, dialect: Dialect) -> _Text:
        """The text for `dialect` (positional paramstyle only), compiled on first use."""
        found = self._texts.get(dialect.name)
        if found is None:
            found = self._texts[dialect.name] = self._compile(dialect)
        return found

    def _compile(self, dialect: Dialect) -> _Text:
        raise NotImplementedError


class Template(_PerDialect[CompiledText]):
    """A statement whose every value is a named bind (or a constant)."""

    def _compile(self, dialect: Dialect) -> CompiledText:
        return compile_text(self.statement, dialect)


def compile_text(statement: Executable, dialect: Dialect) -> CompiledText:
    """`statement` compiled for `dialect`, which must use a positional paramstyle and need no
    bind processing for the template's types (strings and integers). `ValueError` otherwise,
    so a template never sends a value the engine would have converted first."""
    compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    if not dialect.positional or compiled.positiontup is None:
        raise ValueError(f"dialect {dialect.name!r} does not use positional parameters")
    if compiled._bind_processors:
        raise ValueError(f"template binds need conversion on {dialect.name!r}: {compiled.string}")
    names = tuple(compiled.positiontup)
    binds = compiled.binds
    constants = {n: binds[n].effective_value for n in names if not binds[n].required}
    return CompiledText(compiled.string, names, constants)


class ValuesText(NamedTuple):
    """A one-row INSERT's text split around its row, `head` ending in `VALUES `, and its
    binds (as `CompiledText`)."""

    head: str
    row: str
    names: tuple[str, ...]
    constants: dict[str, Any]

    def sql(self, n: int) -> str:
        """The INSERT of `n` rows."""
        return self.head + ", ".join([self.row] * n)

    def arguments(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The positional arguments of `sql(len(rows))`: each row's, in row order."""
        constants, names = self.constants, self.names
        return [row[n] if n in row else constants[n] for row in rows for n in names]


def compile_values(statement: Executable, dialect: Dialect) -> ValuesText:
    """`compile_text` of a one-row INSERT ... VALUES, split to repeat its row."""
    text = compile_text(statement, dialect)
    marker = " VALUES ("
    at = text.sql.find(marker)
    if at < 0 or text.sql.count(marker) != 1 or not text.sql.endswith(")"):
        raise ValueError(f"not a one-row INSERT ... VALUES: {text.sql}")
    head = text.sql[: at + len(marker) - 1]
    return ValuesText(head, text.sql[len(head) :], text.names, text.constants)


class RowsTemplate(_PerDialect[ValuesText]):
    """A one-row INSERT whose every value is a named bind or SQL, sent for many rows at
    once."""

    def _compile(self, dialect: Dialect) -> ValuesText:
        return compile_values(self.statement, dialect)


class Runner(Protocol):
    """Sends templates inside one transaction that the caller owns."""

    async def count(self, template: Template, params: Mapping[str, Any]) -> int:
        """Run an UPDATE / INSERT; the rows it matched (MySQL: matched, not changed)."""
        ...

    async def rows(self, template: Template, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run a SELECT; its rows as dicts keyed by column label."""
        ...

    async def insert(self, template: RowsTemplate, rows: Sequence[Mapping[str, Any]]) -> None:
        """INSERT `rows` (at least one), each binding the template's names."""
        ...


class CoreRunner:
    """A `Runner` over an engine connection (`conn.execute`), for every dialect."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def count(self, template: Template, params: Mapping[str, Any]) -> int:
        result = await self.conn.execute(template.statement, dict(params))
        return int(result.rowcount)

    async def rows(self, template: Template, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        result = await self.conn.execute(template.statement, dict(params))
        return [dict(m) for m in result.mappings().all()]

    async def insert(self, template: RowsTemplate, rows: Sequence[Mapping[str, Any]]) -> None:
        # An executemany: the engine renders the rows into multi-row INSERTs itself
        # ("insertmanyvalues") from the one compiled form.
        await self.conn.execute(template.statement, [dict(r) for r in rows])


class DriverRunner:
    """A `Runner` over a DBAPI driver's async cursor (asyncmy): compiled text, no engine."""

    def __init__(
        self, cursor: Any, dialect: Dialect, listeners: Sequence[Callable[[str], None]] = ()
    ) -> None:
        """`listeners` get each statement's text before it is sent (the engine's own
        `before_cursor_execute` event does not see this path)."""
        self._cursor = cursor
        self._dialect = dialect
        self._listeners = listeners

    async def _send(self, template: Template, params: Mapping[str, Any]) -> None:
        text = template.text_for(self._dialect)
        await self._execute(text.sql, text.arguments(params))

    async def _execute(self, sql: str, arguments: list[Any]) -> None:
        for listener in self._listeners:
            listener(sql)
        await self._cursor.execute(sql, arguments)

    async def count(self, template: Template, params: Mapping[str, Any]) -> int:
        await self._send(template, params)
        return int(self._cursor.rowcount)

    async def rows(self, template: Template, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        await self._send(template, params)
        labels = [d[0] for d in self._cursor.description or ()]
        return [dict(zip(labels, row, strict=True)) for row in await self._cursor.fetchall()]

    async def insert(self, template: RowsTemplate, rows: Sequence[Mapping[str, Any]]) -> None:
        text = template.text_for(self._dialect)
        await self._execute(text.sql(len(rows)), text.arguments(rows))
