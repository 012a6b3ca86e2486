"""The cluster URLs and limits in `Settings`: each URL is read as its own client reads it
(SQLAlchemy for the database, redis-py's `urlsplit` for Redis), and a refusal names the
variable and what is wrong without any part of the URL's user info."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from taskstream.cli.main import settings_problems
from taskstream.core.settings import Settings


def _problems(**values: str) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate(values)
    return settings_problems(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root:s3cr3t/Xk9@db.internal/taskstream",
        "mysql://root:s3cr3t?Xk9@db.internal:3306/taskstream",
        "postgresql://app:s3cr3t@[::1]:5432/taskstream",
        "sqlite:///var/lib/taskstream/store.db",
        "mysql://root:s3cr3t%40Xk9@db.internal/taskstream?charset=utf8mb4&connect_timeout=5",
        "mysql://root:s3cr3t@db.internal/taskstream?ssl_ca=/etc/ca.pem&unix_socket=/run/my.sock",
        "mysql+aiomysql://root:s3cr3t@db.internal/taskstream?auth_plugin=mysql_native_password",
        "postgresql://app:s3cr3t@db.internal/taskstream?ssl=require&command_timeout=5",
        "postgres://app:s3cr3t@db.internal/taskstream?prepared_statement_cache_size=0",
        "postgres://app:s3cr3t@db.internal/taskstream?statement_cache_size=0&command_timeout=2.5",
    ],
)
def test_a_database_url_sqlalchemy_reads_is_accepted(url: str) -> None:
    assert Settings.model_validate({"database_url": url}).database_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://root:s3cr3t/Xk9@db.internal:s3cr3t/taskstream", "bad port"),
        ("mysql://root:s3cr3t/taskstream", "bad port"),
        ("mysql://root:s3cr3t@db.internal:0/taskstream", "bad port"),
        ("mysql://root:s3cr3t@db.internal:70000/taskstream", "bad port"),
        ("my-sql://root:s3cr3t@db.internal/taskstream", "not a database URL"),
        ("root:s3cr3t@db.internal/taskstream", "not a URL"),
        ("mysql://root:s3cr3t@Xk9@db.internal:3306/taskstream", "percent-encode an '@'"),
        ("mysql://root:s3cr3t@db.internal:3306/", "no database name"),
        ("postgresql://root:s3cr3t@db.internal", "no database name"),
        ("mysql://root:s3cr3t@db.internal/t?bogusopt=1&charset=utf8mb4", "option(s) bogusopt"),
        ("mysql://root:s3cr3t@db.internal/t?connect_timeout=soon", "options (connect_timeout)"),
        (
            "postgresql://root:s3cr3t@db.internal/t?sslmode=require",
            "option(s) sslmode (asyncpg takes ssl=",
        ),
        ("postgres://root:s3cr3t@db.internal/t?bogus_opt=1&ssl=require", "option(s) bogus_opt"),
        ("postgres://root:s3cr3t@db.internal/t?command_timeout=soon", "command_timeout: not a"),
        ("postgres://root:s3cr3t@db.internal/t?statement_cache_size=-1", "size: out of range"),
    ],
)
def test_a_bad_database_url_is_refused_without_its_user_info(url: str, says: str) -> None:
    [line] = _problems(database_url=url)
    assert line.startswith("TASKSTREAM_DATABASE_URL: ") and says in line, line
    assert "s3cr3t" not in line and "root" not in line, line


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite+aiosqlite://",
        "sqlite:///file:store?mode=memory&cache=shared&uri=true",
    ],
)
def test_an_in_memory_sqlite_store_is_refused(url: str) -> None:
    """Every role is a process of its own, with its own in-memory database: `up` migrated
    one that no role saw, and every role waited for its tables for ever."""
    [line] = _problems(database_url=url)
    assert line.startswith("TASKSTREAM_DATABASE_URL: "), line
    assert "an in-memory SQLite store" in line, line


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cr3t%2FXk9@cache.internal:6379/0",
        "rediss://svc:s3cr3t@cache.internal/1",
        "redis://:s3cr3t@Xk9@cache.internal:6379",  # read up to the last '@', as the client does
    ],
)
def test_a_redis_url_the_client_reads_is_accepted(url: str) -> None:
    assert Settings.model_validate({"redis_url": url}).redis_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://svc:s3cr3t/Xk9@cache.internal:6379/0", "percent-encode"),
        ("redis://svc:s3cr3t@cache.internal:99999/0", "bad port"),
        ("redis://svc:s3cr3t@[::1/0", "not a URL"),
        ("http://svc:s3cr3t@cache.internal:6379", "scheme 'http'"),
        ("svc:s3cr3t@cache.internal:6379", "not a URL"),
        ("redis://svc:s3cr3t@cache.internal/0?socket_timeout=abc", "options (socket_timeout)"),
        ("redis://svc:s3cr3t@cache.internal/0?bogus=1&db=0", "options (bogus, db)"),
        ("rediss://svc:s3cr3t@cache.internal/0?ssl_cert_reqs=maybe", "options (ssl_cert_reqs)"),
        ("redis://:s3cr3t@Xk9/svc@cache.internal:1/0", "percent-encode a '/'"),
        ("redis://svc:s3cr3t@cache.internal:6379/abc", "not a database number"),
    ],
)
def test_a_bad_redis_url_is_refused_without_its_user_info(url: str, says: str) -> None:
    [line] = _problems(redis_url=url)
    assert line.startswith("TASKSTREAM_REDIS_URL: ") and says in line, line
    assert "s3cr3t" not in line and "svc" not in line, line


def test_a_blocking_read_longer_than_the_redis_clients_socket_timeout_is_refused() -> None:
    """A 10 s read timed out on the client's 5 s socket timeout at every idle read: the
    executor reported Redis down every 6 s."""
    assert Settings.model_validate({"read_block_ms": "4000"}).read_block_ms == 4000
    [line] = _problems(read_block_ms="5000")
    assert line.startswith("TASKSTREAM_READ_BLOCK_MS: ") and "4000" in line, line
