"""Migrations build exactly the schema `tables.py` declares (the generated `settled` column and
the NO PAD collation on MySQL/MariaDB included), the database clock is sane, and an unreachable
database is a `StoreUnavailable` that does not leak the password."""

from __future__ import annotations

import ast
import asyncio
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Column,
    Computed,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    select,
    text,
)
from sqlalchemy.engine import Connection, make_url

from taskstream.core.errors import SchemaMissing, StoreError, StoreFileMissing, StoreUnavailable
from taskstream.core.states import IN_FLIGHT, SETTLED, Status
from taskstream.core.store import migrate as migrate_module
from taskstream.core.store import sql_engine
from taskstream.core.store.migrate import alembic_config, current_revision, upgrade
from taskstream.core.store.port import ClaimRequest
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import NOPAD_COLLATIONS, SETTLED_SQL, metadata
from taskstream.core.store.tables import task_instances as inst
from tests.contract.conftest import Advance, MakeNew
from tests.support.databases import (
    admin_url,
    available_kinds,
    empty_database,
    migrated_database,
)

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.fixture(params=available_kinds())
async def db_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A database of one kind that `upgrade` built from empty: the migrations are this
    module's subject, so it does not take the copy other contract tests start from."""
    async with migrated_database(request.param) as url:
        yield url


def _diff(target: MetaData) -> Callable[[Connection], list[Any]]:
    def run(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, target))

    return run


async def test_migrated_schema_equals_the_table_metadata(store: SqlStore) -> None:
    changed = MetaData()
    for table in metadata.tables.values():
        table.to_metadata(changed)
    Table("task_definitions", changed, Column("extra", Integer()), extend_existing=True)

    async with store.engine.connect() as conn:
        same = await conn.run_sync(_diff(metadata))
        different = await conn.run_sync(_diff(changed))

    assert same == []
    assert different, "the comparison must notice a column the database lacks"


async def test_upgrade_is_idempotent_and_reports_head(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Nothing may depend on the working directory (no alembic.ini, no relative paths).
    monkeypatch.chdir(tmp_path)

    assert HEAD == "0008"
    assert await current_revision(db_url) == HEAD
    await upgrade(db_url)
    assert await current_revision(db_url) == HEAD


async def _downgrade(store: SqlStore, revision: str) -> None:
    def run(connection: Connection) -> None:
        command.downgrade(alembic_config(connection), revision)

    async with store.engine.begin() as conn:
        await conn.run_sync(run)


async def test_concurrent_upgrades_of_an_empty_database_all_succeed(db_url: str) -> None:
    store = await SqlStore.connect(db_url)
    try:
        await _downgrade(store, "base")
        assert await current_revision(db_url) is None

        await asyncio.gather(*(upgrade(db_url) for _ in range(3)))

        assert await current_revision(db_url) == HEAD
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_diff(metadata)) == []
    finally:
        await store.close()


async def test_a_database_at_an_older_schema_says_to_run_migrate(store: SqlStore) -> None:
    """Migrated by an older taskstream (no `settled` column): not a plain outage, but the
    same fix as a database never migrated, and the services wait for it the same way."""
    await _downgrade(store, "0003")
    with pytest.raises(SchemaMissing, match=r"older schema .*: run `taskstream migrate`"):
        await store.get_instance("i-1")
    with pytest.raises(SchemaMissing, match="older schema"):
        await store.count_by_status()


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        ("DROP TABLE instance_history", "table instance_history"),
        ("ALTER TABLE task_instances DROP COLUMN trace_id", "column task_instances.trace_id"),
    ],
)
async def test_a_table_dropped_after_migrating_is_named_by_migrate(
    store: SqlStore, db_url: str, ddl: str, named: str
) -> None:
    """The roles say to run `taskstream migrate` for a missing table or column, but a
    database already at the newest revision gets nothing from the migrations: `migrate`
    names what is missing instead of succeeding with the roles still waiting."""
    async with store.engine.begin() as conn:
        await conn.execute(text(ddl))
    with pytest.raises(StoreError, match=rf"lacks {named} \(dropped by hand\?\)"):
        await upgrade(db_url)
    assert await current_revision(db_url) is not None


