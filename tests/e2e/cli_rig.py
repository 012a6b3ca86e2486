"""`taskstream` driven as a subprocess against a throwaway SQLite store and one namespace of
the test Redis, whose keys are deleted afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from taskstream.core.protocol import Keys


def run_cli(
    *args: str, env: Mapping[str, str], cwd: Path | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m taskstream ARGS` with `env` (text output captured, at most 60 s);
    `check` raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "taskstream", *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


@dataclass(frozen=True)
class Cli:
    """Runs `taskstream` in `cwd` against one namespace of the test Redis."""

    cwd: Path
    env: dict[str, str]
    redis_url: str
    keys: Keys

    def __call__(self, *args: str) -> str:
        out = run_cli(*args, env=self.env, cwd=self.cwd)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout


@contextmanager
def applied(tmp_path: Path, redis_url: str, files: Mapping[str, str]) -> Iterator[Cli]:
    """A migrated store in `tmp_path` with each of `files` (name -> YAML) applied in order."""
    namespace = "e2e" + uuid.uuid4().hex[:12]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env |= {
        "TASKSTREAM_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "TASKSTREAM_REDIS_URL": redis_url,
        "TASKSTREAM_NAMESPACE": namespace,
        "COLUMNS": "250",
    }
    run = Cli(tmp_path, env, redis_url, Keys(namespace=namespace))
    run("migrate")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        run("tasks", "apply", name)
    try:
        yield run
    finally:
        client = redis.Redis.from_url(redis_url)
        found = list(client.scan_iter(match=f"{run.keys.base}:*", count=500))
        if found:
            client.delete(*found)
        client.close()
