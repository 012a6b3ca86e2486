"""Server databases made one test ahead: while a test runs, a thread of this process makes
the next fresh copy of the migrated template (`tests.support.db_templates`) of each server
kind it has used, so the next test of that kind does not wait for the server's disk.

Creating a copy waits 0.05 s (MariaDB) to 0.3 s (PostgreSQL) or more on a loaded machine,
for nearly every contract and integration test. Each database still serves one test only.
A MariaDB database is dropped by its test, so a drop that a leaked connection blocks fails
that test. A PostgreSQL one is handed back and dropped on the thread (its DROP ... WITH
(FORCE) ends every session, so no leak can block it, and it waits for the copy being made
next): a drop that fails is raised by the next `take` or by `close`. The copies made for
tests that never came are dropped by `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

from tests.support import db_templates
from tests.support.db_servers import admin_url, create_ddl, drop_ddl, server_ddl


class Ahead:
    """The next database of each server kind, made (or being made) on a thread of its own."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._next: dict[str, Future[str]] = {}
        self._drops: list[Future[None]] = []

    def take(self, kind: str) -> Future[str]:
        """The name of a fresh copy of `kind` ("mariadb" | "postgres"), no one else's; starts
        making the one the next test of `kind` takes."""
        self._raise_failed_drops()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ts-db-ahead")
        taken = self._next.pop(kind, None) or self._thread.submit(_make, kind)
        self._next[kind] = self._thread.submit(_make, kind)
        return taken

    def give_back(self, kind: str, name: str) -> None:
        """Drop the database `name` of `kind`, which its test no longer uses, on the thread."""
        assert self._thread is not None, "give back only what `take` handed out"
        self._drops.append(self._thread.submit(_drop, kind, name))

    def _raise_failed_drops(self) -> None:
        done = [d for d in self._drops if d.done()]
        self._drops = [d for d in self._drops if not d.done()]
        for drop in done:
            drop.result()

    def discard(self, kind: str, made: Future[str]) -> None:
        """Drop the database `made` holds once it is made: its test stopped waiting for it."""

        def drop(done: Future[str]) -> None:
            if not done.cancelled() and done.exception() is None:
                _drop(kind, done.result())  # on the thread that made it

        made.add_done_callback(drop)

    def close(self) -> None:
        """Drop the databases made for tests that never came; wait for the thread to end.
        A later `take` starts again."""
        spares, self._next = self._next, {}
        for kind, made in spares.items():
            if not made.cancel():
                with contextlib.suppress(Exception):
                    _drop(kind, made.result())
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        self._raise_failed_drops()


def _make(kind: str) -> str:
    return asyncio.run(_copy(kind))


def _drop(kind: str, name: str) -> None:
    asyncio.run(server_ddl(admin_url(kind), *drop_ddl(kind, name)))


async def _copy(kind: str) -> str:
    """Make a fresh copy of `kind`'s template; returns its name."""
    made = await db_templates.template(kind)
    name = f"ts_t_{uuid.uuid4().hex}"
    if kind == "postgres":
        await server_ddl(admin_url(kind), *create_ddl(kind, name, template=made.source))
        return name
    try:
        await server_ddl(
            admin_url(kind), *create_ddl(kind, name), f"USE `{name}`", *made.statements
        )
    except BaseException:
        await server_ddl(admin_url(kind), *drop_ddl(kind, name))
        raise
    return name
