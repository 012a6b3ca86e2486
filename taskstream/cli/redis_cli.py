"""`taskstream redis-cli ARGS...`: redis-cli connected to the cluster's Redis, with the
password handed over in the environment (`REDISCLI_AUTH`), never on a command line where
`ps` and shell history would show it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from taskstream.cli.common import settings
from taskstream.core.errors import TaskstreamError
from taskstream.runtime.endpoint import resolve

CLIENTS = ("redis-cli", "valkey-cli")
"""Binaries tried, in order; both read the password from `REDISCLI_AUTH`."""

_parse_url: Callable[[str], dict[str, Any]] = parse_url
"""redis-py's own URL reading (percent-decoding, `unix://`, `?db=`), typed."""


@dataclass(frozen=True, slots=True)
class Invocation:
    """What to exec: `argv` (no secret in it) and the extra environment (the password)."""

    argv: list[str]
    env: dict[str, str]


def invocation(binary: str, redis_url: str, args: Sequence[str]) -> Invocation:
    """The redis-cli call that reaches `redis_url` and runs `args` there (pure)."""
    parts = _parse_url(redis_url)
    if parts.get("connection_class") is UnixDomainSocketConnection:
        argv = [binary, "-s", str(parts["path"])]
    else:
        argv = [binary, "-h", str(parts.get("host", "127.0.0.1"))]
        argv += ["-p", str(parts.get("port", 6379))]
    argv += ["-n", str(parts.get("db", 0))]
    if parts.get("connection_class") is SSLConnection:
        argv.append("--tls")
    if parts.get("username"):
        argv += ["--user", str(parts["username"])]
    password = parts.get("password")
    env = {"REDISCLI_AUTH": str(password)} if password else {}
    return Invocation(argv + list(args), env)


def find_client(path: str | None = None) -> str:
    """The first redis-cli-like binary on `path` (default: $PATH); a clear error if none."""
    for name in CLIENTS:
        found = shutil.which(name, path=path)
        if found:
            return found
    raise TaskstreamError(
        "no redis-cli or valkey-cli on PATH: install one (Debian: apt-get install redis-tools)"
    )


def redis_cli_cmd(ctx: typer.Context) -> None:
    """Run redis-cli against the cluster's Redis: `taskstream redis-cli XLEN KEY`. The
    password goes in the environment, not on the command line."""
    eps = resolve(settings(), need_redis=True)
    call = invocation(find_client(), eps.redis_url, ctx.args)
    env: Mapping[str, str] = {**os.environ, **call.env}
    os.execve(call.argv[0], call.argv, env)  # noqa: S606 - no shell; args go to redis-cli as given
