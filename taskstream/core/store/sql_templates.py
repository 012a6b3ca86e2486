"""The batch statements of the hot path as templates (`sql_prepared.Template`), one per shape,
with the functions that bind a batch's values to them.

A shape is what changes the SQL text: the number of ids, whether the rows share one attempt,
which columns an UPDATE sets and whether each row gets its own value. Builders are memoized
on the shape, so a busy process builds each statement once; the values of a call travel as
parameters. Binds are named `id<k>` for the k-th id (in the order given, which callers keep
sorted so rows lock in id order), `at<k>` its attempt, `<column><k>` a per-row value.
Statements keep the rules of `sql_queries`: rows are addressed through the primary key, per-row
values go as `CASE WHEN id = ... THEN ... END`, and their count never grows with the rows.

Lists of n ids are sent in a statement sized for `size_for(n)` ids (the next power of two, at
most `sql_chunks.CHUNK`), the last id repeated to fill it: a repeated id in an `IN` list or a
`CASE` selects and updates the same row once, and a process keeps about ten sizes of each
statement instead of up to 200 (each several hundred KB at the largest). New rows are inserted
with a one-row INSERT sent for many rows (`sql_prepared.RowsTemplate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal, TypeVar

from sqlalchemy import String, and_, bindparam, case, insert, or_, select, tuple_, update
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from taskstream.core.states import Status
from taskstream.core.store import sql_codec as codec
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.sql_prepared import RowsTemplate, Template
from taskstream.core.store.tables import INSTANCE_COLUMNS, OWNER_LEN, STATUS_LEN
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.store.tables import task_definitions as defs
from taskstream.core.store.tables import task_instances as inst

_T = TypeVar("_T")
Mode = Literal["one", "each", "now", "next"]
"""How an UPDATE sets a column: `one` value for every row (bind `v_<column>`), a value for
`each` of the m rows that give one (row `<column>_id<j>` gets `<column><j>`; the other rows
keep theirs), the database clock (`now`), or the attempt + 1 (`next`)."""

Columns = tuple[tuple[str, Mode, int], ...]
"""(column, mode, m): m counts the rows given a value in mode `each`, else 0."""
Bound = tuple[Template, dict[str, Any]]
"""A template and the parameters of one call."""

_CACHED_SHAPES = 256
"""Templates kept per builder: about ten sizes (`size_for`) times the column variants."""
_MAX_SIZE = 200
"""The largest size: `sql_chunks.CHUNK`, the most ids callers put in one statement."""


def size_for(n: int) -> int:
    """The statement size for `n` ids: the next power of two, capped at `_MAX_SIZE` (or `n`
    itself when larger)."""
    if n >= _MAX_SIZE:
        return n
    return min(1 << max(n - 1, 0).bit_length(), _MAX_SIZE)


def padded(items: Sequence[_T]) -> list[_T]:
    """`items` with its last item repeated up to `size_for(len(items))`."""
    out = list(items)
    if out:
        out.extend([out[-1]] * (size_for(len(out)) - len(out)))
    return out


def _ids(n: int) -> list[BindParameter[Any]]:
    return [bindparam(f"id{k}") for k in range(n)]


def id_params(ids: Sequence[str]) -> dict[str, Any]:
    """The `id<k>` binds of `ids` (already `padded`), in their order."""
    return {f"id{k}": i for k, i in enumerate(ids)}


def bind_lock(ids: Sequence[str]) -> Bound:
    """`lock_rows` for `ids`."""
    full = padded(ids)
    return lock_rows(len(full)), id_params(full)


@lru_cache(maxsize=_CACHED_SHAPES)
def lock_rows(n: int) -> Template:
    """Whole rows of `n` ids and the database clock (`db_now_ms`), locked in id order."""
    stmt = (
        select(*INSTANCE_COLUMNS, db_now_ms().label("db_now_ms"))
        .where(inst.c.id.in_(_ids(n)))
        .order_by(inst.c.id)
        .with_for_update()
    )
    return Template(stmt)


def bind_lock_states(ids: Sequence[str]) -> Bound:
    """`lock_states` for `ids`."""
    full = padded(ids)
    return lock_states(len(full)), id_params(full)


@lru_cache(maxsize=_CACHED_SHAPES)
def lock_states(n: int) -> Template:
    """(id, status, attempt, lease_owner) of `n` ids, locked in id order."""
    stmt = (
        select(inst.c.id, inst.c.status, inst.c.attempt, inst.c.lease_owner)
        .where(inst.c.id.in_(_ids(n)))
        .order_by(inst.c.id)
        .with_for_update()
    )
    return Template(stmt)


def _match(n: int, one_attempt: bool) -> ColumnElement[bool]:
    ids = inst.c.id.in_(_ids(n))
    if one_attempt:
        return and_(ids, inst.c.attempt == bindparam("b_attempt"))
    pairs = [tuple_(bindparam(f"id{k}"), bindparam(f"at{k}")) for k in range(n)]
    return and_(ids, tuple_(inst.c.id, inst.c.attempt).in_(pairs))


def match_params(pairs: Sequence[tuple[str, int]]) -> tuple[bool, dict[str, Any]]:
    """Whether `pairs` (id, attempt; already `padded`) share one attempt, and the binds that
    address them."""
    params = id_params([i for i, _ in pairs])
    attempts = {a for _, a in pairs}
    if len(attempts) == 1:
        params["b_attempt"] = attempts.pop()
        return True, params
    params.update({f"at{k}": a for k, (_, a) in enumerate(pairs)})
    return False, params


def _set(name: str, mode: Mode, m: int) -> Any:
    column = inst.c[name]
    if mode == "one":
        return bindparam(f"v_{name}", type_=column.type)
    if mode == "now":
        return db_now_ms()
    if mode == "next":
        return column + 1
    whens = [
        (inst.c.id == bindparam(f"{name}_id{j}"), bindparam(f"{name}{j}", type_=column.type))
        for j in range(m)
    ]
    return case(*whens, else_=column)


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOW = _Marker("NOW")
"""A column value in `bind_update`: the database clock (every row must use it alike)."""
NEXT = _Marker("NEXT")
"""A column value in `bind_update`: the row's attempt + 1 (every row must use it alike)."""


