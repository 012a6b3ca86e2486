"""Stream entry encoding: round trips, and every malformed entry is a ProtocolError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.errors import ProtocolError
from taskstream.core.protocol import (
    MAX_ENTRY_BYTES,
    Keys,
    Priority,
    WorkEntry,
    dead_fields,
    decode,
    encode,
    read_release_note,
    release_note,
)

ENTRY = WorkEntry(
    instance_id="i_abc",
    task_id="daily",
    agent="echo",
    attempt=0,
    scheduled_for_ms=1_700_000_000_000,
    emitted_at_ms=1_700_000_000_005,
    trace_id="t1",
)


def test_keys_share_one_hash_tag() -> None:
    keys = Keys(prefix="ts", namespace="blue")
    all_keys = [
        *keys.streams(),
        keys.dead,
        keys.leader,
        keys.alive("h:1:2"),
        keys.released("i_1", 3),
        keys.limiter("llm"),
        keys.breaker("llm"),
    ]
    assert all(k.startswith("ts:{blue}:") for k in all_keys)
    assert keys.streams() == [
        keys.stream(p) for p in (Priority.HIGH, Priority.DEFAULT, Priority.LOW)
    ]


@pytest.mark.parametrize(
    ("owner", "lost_end"), [("h:1:2", None), ("h:1:2", "completed"), ("h:1:2", "timeout")]
)
def test_a_release_note_reads_back_as_written(owner: str, lost_end: str | None) -> None:
    assert read_release_note(release_note(owner, lost_end)) == (owner, lost_end)


def test_a_release_note_of_a_release_is_the_owner_alone() -> None:
    """As the notes of releases were written before ends were noted too."""
    assert release_note("h:1:2") == "h:1:2"
    assert read_release_note("h:1:2") == ("h:1:2", None)


def test_round_trip_from_bytes() -> None:
    raw = {k.encode(): v.encode() for k, v in encode(ENTRY).items()}
    assert decode(raw) == ENTRY


def test_redeliveries_travel_only_when_there_were_some() -> None:
    """A first entry has the fields of version 1 as they always were; a redelivered one
    carries its count, and it survives the round trip."""
    assert "redeliveries" not in encode(ENTRY)
    again = ENTRY.model_copy(update={"redeliveries": 3})
    assert encode(again)["redeliveries"] == "3"
    assert decode(encode(again)).redeliveries == 3
    assert decode(encode(ENTRY)).redeliveries == 0


@given(
    attempt=st.integers(min_value=0, max_value=10**6),
    at=st.integers(min_value=0, max_value=2**53),
    task=st.from_regex(r"[a-z][a-z0-9_.-]{0,40}", fullmatch=True),
)
def test_round_trip_property(attempt: int, at: int, task: str) -> None:
    entry = ENTRY.model_copy(update={"attempt": attempt, "scheduled_for_ms": at, "task_id": task})
    assert decode(encode(entry)) == entry


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"instance_id": b"x"}, "missing_version"),
        ({**encode(ENTRY), "v": "9"}, "unknown_version"),
        ({**encode(ENTRY), "attempt": "-1"}, "bad_field"),
        ({**encode(ENTRY), "attempt": "one"}, "bad_field"),
        ({**encode(ENTRY), "attempt": "\u00b2"}, "bad_field"),  # "²": isdigit, but not int
        ({**encode(ENTRY), "scheduled_for_ms": "\u0661"}, "bad_field"),  # Arabic-Indic 1
        ({**encode(ENTRY), "surprise": "x"}, "bad_field"),
        ({**encode(ENTRY), "redeliveries": "-1"}, "bad_field"),
        # A NUL, which PostgreSQL's text refuses: the store could not look the instance up.
        ({**encode(ENTRY), "instance_id": "i_\x00"}, "bad_field"),
        ({**encode(ENTRY), "trace_id": "\x00"}, "bad_field"),
        ({**encode(ENTRY), "agent": b"slow\x00"}, "bad_field"),
        ({k: v for k, v in encode(ENTRY).items() if k != "agent"}, "bad_field"),
        ({b"v": b"1", b"instance_id": b"\xff\xfe"}, "bad_encoding"),
        ({**encode(ENTRY), "trace_id": "x" * (MAX_ENTRY_BYTES + 1)}, "oversize"),
        # 2,000 characters, but 6,000 bytes: the limit counts bytes.
        ({**encode(ENTRY), "trace_id": "\u20ac" * 2000}, "oversize"),
        ({b"v": b"1", b"trace_id": "\u20ac".encode() * 2000}, "oversize"),
    ],
)
def test_malformed_entries_name_their_reason(fields: dict[object, object], reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(fields)
    assert info.value.reason == reason


@given(
    changes=st.dictionaries(
        st.sampled_from(
            ["attempt", "scheduled_for_ms", "emitted_at_ms", "redeliveries", "v", "agent", "x"]
        ),
        st.text(max_size=8),
        max_size=3,
    )
)
def test_any_field_values_decode_or_raise_protocol_error(changes: dict[str, str]) -> None:
    """Whatever a writer put in the fields, decoding raises nothing but `ProtocolError`
    (anything else would crash the executor's and the sweeper's loops)."""
    with contextlib.suppress(ProtocolError):
        decode({**encode(ENTRY), **changes})


def test_dead_fields_keep_the_original_and_the_reason() -> None:
    out = dead_fields(
        {b"v": b"\xff", b"\xfe": b"x"},
        reason="bad_encoding",
        detail="d",
        stream="s",
        entry_id="1-0",
    )
    assert out["reason"] == "bad_encoding"
    assert out["source_id"] == "1-0"
    assert (out[b"orig.v"], out[b"orig.\xfe"]) == (b"\xff", b"x")  # the bytes, as they came
    assert "cut" not in out


def test_dead_fields_say_how_much_of_an_oversize_entry_they_cut() -> None:
    """74 fields: two names alike in their first 200 bytes (the first shortened, the second
    dropped), a value over the entry limit (shortened), then 71 more (62 kept)."""
    raw: dict[bytes, bytes] = {b"n" * 300 + b"a": b"2", b"n" * 300 + b"b": b"3"}
    raw[b"big"] = b"x" * (MAX_ENTRY_BYTES + 1)
    raw.update({f"f{i}".encode(): b"1" for i in range(71)})
    out = dead_fields(raw, reason="r", detail="d", stream="s", entry_id="1-0")
    kept = [k for k in out if isinstance(k, bytes)]
    assert len(kept) == 64 and kept[-1] == b"orig.f61"
    assert out[(b"orig." + b"n" * 300)[:200]] == b"2"
    assert len(out[b"orig.big"]) == MAX_ENTRY_BYTES
    assert out["cut"] == "12"  # 2 shortened, 1 alike name and 9 fields over the 64 dropped


def test_read_order_prefers_high_without_starving_low() -> None:
    from collections import Counter

    from taskstream.core.protocol import read_order

    firsts = Counter(read_order(turn)[0] for turn in range(1000))
    assert firsts == {Priority.HIGH: 700, Priority.DEFAULT: 200, Priority.LOW: 100}
    assert all(sorted(read_order(t)) == sorted(Priority) for t in range(10))


def test_a_priority_by_name_and_a_foreign_one_named_in_the_error() -> None:
    assert Priority.of("high") is Priority.HIGH
    with pytest.raises(ValueError, match=r"^priority: 'urgent' is not one of high, default, low$"):
        Priority.of("urgent")


def test_a_server_refusing_writes_for_its_disk_is_an_outage() -> None:
    """MISCONF (snapshots failing) is waited out like READONLY or OOM, not taken for a bug:
    the limiter would otherwise fail the run instead of deferring it."""
    from redis._parsers.base import BaseParser

    from taskstream.core import streams

    reply = "MISCONF Redis is configured to save RDB snapshots, but it's currently unable"
    error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    assert isinstance(error, streams.PersistenceError)
    assert isinstance(error, streams.DRIVER_ERRORS)
    assert str(error).startswith("MISCONF Redis is configured")
    other = BaseParser.parse_error("ERR unknown command")  # type: ignore[no-untyped-call]
    assert not isinstance(other, streams.DRIVER_ERRORS)


def test_a_server_busy_running_a_script_is_an_outage() -> None:
    """BUSY (a long script holds the server) is waited out like READONLY or OOM; BUSYGROUP,
    a word of its own, is not taken for it."""
    from redis._parsers.base import BaseParser

    from taskstream.core import streams

    reply = "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
    error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    assert isinstance(error, streams.ScriptBusyError)
    assert isinstance(error, streams.DRIVER_ERRORS)
    assert str(error) == reply
    group = BaseParser.parse_error("BUSYGROUP Consumer Group name already exists")  # type: ignore[no-untyped-call]
    assert not isinstance(group, streams.DRIVER_ERRORS)


def test_a_server_short_of_replicas_is_an_outage() -> None:
    """NOREPLICAS (`min-replicas-to-write` unmet) passes by itself: waited out, the reply kept
    whole."""
    from redis._parsers.base import BaseParser

    from taskstream.core import streams

    reply = "NOREPLICAS Not enough good replicas to write."
    error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    assert isinstance(error, streams.NoReplicasError)
    assert isinstance(error, streams.DRIVER_ERRORS)
    assert str(error) == reply
