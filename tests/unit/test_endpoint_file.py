"""The endpoint file holds the cluster's URLs with their credentials: it is the owner's only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from taskstream.core.store.migrate import upgrade
from taskstream.runtime import endpoint, lifetime


def test_the_endpoint_file_and_a_home_it_creates_are_the_owners_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    eps = endpoint.Endpoints("redis://:secret@127.0.0.1:1/0", "sqlite:///x.db")
    path = endpoint.write(home, eps, pid=42)
    assert home.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["redis_url"] == eps.redis_url


def test_a_temporary_file_left_readable_by_others_is_made_private_before_it_is_written(
    tmp_path: Path,
) -> None:
    left = tmp_path / "endpoint.tmp"
    left.write_text("{}")
    left.chmod(0o644)
    eps = endpoint.Endpoints("redis://:secret@127.0.0.1:1/0", "sqlite:///x.db")
    path = endpoint.write(tmp_path, eps, pid=42)
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_embedded_store_is_the_owners_only_in_a_home_others_may_read(
    tmp_path: Path,
) -> None:
    """A home folder that existed before keeps its mode: the store's files are private by
    themselves, including the -wal and -shm files SQLite makes when it opens the store."""
    home = tmp_path / "shared"
    home.mkdir(mode=0o755)
    url = endpoint.private_sqlite(home)
    db = home / endpoint.SQLITE_FILE
    assert url == f"sqlite:///{db.resolve()}"
    assert home.stat().st_mode & 0o777 == 0o755
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        modes = {p.name: p.stat().st_mode & 0o777 for p in home.iterdir()}
    assert modes == {"taskstream.db": 0o600, "taskstream.db-wal": 0o600, "taskstream.db-shm": 0o600}


def test_store_files_an_older_version_left_readable_are_made_private(tmp_path: Path) -> None:
    for name in ("taskstream.db", "taskstream.db-wal", "taskstream.db-shm"):
        (tmp_path / name).write_bytes(b"")
        (tmp_path / name).chmod(0o644)
    endpoint.private_sqlite(tmp_path)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "taskstream.db": 0o600,
        "taskstream.db-wal": 0o600,
        "taskstream.db-shm": 0o600,
    }


@pytest.mark.parametrize("folder", ["jobs?v2", "100%41done", "a b#c@d"])
def test_the_embedded_store_is_the_file_in_its_home_whatever_the_folder_is_named(
    tmp_path: Path, folder: str
) -> None:
    """A `?` ended the file's path in the URL (the store landed one folder up, readable by
    others) and `%41` was decoded (no such file)."""
    home = tmp_path / folder / ".taskstream"
    asyncio.run(upgrade(endpoint.private_sqlite(home)))
    db = home / endpoint.SQLITE_FILE
    with contextlib.closing(sqlite3.connect(db)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "task_instances" in tables
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder]
    assert db.stat().st_mode & 0o777 == 0o600


def test_an_endpoint_file_whose_pid_names_another_process_is_no_running_cluster(
    tmp_path: Path,
) -> None:
    """`up` killed outright, or the host rebooted under it, leaves its endpoint file, and the
    pid in it may since be another process's (an `up` run as a container's pid 1, say): the
    commands must not take its stale URLs for a running cluster's. Only an `up` holding the
    folder's lock makes the file live, and looking does not keep a later `up` from taking it."""
    eps = endpoint.Endpoints("redis://:secret@127.0.0.1:1/0", "sqlite:///x.db")
    endpoint.write(tmp_path, eps, pid=os.getpid())  # alive, but no `up`
    assert endpoint.read_live(tmp_path) is None
    with lifetime.HomeLock(tmp_path):
        assert endpoint.read_live(tmp_path) == eps
    assert endpoint.read_live(tmp_path) is None
    with lifetime.HomeLock(tmp_path):
        pass


@pytest.mark.parametrize(
    ("given", "anchored"),
    [
        ("sqlite:///store.db", "sqlite:///{cwd}/store.db"),
        (
            "sqlite+aiosqlite:///a%20b/s.db?timeout=5",
            "sqlite+aiosqlite:///{cwd}/a%20b/s.db?timeout=5",
        ),
        ("sqlite:////srv/store.db", "sqlite:////srv/store.db"),
        ("mysql://root@db/taskstream", "mysql://root@db/taskstream"),
    ],
)
def test_a_relative_sqlite_path_is_anchored_to_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, anchored: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert endpoint.anchored(given) == anchored.format(cwd=tmp_path.resolve())