async def test_database_from_a_newer_version_is_refused(store: SqlStore, db_url: str) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))

    with pytest.raises(StoreError, match="9999"):
        await upgrade(db_url)


async def test_fresh_database_has_no_revision(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"

    assert await current_revision(url) is None
    assert not (tmp_path / "empty.db").exists()
    await upgrade(url)
    assert await current_revision(url) == HEAD


async def test_a_sqlite_file_that_is_not_there_is_made_by_migrations_only(tmp_path: Path) -> None:
    """A store opened on a path with no file fails each use with `StoreFileMissing` (an
    outage to the services, which wait for it) and makes no file; once `upgrade` made the
    file, the same store works."""
    path = tmp_path / "later.db"
    store = await SqlStore.connect(f"sqlite:///{path}", check=False)
    try:
        with pytest.raises(StoreFileMissing, match=f"no file {path} .*run `taskstream migrate`"):
            await store.ping()
        with pytest.raises(StoreFileMissing):
            await store.claim_many([ClaimRequest("i-1", 0, 30)], owner="o")
        assert not path.exists()
        await upgrade(f"sqlite:///{path}")
        assert await store.get_instance("i-1") is None
    finally:
        await store.close()
    with pytest.raises(StoreFileMissing):
        await SqlStore.connect(f"sqlite:///{tmp_path / 'other.db'}")
    assert issubclass(StoreFileMissing, SchemaMissing)


async def test_a_sqlite_file_made_by_migrations_is_its_owners_alone(tmp_path: Path) -> None:
    """The store file holds every payload and result: one that migrations make is 0600, and
    so are the journal files SQLite makes beside it; a file already there keeps its mode."""
    made, kept = tmp_path / "made.db", tmp_path / "kept.db"
    kept.touch(mode=0o640)
    kept.chmod(0o640)
    for path in (made, kept):
        await upgrade(f"sqlite:///{path}")
    store = await SqlStore.connect(f"sqlite:///{made}")
    try:
        await store.set_paused("no-such-task", True)  # a write: the -wal file is there
        modes = _modes(tmp_path, "made.db*")
    finally:
        await store.close()
    assert modes.get("made.db-wal") == 0o600, modes
    assert set(modes.values()) == {0o600}, modes
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def _modes(folder: Path, pattern: str) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.glob(pattern)}


async def test_database_clock_is_close_to_this_clock(store: SqlStore) -> None:
    before_ms = time.time() * 1000
    db_ms = await store.db_now_ms()
    after_ms = time.time() * 1000

    assert before_ms - 5_000 <= db_ms <= after_ms + 5_000
    await store.ping()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root:s3cr3t-pw@127.0.0.1:1/x",
        "postgresql://postgres:s3cr3t-pw@127.0.0.1:1/x",
    ],
    ids=["mariadb", "postgres"],
)
async def test_unreachable_server_is_unavailable_without_password(url: str) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        await SqlStore.connect(url)

    message = str(caught.value)
    assert "s3cr3t-pw" not in message
    assert "127.0.0.1:1" in message
    with pytest.raises(StoreUnavailable):
        await upgrade(url)


async def test_a_server_that_never_answers_the_handshake_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen server, or another service on a wrong port, accepts the connection and never
    answers: the driver's own timeout covers only the TCP connect, and the caller hung."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    monkeypatch.setattr(sql_engine, "CONNECT_TIMEOUT_S", 0.5)
    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(StoreUnavailable, match="no answer to the handshake"):
            await asyncio.wait_for(SqlStore.connect(f"mysql://root@127.0.0.1:{port}/x"), 30)
    finally:
        server.close()
        for writer in held:
            writer.close()


@pytest.mark.parametrize("kind", [k for k in available_kinds() if k != "sqlite"])
async def test_unknown_database_is_unavailable(kind: str) -> None:
    url = make_url(admin_url(kind)).set(database="ts_t_does_not_exist")

    with pytest.raises(StoreUnavailable, match="ts_t_does_not_exist"):
        await SqlStore.connect(url.render_as_string(hide_password=False))


