"""`taskstream` driven as a subprocess against a throwaway SQLite store and one namespace of
the test Redis, whose keys are deleted afterwards."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
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


@functools.cache
def _migrated_template() -> Path:
    """A SQLite store that `taskstream migrate` made, once per test process (and removed at
    its exit): each test copies it instead of paying a CLI process for its own migration.
    Migrating itself is tested where it is the subject."""
    folder = Path(tempfile.mkdtemp(prefix="taskstream-e2e-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_DATABASE_URL"] = f"sqlite:///{folder / 'store.db'}"
    run_cli("migrate", env=env, check=True)
    leftovers = sorted(p.name for p in folder.iterdir() if p.name != "store.db")
    assert not leftovers, f"migrate left {leftovers} beside the store"
    return folder / "store.db"


def migrated_store(folder: Path) -> str:
    """Put a migrated SQLite store in `folder` (`store.db`); returns its URL."""
    shutil.copyfile(_migrated_template(), folder / "store.db")
    return f"sqlite:///{folder / 'store.db'}"


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
        "TASKSTREAM_DATABASE_URL": migrated_store(tmp_path),
        "TASKSTREAM_REDIS_URL": redis_url,
        "TASKSTREAM_NAMESPACE": namespace,
        "COLUMNS": "250",
    }
    run = Cli(tmp_path, env, redis_url, Keys(namespace=namespace))
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


@contextmanager
def role_process(role: str, env: Mapping[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`taskstream ROLE` in the background, its output in `log`; stopped with SIGTERM on the
    way out (at most 30 s), so the caller can check `returncode` afterwards."""
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskstream", role], env=dict(env), stdout=sink, stderr=sink
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `predicate` until true or the deadline; the deadline only bounds the test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False
