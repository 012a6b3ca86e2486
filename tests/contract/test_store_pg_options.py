"""asyncpg's numeric options in a PostgreSQL URL (`?statement_cache_size=0`, the setting
behind PgBouncer in transaction mode, `?command_timeout=30`) reach the driver as numbers: the
URL gives them as text, which asyncpg refuses with a `TypeError` at every connection."""

from __future__ import annotations

import pytest

from taskstream.core.store.sql import SqlStore
from tests.support.databases import available_kinds, temp_database

pytestmark = pytest.mark.skipif(
    "postgres" not in available_kinds(), reason="no PostgreSQL server reachable"
)

OPTIONS = (
    "statement_cache_size=0&max_cached_statement_lifetime=60"
    "&max_cacheable_statement_size=2048&command_timeout=30.5"
)


async def test_numeric_asyncpg_options_of_the_url_are_taken() -> None:
    async with temp_database("postgres") as url:
        joined = "&" if "?" in url else "?"
        store = await SqlStore.connect(url + joined + OPTIONS)
        try:
            assert await store.db_now_ms() > 0
            assert await store.count_by_status() is not None
        finally:
            await store.close()