async def test_unopenable_sqlite_file_is_unavailable(tmp_path: Path) -> None:
    before = set(threading.enumerate())

    with pytest.raises(StoreUnavailable, match="no-such-dir"):
        await SqlStore.connect(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")

    # aiosqlite stops the worker thread of a failed connect without awaiting it; let it finish
    # while this test's event loop is still open.
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)


async def test_unmigrated_database_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "bare.db").touch()
    store = await SqlStore.connect(f"sqlite:///{tmp_path / 'bare.db'}")
    try:
        with pytest.raises(StoreError):
            await store.list_definitions()
    finally:
        await store.close()


async def test_sessions_are_set_up_per_dialect(store: SqlStore) -> None:
    async with store.engine.connect() as conn:
        dialect = conn.dialect.name
        if dialect == "sqlite":
            pragmas = [
                (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()
                for name in ("journal_mode", "busy_timeout", "foreign_keys")
            ]
            assert pragmas == ["wal", 10_000, 1]
        else:
            assert await conn.get_isolation_level() == "READ COMMITTED"
        if dialect == "mysql":
            assert (await conn.exec_driver_sql("SELECT @@session.time_zone")).scalar() == "+00:00"


async def _settled(store: SqlStore) -> dict[str, object]:
    async with store.engine.connect() as conn:
        found = await conn.execute(select(inst.c.id, inst.c.settled).order_by(inst.c.id))
        return {str(i): settled for i, settled in found.all()}


async def test_settled_is_null_until_the_instance_settles_then_its_status(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    for status in Status:
        await store.create_instance(make_new(status.value))
        await advance(f"inst-{status.value}", status)

    settled = await _settled(store)

    assert settled == {f"inst-{s.value}": (s.value if s in SETTLED else None) for s in Status}, (
        "generated from the status on every write, never written itself"
    )
    assert set(IN_FLIGHT) == set(Status) - SETTLED


async def test_upgrade_to_0004_computes_settled_for_existing_rows(
    db_url: str, make_new: MakeNew
) -> None:
    store = await SqlStore.connect(db_url)
    try:
        await _downgrade(store, "0003")
        await store.create_instance(make_new("open"))
        await store.create_instance(make_new("done"))
        async with store.engine.begin() as conn:
            await conn.execute(
                text("UPDATE task_instances SET status = 'SUCCESS' WHERE id = 'inst-done'")
            )

        await upgrade(db_url)

        assert await _settled(store) == {"inst-done": "SUCCESS", "inst-open": None}
        stale = await store.stale([Status.PENDING], updated_before_ms=2**62, limit=10)
        assert [r.id for r in stale] == ["inst-open"]
    finally:
        await store.close()


_COLLATIONS = text(
    "SELECT TABLE_COLLATION FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
    " UNION ALL SELECT COLLATION_NAME FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names AND COLLATION_NAME IS NOT NULL"
).bindparams(bindparam("names", sorted(metadata.tables), expanding=True))
"""The collations of the store's tables and of their text columns (MySQL/MariaDB)."""


async def _collations(store: SqlStore) -> tuple[set[str], str] | None:
    """(collations found, the server's NO PAD one) on MySQL/MariaDB, None elsewhere."""
    async with store.engine.connect() as conn:
        if conn.dialect.name != "mysql":
            return None
        found = {str(c) for c in (await conn.execute(_COLLATIONS)).scalars()}
        server = "mariadb" if getattr(conn.dialect, "is_mariadb", False) else "mysql"
        return found, NOPAD_COLLATIONS[server]


async def test_mysql_tables_and_text_columns_have_the_no_pad_binary_collation(
    store: SqlStore,
) -> None:
    collations = await _collations(store)
    if collations is None:
        pytest.skip("SQLite and PostgreSQL compare strings byte for byte without options")
    found, nopad = collations
    assert found == {nopad}


async def test_upgrade_to_0005_keeps_the_rows_and_tells_keys_apart_by_trailing_spaces(
    db_url: str, make_new: MakeNew
) -> None:
    store = await SqlStore.connect(db_url)
    try:
        await _downgrade(store, "0004")
        await store.create_instance(make_new("acme"))
        before = await _collations(store)
        assert before is None or before[0] == {"utf8mb4_bin"}

        await upgrade(db_url)

        after = await _collations(store)
        assert after is None or after[0] == {after[1]}
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_diff(metadata)) == [], "the foreign key is back"
        assert (await store.create_instance(make_new("acme "))).created
        assert len(await store.history("inst-acme")) == 1
    finally:
        await store.close()


def _written(migration: str, name: str) -> object:
    """The constant `name` as written out in the migration file `migration`."""
    path = Path(__file__).parents[2] / "taskstream/core/store/migrations/versions"
    module = ast.parse((path / migration).read_text())
    return next(
        ast.literal_eval(node.value)
        for node in module.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name
    )


def test_the_migrations_keep_the_expressions_and_collations_of_tables() -> None:
    assert _written("0004_settled.py", "SETTLED_SQL") == SETTLED_SQL
    assert {
        "mariadb": _written("0005_nopad_collation.py", "MARIADB_COLLATION"),
        "mysql": _written("0005_nopad_collation.py", "MYSQL_COLLATION"),
    } == NOPAD_COLLATIONS


@pytest.mark.parametrize("kind", available_kinds())
async def test_a_database_never_migrated_says_to_run_migrate(kind: str) -> None:
    """Reads and the batched write path alike: `SchemaMissing` (an outage to the services,
    which wait for the migration) whose message names the fix."""
    async with empty_database(kind) as url:
        store = await SqlStore.connect(url)
        try:
            with pytest.raises(SchemaMissing, match="run `taskstream migrate`"):
                await store.get_instance("i-1")
            with pytest.raises(SchemaMissing, match="no taskstream tables"):
                await store.claim_many([ClaimRequest("i-1", 0, 30)], owner="o")
        finally:
            await store.close()
    assert issubclass(SchemaMissing, StoreUnavailable)


async def test_upgrade_to_0004_picks_up_after_a_run_that_stopped_halfway(
    db_url: str, store: SqlStore
) -> None:
    """A run of 0004 added `settled` and stopped (on MySQL each DDL statement commits): the
    next `migrate` skips the column and does the rest."""
    await _downgrade(store, "0003")

    def add_settled(connection: Connection) -> None:
        persisted = connection.dialect.name != "sqlite"
        column = Column("settled", String(16), Computed(SETTLED_SQL, persisted=persisted))
        Operations(MigrationContext.configure(connection)).add_column("task_instances", column)

    async with store.engine.begin() as conn:
        await conn.run_sync(add_settled)
    await upgrade(db_url)
    assert await current_revision(db_url) == HEAD
    async with store.engine.connect() as conn:
        assert await conn.run_sync(_diff(metadata)) == []


async def test_upgrade_to_0005_picks_up_after_a_run_that_stopped_halfway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MariaDB: a long transaction holds `upstreams`, the last table 0005 rebuilds, past the
    migration's lock wait, after it had dropped the history's foreign key. Once the
    transaction ends, `migrate` again brings the store to head, the key back."""
    monkeypatch.setattr(migrate_module, "LOCK_TIMEOUT_S", 2)
    async with empty_database("mariadb") as url:
        store = await SqlStore.connect(url, check=False)
        try:
            await _upgrade_to(store, "0004")
            async with store.engine.connect() as holder:
                await holder.begin()
                await holder.execute(text("SELECT * FROM upstreams"))
                with pytest.raises(StoreError):
                    await upgrade(url)
            assert await current_revision(url) == "0004"
            await upgrade(url)
            assert await current_revision(url) == HEAD
            async with store.engine.connect() as conn:
                assert await conn.run_sync(_diff(metadata)) == [], "the foreign key is back"
        finally:
            await store.close()


async def _upgrade_to(store: SqlStore, revision: str) -> None:
    def run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    async with store.engine.begin() as conn:
        await conn.run_sync(run)