@lru_cache(maxsize=_CACHED_SHAPES)
def cas_update(n: int, one_attempt: bool, columns: Columns) -> Template:
    """UPDATE the `n` rows at status `src` and their attempts (bind `b_attempt`, or `at<k>`
    each), setting `columns`."""
    values = {name: _set(name, mode, m) for name, mode, m in columns}
    stmt = (
        update(inst)
        .where(inst.c.status == bindparam("src"), _match(n, one_attempt))
        .values(**values)
    )
    return Template(stmt)


def bind_update(
    src: Status, pairs: Sequence[tuple[str, int]], rows: Sequence[Mapping[str, Any]]
) -> Bound:
    """The CAS UPDATE of `pairs` from `src`, row k taking the columns of `rows[k]` (a value, or
    the marker strings `NOW` / `NEXT` for the database clock / attempt + 1). A column some
    rows leave out keeps those rows' values."""
    if len(pairs) != len(rows):
        raise ValueError(f"bind_update: {len(pairs)} rows named, {len(rows)} given values")
    one_attempt, params = match_params(padded(pairs))
    params["src"] = src.value
    columns: list[tuple[str, Mode, int]] = []
    for name in sorted({c for r in rows for c in r}):
        given = [(i, r[name]) for (i, _), r in zip(pairs, rows, strict=True) if name in r]
        first = given[0][1]
        if first is NOW or first is NEXT:
            columns.append((name, "now" if first is NOW else "next", 0))
        elif len(given) == len(rows) and all(v == first for _, v in given):
            columns.append((name, "one", 0))
            params[f"v_{name}"] = first
        else:
            given = _padded_values(given)
            columns.append((name, "each", len(given)))
            for j, (i, v) in enumerate(given):
                params[f"{name}_id{j}"], params[f"{name}{j}"] = i, v
    return cas_update(size_for(len(pairs)), one_attempt, tuple(columns)), params


