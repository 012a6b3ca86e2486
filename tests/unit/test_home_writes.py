"""`up`'s own files in its home folder (the lock, the endpoint file, the embedded server's
config): a write the system refuses (a full disk, a read-only or missing folder) is a clear
error naming the file, not a traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from taskstream.core.errors import ConfigError
from taskstream.runtime import embedded, endpoint, lifetime
from taskstream.runtime.endpoint import Endpoints


def test_a_lock_file_the_disk_cannot_take_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(_fd: int, _data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(os, "write", disk_full)
        with (
            pytest.raises(ConfigError, match="No space left on device"),
            lifetime.HomeLock(tmp_path),
        ):
            pass
    with lifetime.HomeLock(tmp_path):  # the lock was let go: a later start takes it
        pass


def test_an_endpoint_file_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("a file where the folder should be")
    with pytest.raises(ConfigError, match=r"cannot write .*endpoint\.json"):
        endpoint.write(home, Endpoints("redis://x", "sqlite://"), os.getpid())


def test_a_server_config_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot write .*valkey\.conf"):
        embedded._write_private(tmp_path / "missing" / "valkey.conf", "port 1\n")


def test_a_store_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    """The embedded store's path is not a file `up` may use (a folder there; a file another
    user owns, left by a command run with sudo): an error naming it, not a traceback."""
    (tmp_path / endpoint.SQLITE_FILE).mkdir()
    with pytest.raises(ConfigError, match=r"cannot use .*taskstream\.db: Is a directory"):
        endpoint.private_sqlite(tmp_path)


def test_a_store_side_file_that_cannot_be_made_private_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "taskstream.db-wal").write_bytes(b"")
    real_chmod = Path.chmod

    def not_ours(path: Path, mode: int) -> None:
        if path.name.endswith("-wal"):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        real_chmod(path, mode)

    monkeypatch.setattr(Path, "chmod", not_ours)
    with pytest.raises(ConfigError, match=r"cannot use .*taskstream\.db-wal: Operation not"):
        endpoint.private_sqlite(tmp_path)
