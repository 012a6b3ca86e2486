"""The end of a test's own Redis keys."""

from __future__ import annotations

from taskstream.core import streams
from taskstream.core.protocol import Keys


async def drop_keys(client: streams.Redis, keys: Keys) -> None:
    """Delete every key of the test's namespace, and nothing else (never FLUSHDB)."""
    found = [k async for k in client.scan_iter(match=f"{keys.base}:*", count=500)]
    if found:
        await client.delete(*found)
