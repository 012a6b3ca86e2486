"""`BodyDecoder` (pure): gzip and deflate layers decoded chunk by chunk, never past the room
asked for; codings it cannot bound kept as sent."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import httpx
import pytest

from taskstream.agents.content_coding import (
    ACCEPT_ENCODING,
    MAX_CODINGS,
    BodyDecoder,
    request_headers,
)

TEXT = bytes(range(256)) * 64


def deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def decode_all(decoder: BodyDecoder, sent: bytes, chunk: int, room: int = 1 << 30) -> bytes:
    out = b""
    for at in range(0, len(sent), chunk):
        out += decoder.decode(sent[at : at + chunk], room - len(out))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_layers_decode_in_any_chunking(chunk: int) -> None:
    sent = deflate(gzip.compress(TEXT))  # gzip applied first, then deflate
    assert decode_all(BodyDecoder(["gzip", " Deflate"]), sent, chunk) == TEXT


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_every_member_of_a_gzip_body_is_decoded(chunk: int) -> None:
    members = [gzip.compress(TEXT), gzip.compress(b""), gzip.compress(b"tail")]
    sent = deflate(b"".join(members))
    assert decode_all(BodyDecoder(["gzip", "deflate"]), sent, chunk) == TEXT + b"tail"
    assert decode_all(BodyDecoder(["gzip"]), b"".join(members), chunk, room=300) == TEXT[:300]


@pytest.mark.parametrize("after", [b"\0" * 8, b"not gzip at all"], ids=["padding", "garbage"])
@pytest.mark.parametrize("chunk", [1, 4096])
def test_what_follows_the_last_member_is_dropped_as_gzip_does(after: bytes, chunk: int) -> None:
    sent = gzip.compress(TEXT) + gzip.compress(b"2nd") + after
    assert decode_all(BodyDecoder(["gzip"]), sent, chunk) == TEXT + b"2nd"


@pytest.mark.parametrize(
    "codings",
    [["br"], ["gzip", "zstd"], ["compress"], ["gzip"] * (MAX_CODINGS + 1)],
    ids=["br", "gzip-then-zstd", "compress", "too-many-layers"],
)
def test_codings_it_cannot_bound_are_kept_as_sent(codings: list[str]) -> None:
    assert BodyDecoder(codings).decode(b"as sent", 4) == b"as s"


def test_identity_and_empty_codings_are_no_layers() -> None:
    assert BodyDecoder(["identity", ""]).decode(b"plain", 100) == b"plain"


def test_decoding_stops_at_the_room_asked_for() -> None:
    decoder = BodyDecoder(["gzip"])
    assert decoder.decode(gzip.compress(TEXT), 1000) == TEXT[:1000]


def test_one_call_on_a_bomb_holds_about_the_room_not_the_expanded_body() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    inner = b"".join([*(packer.compress(bytes(1 << 20)) for _ in range(64)), packer.flush()])
    sent = gzip.compress(inner, 9)  # 64 MiB of zeros under two layers of gzip
    tracemalloc.start()
    try:
        out = BodyDecoder(["gzip", "gzip"]).decode(sent, 64 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == bytes(64 * 1024)
    assert peak < 4 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"


def test_a_body_not_in_its_coding_is_a_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError):
        BodyDecoder(["gzip"]).decode(b"not gzip", 100)


def test_deflate_falls_back_to_raw_only_at_its_start() -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw = packer.compress(TEXT) + packer.flush()
    assert BodyDecoder(["deflate"]).decode(raw, 1 << 20) == TEXT
    decoder = BodyDecoder(["deflate"])
    decoder.decode(deflate(TEXT)[:10], 1 << 20)
    with pytest.raises(httpx.DecodingError):
        decoder.decode(b"\xff" * 64, 1 << 20)


def test_requests_advertise_only_what_is_decoded_unless_the_caller_says() -> None:
    assert request_headers(None)["accept-encoding"] == ACCEPT_ENCODING == "gzip, deflate"
    mine = request_headers({"ACCEPT-ENCODING": "identity", "X-Id": "1"})
    assert mine.get_list("accept-encoding") == ["identity"] and mine["x-id"] == "1"
