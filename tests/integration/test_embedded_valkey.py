"""The embedded Valkey server of `taskstream up`: it starts wherever its home folder is, and
when it cannot start, the error says what the server said."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from taskstream.core.errors import QueueUnavailable
from taskstream.runtime import embedded
from taskstream.runtime.embedded import EmbeddedValkey


def test_it_starts_in_a_home_whose_path_holds_a_space(tmp_path: Path) -> None:
    valkey = EmbeddedValkey(tmp_path / "my projects" / ".taskstream")
    try:
        client = redis.Redis.from_url(valkey.start(timeout_s=10.0))
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        valkey.stop()


def test_a_server_that_exits_at_start_is_named_with_what_it_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "CONFIG", embedded.CONFIG + "no-such-directive yes\n")
    valkey = EmbeddedValkey(tmp_path)
    with pytest.raises(QueueUnavailable) as caught:
        valkey.start(timeout_s=10.0)
    message = str(caught.value)
    assert message.startswith("embedded valkey exited at start (code 1):"), message
    assert "no-such-directive" in message
