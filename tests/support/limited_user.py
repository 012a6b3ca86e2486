"""A database user that may read taskstream's tables but not write them, on MariaDB and
PostgreSQL: a GRANT an operator forgot. Made for one test and dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

_PASSWORD = "read-only-pw"


@asynccontextmanager
async def read_only_user(engine: AsyncEngine, url: str) -> AsyncIterator[str]:
    """The URL of `url`'s database as a new user granted SELECT on it alone; `engine` (an
    administrator's, on that database) makes and drops the user."""
    user = f"ts_ro_{uuid.uuid4().hex[:8]}"
    parsed = make_url(url)
    mysql = engine.dialect.name == "mysql"
    made = (
        [
            f"CREATE USER '{user}'@'%' IDENTIFIED BY '{_PASSWORD}'",
            f"GRANT SELECT ON `{parsed.database}`.* TO '{user}'@'%'",
        ]
        if mysql
        else [
            f"CREATE ROLE {user} LOGIN PASSWORD '{_PASSWORD}'",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {user}",
        ]
    )
    dropped = (
        [f"DROP USER '{user}'@'%'"]
        if mysql
        else [f"DROP OWNED BY {user}", f"DROP ROLE {user}"]  # its grants, then the role
    )
    async with engine.begin() as conn:
        for statement in made:
            await conn.execute(text(statement))
    try:
        yield parsed.set(username=user, password=_PASSWORD).render_as_string(hide_password=False)
    finally:
        async with engine.begin() as conn:
            for statement in dropped:
                await conn.execute(text(statement))
