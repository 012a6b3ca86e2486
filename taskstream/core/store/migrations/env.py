"""Alembic environment for the taskstream store.

Runs only online, on a connection handed in by `taskstream.core.store.migrate` through
`config.attributes["connection"]`; there is no alembic.ini and no URL in here, so the same code
works from a source tree and from an installed wheel.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from taskstream.core.errors import ConfigError
from taskstream.core.store.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    if context.is_offline_mode():
        raise ConfigError(["offline (--sql) migrations are not supported; use taskstream migrate"])
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise ConfigError(["migrations run through taskstream.core.store.migrate, not alembic"])
    _run(connection)


_main()
