"""The built-in `http` agent: one HTTP call through the run's upstream-aware client.

The call is made as the task's first declared upstream (its limiter and breaker); a task that
names none calls without admission. Failures are the client's typed errors: 429, 5xx,
timeouts and connection errors retry, other 4xx fail the run, and a refused admission defers
it. The result is `{"status": int, "body": JSON or text, "truncated": bool}`.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.upstream_response import UpstreamResponse
from taskstream.core.payloads import finite_json_number, no_json_constant
from taskstream.core.store.records import stored_json

MAX_BODY_BYTES: Final = 64 * 1024
"""Response body bytes kept in the result; a longer body is cut and returned as text."""

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class HttpParams(BaseModel):
    """`method`, `url` (http or https), `headers`, `json` (request body) and `timeout`
    (seconds for the whole call, > 0 and <= 600). Inputs never appear in validation errors:
    headers may hold credentials."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    method: Method = "GET"
    url: str = Field(min_length=1, max_length=8192)
    headers: dict[str, str] = Field(default_factory=dict)
    json_body: JsonValue = Field(default=None, alias="json")
    timeout: float = Field(default=30.0, gt=0.0, le=600.0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL:
            raise ValueError("not a valid URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an absolute http:// or https:// URL")
        return value


async def _http(ctx: AgentContext, params: HttpParams) -> dict[str, Any]:
    upstream = ctx.upstreams[0] if ctx.upstreams else None
    response = await ctx.http.request(
        params.method,
        params.url,
        upstream=upstream,
        headers=params.headers,
        json=params.json_body,
        timeout_s=params.timeout,
        max_body_bytes=MAX_BODY_BYTES,
    )
    return {
        "status": response.status,
        "body": response_body(response),
        "truncated": response.truncated,
    }


def response_body(response: UpstreamResponse) -> Any:
    """The body as parsed JSON when it is complete JSON (by content type) that a store can
    keep, else as text. The call has been answered, so the body never fails the run: JSON the
    store cannot keep (a number out of range, a lone surrogate, nesting deeper than the parser
    goes) is returned as text like any body that is not JSON."""
    if response.is_json and not response.truncated:
        try:
            value = json.loads(
                response.content,
                parse_constant=no_json_constant,
                parse_float=finite_json_number,
            )
            stored_json(value).encode("utf-8")
        except (TypeError, ValueError, RecursionError):  # UnicodeError is a ValueError
            pass
        else:
            return value
    return response.text


HTTP_AGENT: Final = FunctionAgent(name="http", params_model=HttpParams, fn=_http)
