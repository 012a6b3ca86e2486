"""User database URLs -> async driver URLs, and redaction for logs."""

from __future__ import annotations

import pytest

from taskstream.core.errors import ConfigError
from taskstream.core.store.urls import normalize_url, redact_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("mysql://u:p@db:3306/ts", "mysql+asyncmy://u:p@db:3306/ts"),
        ("mariadb://u@db/ts?charset=utf8mb4", "mysql+asyncmy://u@db/ts?charset=utf8mb4"),
        ("mysql+pymysql://u:p@db/ts", "mysql+asyncmy://u:p@db/ts"),
        ("postgres://u:p%40x@db/ts", "postgresql+asyncpg://u:p%40x@db/ts"),
        ("postgresql://u@db:5433/ts", "postgresql+asyncpg://u@db:5433/ts"),
        ("sqlite:///rel/path.db", "sqlite+aiosqlite:///rel/path.db"),
        ("sqlite:////abs/path.db", "sqlite+aiosqlite:////abs/path.db"),
        ("mysql+asyncmy://u@db/ts", "mysql+asyncmy://u@db/ts"),
        ("postgresql+asyncpg://u@db/ts", "postgresql+asyncpg://u@db/ts"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    ],
)
def test_normalize_url(given: str, expected: str) -> None:
    assert normalize_url(given) == expected


@pytest.mark.parametrize("url", ["oracle://u@db/x", "redis://localhost:6379/0", "nonsense"])
def test_unsupported_url_is_a_config_error_naming_the_scheme(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_url(url)

    scheme = url.split("://", maxsplit=1)[0] if "://" in url else "no scheme"
    assert scheme in str(caught.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("mysql://root:hunter2@db:3306/ts", "mysql://root:***@db:3306/ts"),
        ("postgresql+asyncpg://u:p%40ss@db/ts", "postgresql+asyncpg://u:***@db/ts"),
        ("mysql://root@db/ts", "mysql://root@db/ts"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("mysql://root:p@ss@127.0.0.1:1/x", "mysql://root:***@127.0.0.1:1/x"),
        ("mysql://root:pa/ss@db/x", "mysql://root:***@db/x"),
        ("redis://127.0.0.1:6390/0?password=Rpass123", "redis://127.0.0.1:6390/0?password=***"),
        (
            "mysql://ts@db:3306/ts1?charset=utf8mb4&PASSWORD=x&ssl=1",
            "mysql://ts@db:3306/ts1?charset=utf8mb4&PASSWORD=***&ssl=1",
        ),
        ("rediss://u:pw@h/0?token=abc#frag", "rediss://u:***@h/0?token=***#frag"),
        (
            "rediss://:pw@h:6379/0?ssl_password=KEYPASS&ssl_certfile=/c.pem",
            "rediss://:***@h:6379/0?ssl_password=***&ssl_certfile=/c.pem",
        ),
        (
            "postgresql://u@db/ts?sslpassword=a&x_API_KEY=b&client_secret=c&auth=d",
            "postgresql://u@db/ts?sslpassword=***&x_API_KEY=***&client_secret=***&auth=d",
        ),
    ],
)
def test_redact_url_hides_only_the_password(given: str, expected: str) -> None:
    assert redact_url(given) == expected
