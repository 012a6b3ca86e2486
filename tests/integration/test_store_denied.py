"""An executor whose database user may not write (a GRANT missing or revoked) on MariaDB or
PostgreSQL keeps running and says, at every try, what the store denied and how to mend it;
once the privilege is granted it claims and runs the instance it was holding."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration import outages
from tests.integration.executor_cases import reach
from tests.integration.harness import Harness, Running, until
from tests.support.databases import available_kinds, temp_database
from tests.support.limited_user import read_only_user


@pytest.fixture(params=[kind for kind in available_kinds() if kind != "sqlite"])
async def denied(
    request: pytest.FixtureRequest, redis: streams.Redis, keys: Keys
) -> AsyncIterator[tuple[Harness, SqlStore, str]]:
    """(a harness on the administrator's store, a store on the same database as a user that
    may only read it, that user's name)."""
    async with temp_database(request.param) as url:
        admin = await SqlStore.connect(url)
        try:
            h = await outages.harness(admin, redis, keys)
            async with read_only_user(admin.engine, url) as read_only_url:
                reader = await SqlStore.connect(read_only_url)
                try:
                    yield h, reader, str(make_url(read_only_url).username)
                finally:
                    await reader.close()
        finally:
            await admin.close()


async def _grant(h: Harness, user: str) -> None:
    mysql = h.store.engine.dialect.name == "mysql"
    async with h.store.engine.begin() as conn:
        if mysql:
            await conn.execute(text(f"GRANT INSERT, UPDATE ON {_db(h)}.* TO '{user}'@'%'"))
        else:
            await conn.execute(
                text(f"GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {user}")
            )
            await conn.execute(text(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {user}"))


def _db(h: Harness) -> str:
    return f"`{h.store.engine.url.database}`"


async def test_a_denied_executor_names_the_denial_and_runs_once_granted(
    denied: tuple[Harness, SqlStore, str],
) -> None:
    h, reader, user = denied
    instance = await h.trigger(outages.TASKS, "quick")
    admin = h.store
    h.store = reader  # the executor's store; the test reads through the administrator's
    with capture_logs() as logs:
        ex = Running(h.executor())
        try:

            async def told() -> bool:
                return any(e["event"] == "executor.dependency_down" for e in logs)

            await until(told)
            assert not ex.task.done(), "a denial is waited out, not an exit"
            h.store = admin
            await _grant(h, user)
            await reach(h, instance.id, Status.SUCCESS)
        finally:
            await ex.close()
    [first, *_] = [e for e in logs if e["event"] == "executor.dependency_down"]
    assert "denied this user a statement" in first["error"]
    assert "task_instances" in first["error"] and "grant the user the privilege" in first["error"]
