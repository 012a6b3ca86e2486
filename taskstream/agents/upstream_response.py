"""A response as `UpstreamClient` read it: status, headers and a size-capped body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from taskstream.agents.content_coding import BodyDecoder


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    """A response as read: `content` holds at most the client's `max_body_bytes`, decoded
    from gzip and deflate (a body in another content coding is kept as sent); `truncated`
    says whether more was dropped."""

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
        except (LookupError, UnicodeError):  # unknown, or a codec that fails anyway (idna)
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
    """At most `max_bytes` of the body, decoded from its content codings (`BodyDecoder`), and
    whether more was there. Memory stays within about `max_bytes` plus a fixed amount per
    coding layer, however far the body expands; decoding stops once the cap is passed."""
    decoder = BodyDecoder(response.headers.get_list("content-encoding", split_commas=True))
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += decoder.decode(chunk, max_bytes + 1 - len(body))
        if len(body) > max_bytes:
            del body[max_bytes:]
            return bytes(body), True
    return bytes(body), False
