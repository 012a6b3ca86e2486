"""Every Redis client gives up on a connect or a reply after 5 s, whichever redis-py is
installed (its own default was no timeout at all before 8.0): a frozen server then fails the
call, which the roles treat as an outage, instead of holding it for ever. A URL's own
`socket_timeout` or `socket_connect_timeout` still wins."""

from __future__ import annotations

from taskstream.core import streams


def test_a_client_times_out_connects_and_replies_after_5_s() -> None:
    client = streams.connect("redis://127.0.0.1:6379/0")
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")) == (5.0, 5.0)


def test_the_url_s_own_timeouts_win() -> None:
    url = "redis://127.0.0.1:6379/0?socket_timeout=2&socket_connect_timeout=1.5"
    kwargs = streams.connect(url).connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 1.5)