def _padded_values(given: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """(id, value) pairs padded to `size_for` with the last id and NULL: `CASE` takes the
    first `WHEN` an id matches, so the padding is never used, and a large value (a result of
    megabytes) is sent once, not once per padded place."""
    return given + [(given[-1][0], None)] * (size_for(len(given)) - len(given))


def _per_row(name: str, n: int, each: bool, type_: Any) -> Any:
    if not each:
        return bindparam(name, type_=type_)
    whens = [
        (inst.c.id == bindparam(f"id{k}"), bindparam(f"{name}{k}", type_=type_)) for k in range(n)
    ]
    return case(*whens)


@lru_cache(maxsize=_CACHED_SHAPES)
def history(n: int, owner_each: bool, reason_each: bool) -> Template:
    """One history row per id, copying dst, attempt and time from the row just written; the
    source status is bind `src`, owner and reason `owner` / `reason` or one per row."""
    source = (
        select(
            inst.c.id,
            bindparam("src", type_=String(STATUS_LEN)),
            inst.c.status,
            inst.c.attempt,
            _per_row("owner", n, owner_each, String(OWNER_LEN)),
            _per_row("reason", n, reason_each, String()),
            inst.c.updated_at_ms,
        )
        .where(inst.c.id.in_(_ids(n)))
        .order_by(inst.c.id)
    )
    columns = ["instance_id", "from_status", "to_status", "attempt", "owner", "reason", "at_ms"]
    return Template(insert(hist).from_select(columns, source))


def bind_history(
    ids: Sequence[str],
    src: Status | None,
    owners: Mapping[str, str | None],
    reasons: Mapping[str, str],
) -> Bound:
    """`history` for `ids` (kept in the order given) with their owners and reasons."""
    full = padded(ids)
    params = id_params(full)
    params["src"] = None if src is None else src.value
    shape = []
    for name, values in (
        ("owner", [owners[i] for i in full]),
        ("reason", [codec.reason(reasons[i]) for i in full]),
    ):
        each = len(set(values)) > 1
        shape.append(each)
        if each:
            params.update({f"{name}{k}": v for k, v in enumerate(values)})
        else:
            params[name] = values[0]
    return history(len(full), shape[0], shape[1]), params


@lru_cache(maxsize=_CACHED_SHAPES)
def taken(n_keys: int, n_ids: int) -> Template:
    """(dedupe_key, id) of the rows holding one of `n_keys` dedupe keys (binds `key<k>`) or
    one of `n_ids` ids (binds `id<k>`): one read through both unique indexes."""
    keys: list[BindParameter[Any]] = [bindparam(f"key{k}") for k in range(n_keys)]
    stmt = select(inst.c.dedupe_key, inst.c.id).where(
        or_(inst.c.dedupe_key.in_(keys), inst.c.id.in_(_ids(n_ids)))
    )
    return Template(stmt)


def bind_taken(keys: Sequence[str], ids: Sequence[str]) -> Bound:
    """`taken` for `keys` and `ids`."""
    full_keys, full_ids = padded(keys), padded(ids)
    params = id_params(full_ids) | {f"key{k}": v for k, v in enumerate(full_keys)}
    return taken(len(full_keys), len(full_ids)), params


@lru_cache(maxsize=_CACHED_SHAPES)
def insert_row(columns: tuple[str, ...]) -> RowsTemplate:
    """An INSERT of one row setting `columns` (bind `v_<column>`), both times from the
    database clock; sent for many rows at once."""
    now = db_now_ms()
    values = {c: bindparam(f"v_{c}", type_=inst.c[c].type) for c in columns}
    return RowsTemplate(insert(inst).values(values | {"created_at_ms": now, "updated_at_ms": now}))


def bind_insert(rows: Sequence[Mapping[str, Any]]) -> tuple[RowsTemplate, list[dict[str, Any]]]:
    """`insert_row` for `rows`, which must all set the same columns."""
    if any(row.keys() != rows[0].keys() for row in rows):
        raise ValueError("bind_insert: rows set different columns")
    params = [{f"v_{c}": v for c, v in row.items()} for row in rows]
    return insert_row(tuple(rows[0])), params


@lru_cache(maxsize=_CACHED_SHAPES)
def leader_tokens(n: int) -> Template:
    """(task_id, cursor_token) of `n` tasks (binds `task<k>`), read under a shared lock held
    until commit, so a new leader's takeover (`claim_cursors`) waits for the transaction."""
    tasks: list[BindParameter[Any]] = [bindparam(f"task{k}") for k in range(n)]
    stmt = select(defs.c.task_id, defs.c.cursor_token).where(defs.c.task_id.in_(tasks))
    return Template(stmt.with_for_update(read=True))


def bind_leader_tokens(task_ids: Sequence[str]) -> Bound:
    """`leader_tokens` for `task_ids`."""
    full = padded(task_ids)
    return leader_tokens(len(full)), {f"task{k}": t for k, t in enumerate(full)}
