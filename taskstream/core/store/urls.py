"""Database URLs: what users write, and the async driver URL the store connects with.

Users write the URL they know (`mysql://`, `postgres://`, `sqlite:///path`); the store only
speaks async drivers, so `normalize_url` rewrites the scheme and keeps the rest byte for byte.
`redact_url` is the only form of a URL that may reach a log line or an error message.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from taskstream.core.errors import ConfigError

_ASYNC_SCHEMES: dict[str, str] = {
    "mysql": "mysql+asyncmy",
    "mariadb": "mysql+asyncmy",
    "mysql+pymysql": "mysql+asyncmy",
    "mysql+asyncmy": "mysql+asyncmy",
    "mysql+aiomysql": "mysql+aiomysql",
    # One dialect name for MySQL and MariaDB keeps one code path (types, clock, options).
    "mariadb+asyncmy": "mysql+asyncmy",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO_PASSWORD = re.compile(r"^([^:/]+://[^:/@]*):[^@/]*@")


def _scheme(url: str) -> str:
    match = _SCHEME.match(url)
    if match is None:
        raise ConfigError([f"database URL has no scheme: {redact_url(url)}"])
    return match.group(1)


def normalize_url(url: str) -> str:
    """Return the async-driver form of `url`; everything after the scheme is unchanged.

    `mysql://`, `mariadb://`, `mysql+pymysql://` -> `mysql+asyncmy://`;
    `postgres://`, `postgresql://` -> `postgresql+asyncpg://`; `sqlite:///p` ->
    `sqlite+aiosqlite:///p`. Raises `ConfigError` naming the scheme when it is not supported.
    """
    scheme = _scheme(url)
    target = _ASYNC_SCHEMES.get(scheme.lower())
    if target is None:
        supported = ", ".join(sorted({s.split("+")[0] for s in _ASYNC_SCHEMES}))
        raise ConfigError([f"unsupported database URL scheme {scheme!r} (use one of {supported})"])
    normalized = target + url[len(scheme) :]
    try:
        make_url(normalized)
    except ArgumentError as exc:
        raise ConfigError([f"invalid database URL {redact_url(url)}: {exc}"]) from exc
    return normalized


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, safe for logs, CLI output and errors."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return _USERINFO_PASSWORD.sub(r"\1:***@", url)
    if parsed.password is None:
        return url
    return parsed.render_as_string(hide_password=True)
