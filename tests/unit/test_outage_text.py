"""What a role logs of an outage it waits out (`*.dependency_down`): which service failed is
named, and a refused Redis login says what to check."""

from __future__ import annotations

from redis.exceptions import AuthenticationError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError

from taskstream.core.errors import StoreUnavailable
from taskstream.core.streams import outage_text


def test_a_store_error_keeps_its_own_text_which_names_the_store() -> None:
    text = "store mysql://u:***@db/ts unavailable: OperationalError: (2003, ...)"
    assert outage_text(StoreUnavailable(text)) == text


def test_a_redis_error_is_named_as_redis_by_its_class() -> None:
    assert outage_text(RedisConnectionError("Error 111 connecting to 127.0.0.1:6379.")) == (
        "redis unavailable: ConnectionError: Error 111 connecting to 127.0.0.1:6379."
    )
    assert outage_text(ReadOnlyError("You can't write against a read only replica.")).startswith(
        "redis unavailable: ReadOnlyError: "
    )


def test_a_refused_redis_login_says_what_to_check() -> None:
    told = outage_text(AuthenticationError("invalid username-password pair"))
    assert told == (
        "redis unavailable: AuthenticationError: invalid username-password pair"
        " (check the user and password in TASKSTREAM_REDIS_URL)"
    )


def test_a_bare_socket_error_is_named_by_its_class_not_taken_for_redis() -> None:
    assert outage_text(ConnectionRefusedError(111, "Connection refused")) == (
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )


def test_the_text_is_cut_to_the_limit() -> None:
    assert len(outage_text(RedisConnectionError("x" * 1000))) == 300
    assert len(outage_text(StoreUnavailable("y" * 1000), limit=50)) == 50
