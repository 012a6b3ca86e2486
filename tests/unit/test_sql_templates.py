"""Templates of the hot path: one statement per shape, values only as parameters, compiled
text whose positional arguments line up with the binds. No database: the dialects compile."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import DateTime, String, bindparam, select
from sqlalchemy.dialects import mysql, postgresql, sqlite

from taskstream.core.states import Status
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.sql_prepared import Template, compile_text, compile_values

MYSQL = mysql.asyncmy.dialect()


def _sent(template: Template, params: dict[str, Any]) -> tuple[str, list[Any]]:
    text = template.text_for(MYSQL)
    return text.sql, text.arguments(params)


def test_a_shape_is_built_once_and_values_only_travel_as_parameters() -> None:
    a = templates.bind_update(Status.RUNNING, [("i1", 1), ("i2", 1)], [{"status": "SUCCESS"}] * 2)
    b = templates.bind_update(Status.RUNNING, [("j1", 1), ("j2", 1)], [{"status": "FAILED"}] * 2)

    assert a[0] is b[0]
    sql, args = _sent(*b)
    assert "j1" not in sql and "FAILED" not in sql
    assert args == ["FAILED", "RUNNING", "j1", "j2", 1]


def test_rows_with_their_own_values_and_rows_that_keep_theirs() -> None:
    rows: list[dict[str, Any]] = [
        {"result": "r1", "last_error": "e1", "updated_at_ms": templates.NOW},
        {"result": "r2", "updated_at_ms": templates.NOW},
        {"result": "r3", "last_error": "e3", "updated_at_ms": templates.NOW},
    ]
    template, params = templates.bind_update(
        Status.RUNNING, [("i1", 1), ("i2", 1), ("i3", 1)], rows
    )
    sql, args = _sent(template, params)

    assert sql.startswith("UPDATE task_instances SET result=CASE WHEN")
    assert "ELSE task_instances.last_error END" in sql
    assert "updated_at_ms=CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)" in sql
    # In the table's column order. result: all three rows; last_error: the two that give one.
    # Three rows go in the statement for four, the last id repeated with no value (a CASE
    # takes its first match, so the padding is never used).
    assert args == [
        *("i1", "r1", "i2", "r2", "i3", "r3", "i3", None),
        *("i1", "e1", "i3", "e3"),
        *("RUNNING", "i1", "i2", "i3", "i3", 1),
    ]


def test_a_large_value_is_sent_once_whatever_the_padding() -> None:
    """65 rows go in the statement for 128: the last row's result, if copied into the 63
    padded places, would make a 300 KB batch a 19 MB statement (over MariaDB's packet limit)."""
    pairs = [(f"i{n:03d}", 1) for n in range(65)]
    rows = [{"result": f"r{n}"} for n in range(64)] + [{"result": "x" * 300_000}]
    _, args = _sent(*templates.bind_update(Status.RUNNING, pairs, rows))

    assert sum(1 for a in args if isinstance(a, str) and len(a) == 300_000) == 1
    assert args.count(None) == 128 - 65


def test_rows_at_different_attempts_are_matched_as_pairs() -> None:
    rows = [{"status": "DISPATCHED", "attempt": templates.NEXT}] * 2
    template, params = templates.bind_update(Status.PENDING, [("i1", 0), ("i2", 3)], rows)
    sql, args = _sent(template, params)

    assert "attempt=(task_instances.attempt + %s)" in sql
    assert "(task_instances.id, task_instances.attempt) IN ((%s, %s), (%s, %s))" in sql
    assert args == ["DISPATCHED", 1, "PENDING", "i1", "i2", "i1", 0, "i2", 3]


def test_history_binds_one_owner_or_one_per_row() -> None:
    same, p1 = templates.bind_history(
        ["a", "b"],
        Status.DISPATCHED,
        {"a": "x", "b": "x"},
        {
            "a": "claimed",
            "b": "claimed",
        },
    )
    each, p2 = templates.bind_history(
        ["a", "b"],
        None,
        {"a": "x", "b": None},
        {
            "a": "r",
            "b": "r",
        },
    )

    assert same is not each
    assert _sent(same, p1)[1] == ["DISPATCHED", "x", "claimed", "a", "b"]
    assert _sent(each, p2)[1] == [None, "a", "x", "b", None, "r", "a", "b"]


def test_lock_rows_reads_the_database_clock_under_the_locks() -> None:
    sql, args = _sent(templates.lock_rows(2), templates.id_params(["a", "b"]))
    assert "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) AS db_now_ms" in sql
    assert sql.endswith("ORDER BY task_instances.id FOR UPDATE")
    assert args == ["a", "b"]


def test_a_missing_value_is_named() -> None:
    with pytest.raises(KeyError, match="id1"):
        _sent(templates.lock_rows(2), templates.id_params(["a"]))


def test_the_same_template_compiles_for_every_positional_dialect() -> None:
    template = templates.lock_rows(1)
    assert "?" in template.text_for(sqlite.dialect()).sql
    assert "%s" in template.text_for(MYSQL).sql


def test_compile_refuses_what_the_driver_path_cannot_send() -> None:
    with pytest.raises(ValueError, match="positional"):
        compile_text(select(bindparam("x")), postgresql.psycopg2.dialect())  # type: ignore[no-untyped-call]
    with pytest.raises(ValueError, match="conversion"):
        compile_text(select(bindparam("t", type_=DateTime())), sqlite.dialect())


def test_sizes_are_powers_of_two_up_to_a_chunk() -> None:
    assert [templates.size_for(n) for n in (0, 1, 2, 3, 5, 64, 65, 129, 200, 201)] == [
        *(1, 1, 2, 4, 8, 64, 128, 200, 200, 201)
    ]
    assert templates.padded(["a", "b", "c"]) == ["a", "b", "c", "c"]
    assert templates.padded([]) == []


def test_every_batch_size_shares_a_few_statements() -> None:
    shapes = {templates.bind_lock([f"i{k}" for k in range(n)])[0] for n in range(1, 201)}
    assert len(shapes) == 9


def test_a_padded_lock_names_each_row_once_more_at_most() -> None:
    sql, args = _sent(*templates.bind_lock(["a", "b", "c"]))
    assert sql.count("%s") == 4
    assert args == ["a", "b", "c", "c"]


def test_one_insert_row_is_repeated_for_many_rows() -> None:
    rows = [{"id": f"i{k}", "payload": f"p{k}"} for k in range(3)]
    template, params = templates.bind_insert(rows)
    text = template.text_for(MYSQL)

    assert templates.bind_insert(rows[:1])[0] is template
    assert text.sql(3) == (
        "INSERT INTO task_instances (id, payload, created_at_ms, updated_at_ms) VALUES "
        + ", ".join(
            ["(%s, %s, " + ", ".join(["CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"] * 2) + ")"]
            * 3
        )
    )
    assert text.arguments(params) == ["i0", "p0", "i1", "p1", "i2", "p2"]


def test_insert_rows_must_set_the_same_columns() -> None:
    with pytest.raises(ValueError, match="different columns"):
        templates.bind_insert([{"id": "a"}, {"id": "b", "payload": "{}"}])


def test_only_a_one_row_values_insert_can_be_repeated() -> None:
    with pytest.raises(ValueError, match="one-row INSERT"):
        compile_values(select(bindparam("x", type_=String())), MYSQL)
