"""How an upstream call's result is judged (pure): breaker outcome, typed error, Retry-After,
safe URLs; the http agent's params and result body; the retry plan honouring Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime
from random import Random

import httpx
import pytest
from pydantic import ValidationError

from taskstream.agents.errors import (
    FatalError,
    RetriableError,
    UpstreamDeferred,
    UpstreamRejected,
    UpstreamUnavailable,
)
from taskstream.agents.http_agent import HttpParams, response_body
from taskstream.agents.upstream_response import UpstreamResponse
from taskstream.agents.upstream_rules import (
    MAX_RETRY_AFTER_MS,
    describe,
    error_for_status,
    failure_of,
    outcome_of,
    retry_after_ms,
    safe_url,
)
from taskstream.core.spec_parts import Backoff, RetryPolicy
from taskstream.core.states import Status
from taskstream.executor.outcome import Attempt, failed, plan
from taskstream.ratelimit.breaker import Outcome

NOW_MS = 1_780_000_000_000


@pytest.mark.parametrize(
    ("status", "outcome", "error"),
    [
        (200, Outcome.SUCCESS, None),
        (204, Outcome.SUCCESS, None),
        (301, Outcome.SUCCESS, None),
        (304, Outcome.SUCCESS, None),
        (400, Outcome.IGNORE, UpstreamRejected),
        (401, Outcome.IGNORE, UpstreamRejected),
        (403, Outcome.IGNORE, UpstreamRejected),
        (404, Outcome.IGNORE, UpstreamRejected),
        (409, Outcome.IGNORE, UpstreamRejected),
        (429, Outcome.FAILURE, UpstreamUnavailable),
        (500, Outcome.FAILURE, UpstreamUnavailable),
        (502, Outcome.FAILURE, UpstreamUnavailable),
        (503, Outcome.FAILURE, UpstreamUnavailable),
        (599, Outcome.FAILURE, UpstreamUnavailable),
        (600, Outcome.IGNORE, UpstreamRejected),
    ],
)
def test_status_maps_to_breaker_outcome_and_error(
    status: int, outcome: Outcome, error: type[Exception] | None
) -> None:
    assert outcome_of(status) is outcome
    found = error_for_status(status, upstream="api", call="GET http://h/x")
    if error is None:
        assert found is None
        return
    assert type(found) is error
    assert isinstance(found, RetriableError if error is UpstreamUnavailable else FatalError)
    assert getattr(found, "status", None) == status
    assert getattr(found, "upstream", None) == "api"
    assert f"HTTP {status}" in str(found)


def test_no_response_and_timeouts_are_failures() -> None:
    assert outcome_of(None) is Outcome.FAILURE
    assert outcome_of(200, timed_out=True) is Outcome.FAILURE


def test_retry_after_is_carried_by_retriable_errors_only() -> None:
    busy = error_for_status(429, upstream="api", call="c", retry_after_ms=7_000)
    assert isinstance(busy, UpstreamUnavailable) and busy.retry_after_ms == 7_000
    missing = error_for_status(404, upstream="api", call="c", retry_after_ms=7_000)
    assert isinstance(missing, UpstreamRejected) and not hasattr(missing, "retry_after_ms")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("120", 120_000),
        (" 0 ", 0),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("²", None),
        ("999999999", MAX_RETRY_AFTER_MS),
        ("9" * 5000, MAX_RETRY_AFTER_MS),  # beyond int()'s digit limit: capped, not an error
        ("0" * 20 + "7", 7_000),
        ("0 JAN 2147483648 0:0", None),  # a date past datetime's years: unreadable, not an error
        ("Sun, 06 Nov 99999 08:49:37 GMT", None),
    ],
)
def test_retry_after_delay_seconds(value: str | None, expected: int | None) -> None:
    assert retry_after_ms(value, NOW_MS) == expected


def test_retry_after_http_date_is_relative_to_now() -> None:
    def date(ms: int) -> str:
        return format_datetime(datetime.fromtimestamp(ms / 1000, UTC), usegmt=True)

    assert retry_after_ms(date(NOW_MS + 30_000), NOW_MS) == 30_000
    assert retry_after_ms(date(NOW_MS - 30_000), NOW_MS) == 0
    assert retry_after_ms(date(NOW_MS + 10 * MAX_RETRY_AFTER_MS), NOW_MS) == MAX_RETRY_AFTER_MS


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.example/v1/chat", "https://api.example/v1/chat"),
        ("http://user:pw@h:8080/p?token=s3cret#frag", "http://h:8080/p"),
        ("http://[::1]:9000/x?k=v", "http://[::1]:9000/x"),
        ("http://h", "http://h/"),
        ("http://a@b:pw@h/p", "http://h/p"),
        ("/v1/items?token=s3cret", "/v1/items"),
    ],
)
def test_safe_url_drops_credentials_and_query(url: str, expected: str) -> None:
    assert safe_url(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://svc:s3cr3t/Xk9@api.internal/v1/items", "https://<unparseable URL>"),
        ("http://[::1/x", "http://<unparseable URL>"),
        ("http://svc:s3cr3t@api.internal/\nXk9", "http://<unparseable URL>"),
        ("http://svc:123/Xk9@api.internal/v1", "http://<ambiguous URL>"),
        ("http://svc:123?Xk9@api.internal/v1", "http://<ambiguous URL>"),
        ("http://svc:123#Xk9@api.internal/v1", "http://<ambiguous URL>"),
        ("svc:s3cr3t@api.internal/v1", "<ambiguous URL>"),
    ],
)
def test_safe_url_shows_no_user_info_where_parsers_may_disagree(url: str, expected: str) -> None:
    """The user info ends at the last `@` for some parsers and at the first `/`, `?` or `#`
    for httpx: when the two may differ, nothing after the scheme is shown."""
    assert safe_url(url) == expected


def test_describe_names_method_url_and_upstream() -> None:
    assert describe("post", "http://h/p?key=1", "llm") == "POST http://h/p (upstream 'llm')"
    assert describe("GET", "http://h/p", None) == "GET http://h/p"


def test_upstream_deferred_waits_at_least_one_ms() -> None:
    assert UpstreamDeferred("api", 0).retry_after_ms == 1
    assert UpstreamDeferred("api", 2_500).retry_after_ms == 2_500


# --- the http agent's params and body ------------------------------------------------------


def test_http_params_defaults_and_json_alias() -> None:
    params = HttpParams.model_validate({"url": "http://h/x", "json": {"a": [1, 2]}})
    assert (params.method, params.timeout, params.headers) == ("GET", 30.0, {})
    assert params.json_body == {"a": [1, 2]}


@pytest.mark.parametrize(
    "payload",
    [
        {"url": "ftp://h/x"},
        {"url": "/relative"},
        {"url": "http://h/x", "method": "BREW"},
        {"url": "http://h/x", "timeout": 0},
        {"url": "http://h/x", "timeout": 601},
        {"url": "http://h/x", "body": "x"},
        {"url": "http://h/x", "headers": {"Authorization": 12345}},
    ],
)
def test_http_params_reject_bad_payloads(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HttpParams.model_validate(payload)


def test_http_params_errors_hide_inputs() -> None:
    secret = "Bearer sk-do-not-leak"
    with pytest.raises(ValidationError) as caught:
        HttpParams.model_validate({"url": "nope", "headers": {"Authorization": secret}, "x": 1})
    assert "sk-do-not-leak" not in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        HttpParams.model_validate({"url": "http://h", "headers": {"Authorization": [secret]}})
    assert "sk-do-not-leak" not in str(caught.value)


def _response(
    body: bytes, content_type: str, truncated: bool = False, encoding: str = "utf-8"
) -> UpstreamResponse:
    headers = httpx.Headers({"content-type": content_type})
    return UpstreamResponse(200, headers, body, encoding, truncated)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (_response(b'{"ok": true}', "application/json"), {"ok": True}),
        (_response(b"[1]", "application/problem+json; charset=utf-8"), [1]),
        (_response(b'{"ok": tr', "application/json", truncated=True), '{"ok": tr'),
        (_response(b"{bad", "application/json"), "{bad"),
        (_response(b'{"x": NaN}', "application/json"), '{"x": NaN}'),
        (_response(b'{"ok": true}', "text/plain"), '{"ok": true}'),
        (_response("grüße".encode(), "text/plain"), "grüße"),
        (_response("grüße".encode("latin-1"), "text/plain", encoding="latin-1"), "grüße"),
        (_response(b"hi", "text/plain", encoding="x-no-such-codec"), "hi"),
        # Codecs that raise whatever the error handler (the answered call failed, and was
        # sent again at the next attempt).
        (_response("grüße".encode(), "text/plain", encoding="undefined"), "grüße"),
        (_response("grüße".encode(), "text/plain", encoding="idna"), "grüße"),
        (_response("grüße".encode(), "text/plain", encoding="punycode"), "grüße"),
    ],
)
def test_response_body_is_json_only_when_complete_json(
    response: UpstreamResponse, expected: object
) -> None:
    assert response_body(response) == expected


# --- the retry plan honours Retry-After ----------------------------------------------------


def _attempt(base_s: float) -> Attempt:
    policy = RetryPolicy(max_attempts=5, backoff=Backoff(base=base_s), jitter=0.0)
    return Attempt("i1", token=1, attempts_used=1, policy=policy)


def test_a_retry_waits_for_retry_after_when_the_backoff_is_shorter() -> None:
    end = failed(UpstreamUnavailable("busy", upstream="api", status=429, retry_after_ms=90_000))
    assert end.retry_after_ms == 90_000
    decided = plan(_attempt(1.0), end, now_ms=NOW_MS, rng=Random(1))
    assert decided.finish.dst is Status.RETRYING
    assert decided.finish.next_attempt_at_ms == NOW_MS + 90_000


def test_a_longer_backoff_wins_over_retry_after() -> None:
    end = failed(RetriableError("busy", retry_after_ms=2_000))
    decided = plan(_attempt(60.0), end, now_ms=NOW_MS, rng=Random(1))
    assert decided.finish.next_attempt_at_ms == NOW_MS + 60_000


def test_retry_after_cannot_stretch_past_the_deadline() -> None:
    end = failed(RetriableError("busy", retry_after_ms=600_000))
    attempt = Attempt(
        "i1", 1, 1, RetryPolicy(max_attempts=5, jitter=0.0), deadline_ms=NOW_MS + 60_000
    )
    decided = plan(attempt, end, now_ms=NOW_MS, rng=Random(1))
    assert decided.finish.dst is Status.FAILED


@pytest.mark.parametrize(
    ("exc", "kind", "sent"),
    [
        (httpx.ConnectError("refused"), UpstreamUnavailable, False),
        (httpx.ConnectTimeout("slow handshake"), UpstreamUnavailable, False),
        (httpx.PoolTimeout("no free connection"), UpstreamUnavailable, False),
        (httpx.UnsupportedProtocol("gopher"), UpstreamRejected, False),
        (httpx.InvalidURL("bad"), UpstreamRejected, False),
        (httpx.ReadError("reset mid-answer"), UpstreamUnavailable, True),
        (httpx.ReadTimeout("no answer"), UpstreamUnavailable, True),
        (TimeoutError(), UpstreamUnavailable, True),
        (httpx.RemoteProtocolError("garbled"), UpstreamUnavailable, True),
        (ValueError("a body the client refused"), UpstreamRejected, True),
    ],
)
def test_a_failed_call_is_typed_and_told_apart_when_it_never_connected(
    exc: Exception, kind: type[Exception], sent: bool
) -> None:
    """Only a call that made no connection is known not to have reached the upstream (its
    window slot is given back); a timeout of the whole call may have sent it."""
    error, maybe_sent = failure_of(exc, "GET http://api.test/x (upstream 'api')", "api", 2.0)
    assert (type(error), maybe_sent) == (kind, sent)
    assert error.upstream == "api"
