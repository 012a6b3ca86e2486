"""Process settings, read once at the edge from `TASKSTREAM_*` environment variables.

Settings are frozen and passed down; no module reads the environment on its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from taskstream.core.store.urls import async_driver, asyncpg_numbers, normalize_url, url_scheme

MAX_PAYLOAD_LIMIT = 7 * 1024 * 1024
"""The largest `max_payload_bytes`: MariaDB refuses statements over `max_allowed_packet`
(16 MiB by default), and the driver's escaping may double a payload's bytes (each backslash
and quote)."""


class Settings(BaseSettings):
    """Everything a taskstream process needs to find its cluster and tune its loops.

    `redis_url` and `database_url` may be None: the CLI then looks for a running embedded
    cluster under `home` (or starts one, for `taskstream up`).
    """

    model_config = SettingsConfigDict(
        env_prefix="TASKSTREAM_", frozen=True, extra="ignore", enable_decoding=False
    )

    redis_url: str | None = None
    database_url: str | None = None
    namespace: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    key_prefix: str = Field(default="ts", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    home: Path = Path(".taskstream")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    executor_concurrency: int = Field(default=4, ge=1, le=1024)
    read_block_ms: int = Field(default=1000, ge=10, le=4_000)
    """Longest blocking read of an idle executor (ms). Under the Redis client's 5 s socket
    timeout, which a longer read would hit every time: reported as Redis down, then paused."""
    max_payload_bytes: int = Field(default=256 * 1024, ge=1024, le=MAX_PAYLOAD_LIMIT)
    max_deliveries: int = Field(default=5, ge=1, le=1000)
    scheduler_max_sleep_s: float = Field(default=60.0, gt=0.0, le=3600.0)
    """Longest scheduler sleep without a hint on the control channel (a safety net)."""
    shutdown_grace_s: float = Field(default=8.0, ge=0.0, le=3600.0)
    agent_modules: tuple[str, ...] = ()
    """Modules whose `AGENTS` are registered next to the built-ins (comma list in the env)."""
    precondition_modules: tuple[str, ...] = ()
    """Modules whose `PRECONDITIONS` the scheduler evaluates (comma list in the env)."""
    scheduler_lease_s: float = Field(default=10.0, ge=1.0, le=300.0)
    """Leader lease: a standby takes over at most this long after the leader stops."""
    liveness_ttl_s: float = Field(default=6.0, ge=1.0, le=300.0)
    sweep_interval_s: float = Field(default=2.0, gt=0.0, le=300.0)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None:
            _check_redis_url(value)
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is not None:
            _check_database_url(value)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("agent_modules", "precondition_modules", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


REDIS_SCHEMES = ("redis", "rediss", "unix")

_BAD_PORT = "bad port: not a number from 1 to 65535"

# The messages below never quote the URL or a parser's message: a parser that splits the user
# info elsewhere than the client does reads part of the password as the host or the port.


def _check_redis_url(url: str) -> None:
    """`ValueError` naming what is wrong with `url` as the Redis client reads it (`urlsplit`):
    no `scheme://`, a scheme not in `REDIS_SCHEMES`, or a port that is not 1 to 65535. That
    reading ends the user info at the first `/`, `?` or `#`, so a password holding one must be
    percent-encoded (`%2F`, `%3F`, `%23`)."""
    scheme = url_scheme(url)
    if scheme is None:
        raise ValueError("not a URL (scheme://...)")
    if scheme not in REDIS_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(REDIS_SCHEMES)}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValueError("not a URL (unreadable host)") from None
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{_BAD_PORT} (percent-encode a '/', '?' or '#' in the password)")
    if scheme != "unix" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError(
            "the path after the host is not a database number (redis://host:port/0;"
            " percent-encode a '/' in the password as %2F)"
        )
    _check_redis_options(url, parts.query)


def _check_redis_options(url: str, query: str) -> None:
    """`ValueError` naming the query options (names only) when the Redis client refuses
    them: a value it cannot read (`socket_timeout=abc`) or a name it does not know. Builds a
    connection object as the client would, without connecting."""
    try:
        pool = ConnectionPool.from_url(url)
        pool.connection_class(**pool.connection_kwargs)
    except (ValueError, TypeError, RedisError):
        names = ", ".join(sorted(parse_qs(query, keep_blank_values=True))) or "none"
        raise ValueError(f"the Redis client refuses this URL's options ({names})") from None


def _check_database_url(url: str) -> None:
    """`ValueError` naming what is wrong with `url` as SQLAlchemy reads it (`make_url`): no
    `scheme://`, a form it cannot read, or a port that is not 1 to 65535. That reading takes
    the password up to the `@` before the host, so it may hold a `/` as it is."""
    scheme = url_scheme(url)
    if scheme is None:
        raise ValueError("not a URL (scheme://...)")
    try:
        parsed = make_url(url)
        port = parsed.port
    except ArgumentError:
        raise ValueError("not a database URL (scheme://user:password@host:port/name)") from None
    except ValueError:
        port = 0
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(_BAD_PORT)
    if "@" in (parsed.host or ""):
        raise ValueError("the host holds an '@': percent-encode an '@' in the password as %40")
    server = not scheme.lower().startswith("sqlite")
    if server and not parsed.database:
        raise ValueError("no database name after the host (scheme://user:password@host/name)")
    if not server and _in_memory(parsed.database, parsed.query.get("mode")):
        raise ValueError(
            "an in-memory SQLite store is private to the process that opens it, and each role "
            "is a process of its own: name a file (sqlite:///path/to/store.db)"
        )
    if parsed.query and async_driver(scheme) in _CHECKED_DRIVERS:
        _check_driver_options(url)


_CHECKED_DRIVERS = ("mysql+asyncmy", "postgresql+asyncpg")
"""The drivers whose `connect` names every option it takes: an option it does not take is
refused at the first connection with a `TypeError` (a traceback at every command)."""


def _in_memory(database: str | None, mode: str | tuple[str, ...] | None) -> bool:
    """Whether an SQLite URL's database (its path) and `mode` option name no file."""
    modes = (mode,) if isinstance(mode, str) else mode or ()
    return not database or database == ":memory:" or "memory" in modes


