"""Database URLs: what users write, and the async driver URL the store connects with.

Users write the URL they know (`mysql://`, `postgres://`, `sqlite:///path`); the store only
speaks async drivers, so `normalize_url` rewrites the scheme and keeps the rest byte for byte.
`redact_url` is the only form of a URL that may reach a log line or an error message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final

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
_QUERY_SECRET = re.compile(r"([?&][^=&#]*(?:pass|pwd|secret|token|key|cred)[^=&#]*=)[^&#]*", re.I)
"""A query parameter that may carry a secret, up to its value: any whose name holds one of
those words (`password`, `ssl_password`, `sslpassword`, `api_key`, `access_token`, ...). A
path such as `ssl_keyfile` is hidden too: too much, never too little."""


ASYNCPG_NUMBERS: Final[dict[str, Callable[[str], int | float]]] = {
    "statement_cache_size": int,
    "max_cached_statement_lifetime": int,
    "max_cacheable_statement_size": int,
    "command_timeout": float,
}
"""asyncpg's options that are numbers, with the type each is read as. A URL gives them as
text, which asyncpg's `connect` refuses (`TypeError`); the engine passes them as numbers."""


def asyncpg_numbers(url: str) -> dict[str, int | float]:
    """The numeric asyncpg options (`ASYNCPG_NUMBERS`) in `url`'s query, as numbers.
    `ValueError` naming the first whose value is not one: a whole number >= 0, or for
    `command_timeout` a finite number of seconds > 0. Values are never quoted."""
    query = make_url(url).query
    found: dict[str, int | float] = {}
    for name, read in ASYNCPG_NUMBERS.items():
        given = query.get(name)
        if given is None:
            continue
        text = given if isinstance(given, str) else given[-1]
        try:
            value = read(text)
        except ValueError:
            kind = "a number" if read is float else "a whole number"
            raise ValueError(f"option {name}: not {kind}") from None
        if value < 0 or not math.isfinite(value) or (read is float and value == 0):
            raise ValueError(f"option {name}: out of range")
        found[name] = value
    return found


def url_scheme(url: str) -> str | None:
    """The scheme of `url` when it starts with `scheme://`, as written; else None. Reads
    nothing past the `://`, so it never sees the user info."""
    match = _SCHEME.match(url)
    return None if match is None else match.group(1)


def _scheme(url: str) -> str:
    scheme = url_scheme(url)
    if scheme is None:
        raise ConfigError([f"database URL has no scheme: {redact_url(url)}"])
    return scheme


def async_driver(scheme: str) -> str | None:
    """The `dialect+driver` a URL with `scheme` is opened with, None when unsupported."""
    return _ASYNC_SCHEMES.get(scheme.lower())


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
    """`url` with every password replaced by `***`, safe for logs, CLI output and errors: the
    password of the user info (up to the last `@`, so one with an unencoded `@` or `/` is
    hidden whole) and secret query parameters (`?password=...`, which the drivers also log in
    with). A URL that only looks like it has user info is hidden too much, never too little."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return _QUERY_SECRET.sub(r"\1***", url)
    head, rest = url[: scheme_end + 3], url[scheme_end + 3 :]
    at = rest.rfind("@")
    user, colon, _ = rest[:at].partition(":") if at >= 0 else ("", "", "")
    if colon:
        rest = f"{user}:***{rest[at:]}"
    return head + _QUERY_SECRET.sub(r"\1***", rest)
