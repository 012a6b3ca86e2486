"""Redis ACL users of one test: a client that logs in as a user whose rules the test chooses,
so that the server itself answers NOPERM. Each user's name is unique to its test, and the
user is deleted afterwards (`ACL DELUSER`); no other user is touched."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from taskstream.core import streams
from taskstream.core.protocol import Keys

PASSWORD = "acl-test-pass"


def namespace_rules(keys: Keys) -> list[str]:
    """Every key and the control channel of the test's namespace, every command: what a
    role's user is given, before the test takes something away."""
    return [f"~{keys.base}:*", f"&{keys.control}", "+@all"]


@asynccontextmanager
async def acl_user(
    admin: streams.Redis, url: str, rules: list[str]
) -> AsyncIterator[tuple[str, streams.Redis]]:
    """A fresh user with `rules` (ACL SETUSER syntax) and a client logged in as it; the
    user's name is yielded with the client, so the test can change its rules."""
    name = "tsacl-" + uuid.uuid4().hex[:12]
    await acl(admin, "SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)
    client = streams.connect(as_user(url, name))
    try:
        yield name, client
    finally:
        await client.aclose()
        await acl(admin, "DELUSER", name)


async def acl(admin: streams.Redis, *args: str) -> Any:
    """`ACL <args>` as the admin client."""
    return await admin.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


def as_user(url: str, name: str) -> str:
    """`url` with `name` and the test password as its credentials."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{name}:{PASSWORD}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