_ASYNCPG_OWN = frozenset({"prepared_statement_cache_size", "prepared_statement_name_func"})
"""Options of SQLAlchemy's asyncpg dialect, taken before the driver's `connect` is called."""


def _driver_connect(driver: str) -> tuple[Callable[..., Any], frozenset[str]]:
    """The `connect` of `driver` and the options the dialect takes itself."""
    # Imported here: every command reads its settings, few name driver options (13 ms).
    if driver == "mysql+asyncmy":
        import asyncmy  # noqa: PLC0415

        return asyncmy.connect, frozenset()
    import asyncpg  # noqa: PLC0415

    return asyncpg.connect, _ASYNCPG_OWN


def _check_driver_options(url: str) -> None:
    """`ValueError` naming the query options (names only) that the database driver (asyncmy
    for `mysql://`, asyncpg for `postgresql://`) does not take: it would refuse them at the
    first connection. libpq's `sslmode` is named with asyncpg's own, `ssl`."""
    try:
        parsed = make_url(normalize_url(url))
        _, given = parsed.get_dialect()().create_connect_args(parsed)
        connect, own = _driver_connect(parsed.drivername)
        known = set(inspect.signature(connect).parameters) | own
    except Exception:  # an option value the dialect cannot read
        names = ", ".join(sorted(make_url(url).query)) or "none"
        raise ValueError(f"the database driver refuses this URL's options ({names})") from None
    if own:  # asyncpg: its numbers, given as text, are passed as numbers
        try:
            asyncpg_numbers(url)
        except ValueError as exc:
            raise ValueError(f"the database driver refuses this URL's {exc}") from None
    unknown = sorted(set(given) - known)
    if unknown:
        hint = " (asyncpg takes ssl=, e.g. ssl=require)" if "sslmode" in unknown else ""
        raise ValueError(
            f"the database driver does not know the option(s) {', '.join(unknown)}{hint}"
        )
