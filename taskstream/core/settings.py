"""Process settings, read once at the edge from `TASKSTREAM_*` environment variables.

Settings are frozen and passed down; no module reads the environment on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    read_block_ms: int = Field(default=1000, ge=10, le=60_000)
    # At most 8 MiB: MariaDB refuses statements over max_allowed_packet (16 MiB by default).
    max_payload_bytes: int = Field(default=256 * 1024, ge=1024, le=8 * 1024 * 1024)
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
            _check_url(value, REDIS_SCHEMES)
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is not None:
            _check_url(value, ())
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


def _check_url(url: str, schemes: tuple[str, ...]) -> None:
    """`ValueError` naming what is wrong with `url`: no scheme, a scheme not in `schemes`
    (any when empty), or a port that is not a number from 1 to 65535."""
    parts = urlsplit(url)
    if not parts.scheme:
        raise ValueError("not a URL (scheme://...)")
    if schemes and parts.scheme not in schemes:
        raise ValueError(f"scheme {parts.scheme!r} is not one of {', '.join(schemes)}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port: {exc}") from None
    if port == 0:
        raise ValueError("bad port: 0")
