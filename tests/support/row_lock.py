"""A client that locks one instance row and then goes quiet inside its transaction, as a role
cut off between two statements would: `python -m tests.support.row_lock DATABASE_URL ID`.

It opens its session with the store's own engine (`make_engine`, so with taskstream's session
setup), locks the row with `SELECT ... FOR UPDATE`, prints `locked`, and waits until killed,
its transaction open.
"""

from __future__ import annotations

import asyncio
import sys

from sqlalchemy import text

from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.urls import normalize_url

LOCK = text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE")


async def hold(url: str, instance_id: str) -> None:
    engine = make_engine(normalize_url(url))
    async with engine.connect() as conn, conn.begin():
        await conn.execute(LOCK, {"id": instance_id})
        print("locked", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(hold(sys.argv[1], sys.argv[2]))
