"""Every migration can run again over its own finished DDL. On MySQL/MariaDB each DDL
statement commits at once and Alembic writes the new revision afterwards: a connection lost
or a process stopped between the two leaves the schema changed at the old revision, and the
next `taskstream migrate` runs the migration again. It must finish, not fail for ever on
"Duplicate column name"."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from taskstream.core.store.migrate import alembic_config, current_revision, upgrade
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import metadata
from tests.contract.test_store_schema import HEAD, _diff, _upgrade_to
from tests.support.databases import available_kinds, empty_database

SCRIPTS = ScriptDirectory.from_config(alembic_config())
REVISIONS = [
    (s.revision, s.down_revision)
    for s in SCRIPTS.walk_revisions()
    if isinstance(s.down_revision, str)
]
KINDS = [k for k in available_kinds() if k in ("mariadb", "mysql")]


def _ddl_of(revision: str) -> Callable[[Connection], None]:
    """Run `revision`'s upgrade as a migration stopped before its version write would."""

    def run(connection: Connection) -> None:
        with Operations.context(MigrationContext.configure(connection)):
            SCRIPTS.get_revision(revision).module.upgrade()

    return run


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("revision", "before"), REVISIONS)
async def test_a_migration_whose_version_write_was_lost_runs_again(
    kind: str, revision: str, before: str
) -> None:
    async with empty_database(kind) as url:
        store = await SqlStore.connect(url, check=False)
        try:
            await _upgrade_to(store, before)
            async with store.engine.begin() as conn:
                await conn.run_sync(_ddl_of(revision))
            assert await current_revision(url) == before
            await upgrade(url)
            assert await current_revision(url) == HEAD
            async with store.engine.connect() as conn:
                assert await conn.run_sync(_diff(metadata)) == []
        finally:
            await store.close()
