"""A response as `UpstreamClient` read it: status, headers and a size-capped body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    """A response as read: `content` holds at most the client's `max_body_bytes` (decoded
    from any content encoding); `truncated` says whether more was dropped."""

    status: int
    headers: httpx.Headers
    content: bytes
    encoding: str
    truncated: bool = False

    @property
    def text(self) -> str:
        """The body as text in its declared charset (UTF-8 when none or unknown); bad bytes
        replaced. Always UTF-8 encodable, so it can be stored as a result."""
        try:
            text = self.content.decode(self.encoding, errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")
        if text.isascii():
            return text
        # Some charsets (utf-7, unicode_escape) decode to lone surrogates UTF-8 cannot hold.
        return text.encode("utf-8", errors="replace").decode("utf-8")

    @property
    def is_json(self) -> bool:
        """The content type is `application/json` or `...+json`."""
        media = str(self.headers.get("content-type", "")).split(";")[0].strip().lower()
        return media == "application/json" or media.endswith("+json")

    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not)."""
        return json.loads(self.content)


async def read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """At most `max_bytes` of the decoded body, and whether more was there."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        room = max_bytes - size
        if len(chunk) > room:
            chunks.append(chunk[:room])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False
