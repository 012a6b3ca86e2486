"""The endpoint file holds the cluster's URLs with their credentials: it is the owner's only."""

from __future__ import annotations

import json
from pathlib import Path

from taskstream.runtime import endpoint


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
