"""A database user lacking a privilege (a GRANT an operator forgot) is refused every write on
MariaDB and PostgreSQL alike as an outage that names the refusal and its remedy, which the
roles wait out until the privilege is granted, instead of a "store unavailable" on one
dialect and a failure that ends the role on the other."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from taskstream.core.errors import StoreDenied, StoreUnavailable
from taskstream.core.store.port import ClaimRequest
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import MakeNew
from tests.support.databases import available_kinds, temp_database
from tests.support.limited_user import read_only_user

_REMEDY = r"denied this user a statement \(.*task_instances.*\): grant the user the privilege"


@pytest.fixture(params=[kind for kind in available_kinds() if kind != "sqlite"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[SqlStore, SqlStore]]:
    """(an administrator's store, the same database as a user that may only read it)."""
    async with temp_database(request.param) as url:
        admin = await SqlStore.connect(url)
        try:
            async with read_only_user(admin.engine, url) as read_only_url:
                reader = await SqlStore.connect(read_only_url)
                try:
                    yield admin, reader
                finally:
                    await reader.close()
        finally:
            await admin.close()


async def test_a_write_the_user_may_not_make_is_a_denial_naming_the_remedy(
    stores: tuple[SqlStore, SqlStore], make_new: MakeNew
) -> None:
    admin, reader = stores
    await admin.create_instance(make_new("a"))
    assert [r.id for r in await reader.list_instances()] == ["inst-a"], "reads are allowed"
    with pytest.raises(StoreUnavailable, match=_REMEDY) as created:
        await reader.create_instance(make_new("b"))
    with pytest.raises(StoreUnavailable, match=_REMEDY) as claimed:  # the driver's hot path
        await reader.claim_many([ClaimRequest("inst-a", 0, 30)], owner="exec-1")
    assert isinstance(created.value, StoreDenied) and isinstance(claimed.value, StoreDenied)
    assert ":read-only-pw@" not in str(created.value) + str(claimed.value)


@pytest.mark.parametrize("kind", [kind for kind in available_kinds() if kind != "sqlite"])
async def test_a_login_the_server_refuses_names_the_url_to_mend(kind: str) -> None:
    """A wrong password or an unknown user (MariaDB 1045, PostgreSQL's unknown role) is a
    denial that says to check the URL's user and password, not a bare "unavailable"."""
    async with temp_database(kind) as url:
        stranger = f"ts_none_{uuid.uuid4().hex[:8]}"
        wrong = make_url(url).set(username=stranger, password="wrong-pw")
        with pytest.raises(StoreDenied) as refused:
            store = await SqlStore.connect(wrong.render_as_string(hide_password=False))
            try:
                await store.list_instances()
            finally:
                await store.close()
    message = str(refused.value)
    assert "refused this user's login" in message and stranger in message, message
    assert message.endswith("check the user and password in TASKSTREAM_DATABASE_URL"), message
    assert "wrong-pw" not in message
