"""The endpoint file `<home>/endpoint.json`: how commands run in the same folder find the
cluster that `taskstream up` started, without any URL in the environment."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from taskstream.core.errors import ClusterNotFound, ConfigError
from taskstream.core.settings import Settings
from taskstream.core.store.urls import url_scheme
from taskstream.runtime.lifetime import holder

ENDPOINT_FILE = "endpoint.json"
SQLITE_FILE = "taskstream.db"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the cluster's Redis and database are. URLs may hold credentials: never log them
    unredacted."""

    redis_url: str
    database_url: str


def sqlite_url(home: Path) -> str:
    """The URL of the store file in `home`. Its path is percent-quoted: the URL's path is
    read percent-decoded and ends at a `?`, so a folder named `jobs?v2` or `100%41` would
    otherwise open another file (outside the private home) or none."""
    return "sqlite:///" + quote(str((home / SQLITE_FILE).resolve()), safe="/")


def anchored(url: str) -> str:
    """`url` with a relative SQLite file path made absolute, as this process reads it (from
    its working folder), so that a command run in another folder opens the same file rather
    than an empty one of that name. Other URLs are returned as they are."""
    scheme = url_scheme(url) or ""
    head = f"{scheme}:///"
    if not scheme.lower().startswith("sqlite") or not url.startswith(head):
        return url
    path, sep, query = url[len(head) :].partition("?")
    if not path or path.startswith("/") or path == ":memory:" or path.startswith("file:"):
        return url
    return head + quote(str(Path(unquote(path)).resolve()), safe="/") + sep + query


def private_sqlite(home: Path) -> str:
    """The URL of the embedded store in `home`, its file made the owner's only first (it
    holds payloads and results). SQLite gives its -wal and -shm files the database file's
    mode. A home folder that already existed keeps its own mode, so the files must be
    private by themselves; files an older version left readable by others are made private.
    `ConfigError` naming the file that cannot be (a folder in its place, another user's file
    left by a command run with sudo, a read-only disk)."""
    path = home / SQLITE_FILE
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for name in (SQLITE_FILE, *(SQLITE_FILE + suffix for suffix in SQLITE_SIDE_FILES)):
            path = home / name
            with contextlib.suppress(FileNotFoundError):
                path.chmod(0o600)
    except OSError as exc:
        raise ConfigError([f"cannot use {path}: {exc.strerror or exc}"]) from exc
    return sqlite_url(home)


def write(home: Path, endpoints: Endpoints, pid: int) -> Path:
    """Write the endpoint file atomically, readable by its owner only from its first byte on
    (it holds the URLs' credentials); `ConfigError` naming it when it cannot be written."""
    path = home / ENDPOINT_FILE
    tmp = path.with_suffix(".tmp")
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # a leftover temporary file keeps the mode it had
            f.write(json.dumps({**asdict(endpoints), "pid": pid}, indent=2))
        tmp.replace(path)
    except OSError as exc:  # a full disk, a read-only folder: a clear error, not a traceback
        raise ConfigError([f"cannot write {path}: {exc.strerror or exc}"]) from exc
    return path


def remove(home: Path, pid: int) -> None:
    """Remove the endpoint file if it is still ours."""
    path = home / ENDPOINT_FILE
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        return


def read_live(home: Path) -> Endpoints | None:
    """The endpoints of a running `up` in `home`, or None (no file, or the `up` that wrote it
    no longer holds the folder, though its pid may name another process since)."""
    try:
        data = json.loads((home / ENDPOINT_FILE).read_text())
        pid = int(data["pid"])
        found = Endpoints(redis_url=str(data["redis_url"]), database_url=str(data["database_url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if holder(home) == pid else None


def resolve(settings: Settings, *, need_redis: bool = True) -> Endpoints:
    """URLs from the settings first, then a live endpoint file, then the embedded SQLite file.

    Raises `ClusterNotFound` when Redis is needed and nothing says where it is.
    """
    live = read_live(settings.home)
    database_url = settings.database_url or (live.database_url if live else None)
    if database_url is None and (settings.home / SQLITE_FILE).exists():
        database_url = sqlite_url(settings.home)
    redis_url = settings.redis_url or (live.redis_url if live else None)
    if database_url is None or (need_redis and redis_url is None):
        raise ClusterNotFound(
            "no TASKSTREAM_REDIS_URL / TASKSTREAM_DATABASE_URL set and no running cluster in "
            f"{settings.home}/ (start one here with `taskstream up`)"
        )
    return Endpoints(redis_url=redis_url or "", database_url=database_url)
