"""Text the CLI did not write (agents' payloads and errors, entries other programs put in the
streams) is printed as it is: rich markup in it is neither applied nor an error, bytes that
are not UTF-8 are shown escaped instead of failing the command, and control characters are
shown escaped instead of reaching the terminal as its commands."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis

from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from tests.e2e.cli_rig import applied, run_cli

ON_DEMAND = "tasks:\n  - {id: od, agent: echo}\n"
MARKUP = "[/v] closes nothing, [bold]b[/bold] stays"
# Set the terminal's title, clear the screen, turn text red: what a hostile writer would send.
EVIL = "\x1b]0;owned\x1b[2J\x1b[31m"
EVIL_SHOWN = "\\x1b]0;owned\\x1b[2J\\x1b[31m"


def test_dead_list_shows_foreign_bytes_and_brackets_as_they_are(
    tmp_path: Path, redis_url: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url)
        try:
            client.xadd(
                cli.keys.dead,
                {"reason": b"poison\xff", "detail": MARKUP, "orig.instance_id": b"i_\xfe"},
            )
        finally:
            client.close()
        table = cli("dead", "list")
        [letter] = json.loads(cli("dead", "list", "--json"))
    assert (letter["reason"], letter["detail"]) == ("poison\\xff", MARKUP)
    assert letter["instance_id"] == "i_\\xfe"
    assert "poison\\xff" in table and "i_\\xfe" in table
    assert MARKUP in table


def test_inspect_prints_a_payload_with_brackets_as_it_is(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {"tasks.yaml": ON_DEMAND}) as cli:
        published = cli("trigger", "od", "--payload", json.dumps({"note": MARKUP}))
        instance_id = published.split()[2]
        shown = cli("inspect", instance_id)
    assert f"payload: {{'note': '{MARKUP}'}}" in shown
    assert f"id: {instance_id}" in shown


async def _poisoned(url: str, instance_id: str) -> None:
    """Fail the dispatched instance as an executor that could not decode its entry would."""
    store = await SqlStore.connect(url)
    try:
        cas = await store.transition(
            instance_id,
            Status.DISPATCHED,
            Status.FAILED,
            reason="undecodable",
            fail_class=FailClass.POISON,
        )
        assert cas.ok
    finally:
        await store.close()


@pytest.mark.parametrize(("reason", "expected"), [(MARKUP, MARKUP), (EVIL, EVIL_SHOWN)])
def test_a_retry_reason_is_kept_in_the_history_and_shown_as_it_is(
    tmp_path: Path, redis_url: str, reason: str, expected: str
) -> None:
    """Brackets as they are; control characters escaped (`--json` keeps them exactly)."""
    with applied(tmp_path, redis_url, {"tasks.yaml": ON_DEMAND}) as cli:
        instance_id = cli("trigger", "od").split()[2]
        asyncio.run(_poisoned(cli.env["TASKSTREAM_DATABASE_URL"], instance_id))
        cli("retry", instance_id, "--reason", reason)
        shown = cli("inspect", instance_id)
        [requeued] = [
            h for h in json.loads(cli("inspect", instance_id, "--json"))["history"] if h["note"]
        ]
    assert (requeued["reason"], requeued["note"]) == ("requeued", reason)
    assert f"requeued: {expected}" in shown
    assert "\x1b" not in shown


def test_dead_list_shows_control_characters_escaped(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url)
        try:
            client.xadd(
                cli.keys.dead,
                {"reason": "unknown_version", "detail": EVIL, "orig.instance_id": "i" + EVIL},
            )
        finally:
            client.close()
        table = cli("dead", "list")
        [letter] = json.loads(cli("dead", "list", "--json"))
    assert "\x1b" not in table
    assert EVIL_SHOWN in table
    assert letter["detail"] == EVIL  # JSON keeps the text, escaped by JSON itself


def test_a_task_file_error_shows_control_characters_escaped(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text('tasks:\n  - {id: a, agent: "x\\e]0;owned\\a"}\n')
    out = run_cli("tasks", "validate", "t.yaml", env={"PATH": "/usr/bin"}, cwd=tmp_path)
    assert out.returncode == 2, out
    assert "\x1b" not in out.stderr
    assert "unknown agent 'x\\x1b]0;owned\\x07'" in out.stderr


def test_an_instance_id_that_is_not_utf8_is_refused_without_a_traceback(
    tmp_path: Path, redis_url: str
) -> None:
    """An id argument holding bytes that are not UTF-8 (the shell passes them through): on the
    embedded SQLite store too, a clear refusal (exit 1), not the driver's encoding error."""
    with applied(tmp_path, redis_url, {}) as cli:
        outs = [
            run_cli("inspect", "a\udcffb", env=cli.env, cwd=cli.cwd),
            run_cli("retry", "a\udcffb", "--reason", "x", env=cli.env, cwd=cli.cwd),
        ]
    for out in outs:
        assert out.returncode == 1, out.stderr[-300:]
        assert "Traceback" not in out.stderr
        assert out.stderr.startswith("error: "), out.stderr[-300:]


def test_one_overlong_letter_does_not_hide_every_dead_id(tmp_path: Path, redis_url: str) -> None:
    """A letter another program wrote may carry fields of any length: they are cut, so the
    ids `dead replay ID` needs stay readable on every row."""
    with applied(tmp_path, redis_url, {}) as cli:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            good = str(client.xadd(cli.keys.dead, {"reason": "poison", "orig.instance_id": "i_1"}))
            client.xadd(
                cli.keys.dead,
                {"reason": "R" * 400, "orig.instance_id": "I" * 400, "source_stream": "S" * 400},
            )
        finally:
            client.close()
        table = cli("dead", "list")
    assert good in table and "poison" in table
    assert "I" * 39 + "…" in table and "I" * 60 not in table
    assert "R" * 60 not in table and "S" * 60 not in table
