"""Bounded decoding of a response body's content codings (`Content-Encoding`).

A compressed body can expand a thousandfold per layer, so decoding whole chunks (as httpx does)
costs memory in proportion to the expanded body, not to what is kept. `BodyDecoder` decodes
`gzip` and `deflate` layers (any number up to `MAX_CODINGS`) with zlib's output limit: one
call yields at most the bytes asked for, plus at most `STEP_BYTES` per layer held in
passing, however far the body expands.

A body in a coding this module cannot decode with a bound (`br`, `zstd`, `compress`, an unknown
name, more than `MAX_CODINGS` layers) is kept as sent. Requests advertise only the codings
decoded here (`ACCEPT_ENCODING`), so an upstream sends such a body only unasked.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import httpx

ACCEPT_ENCODING: Final = "gzip, deflate"
"""The `Accept-Encoding` sent unless the caller sets one: the codings `BodyDecoder` decodes."""
MAX_CODINGS: Final = 4
"""Most content coding layers decoded; a body with more is kept as sent. Each layer holds a
zlib window (32 KiB) and up to `STEP_BYTES` of output in passing."""
STEP_BYTES: Final = 64 * 1024
"""Most bytes one layer puts out per zlib call."""

_DECODED: Final = frozenset({"gzip", "x-gzip", "deflate"})
_GZIP_WBITS: Final = zlib.MAX_WBITS | 16
"""zlib's window bits for a gzip header and trailer."""


def request_headers(headers: Mapping[str, str] | None) -> httpx.Headers:
    """`headers` with `Accept-Encoding: ACCEPT_ENCODING` unless they set it (any case)."""
    merged = httpx.Headers({"Accept-Encoding": ACCEPT_ENCODING})
    merged.update(headers or {})
    return merged


class _Layer:
    """One gzip or deflate layer. `deflate` is meant to be zlib-wrapped, but some servers send
    raw deflate: like httpx, a first chunk that is not zlib is retried as raw. A gzip body may
    hold several members one after the other (RFC 1952 2.2): each is decoded in turn, and what
    follows the last whole member without being one (padding, trailing garbage) is dropped,
    as gzip(1) does."""

    def __init__(self, coding: str) -> None:
        self._raw_fallback = coding == "deflate"
        self._gzip = not self._raw_fallback
        self._zlib = zlib.decompressobj(_GZIP_WBITS if self._gzip else zlib.MAX_WBITS)
        self._later_member = False
        """Set once a gzip member after the first has begun: bytes that fail there are trailing."""
        self._trailing = False
        """Set once bytes after a whole gzip member are not a member: the rest is dropped."""

    def step(self, data: bytes) -> tuple[bytes, bytes]:
        """Up to `STEP_BYTES` decoded from `data`, and the input it left for the next step.
        `httpx.DecodingError` when the data is not of this coding."""
        if self._trailing:
            return b"", b""
        if self._gzip and self._zlib.eof and data:
            self._zlib = zlib.decompressobj(_GZIP_WBITS)
            self._later_member = True
        try:
            out = self._zlib.decompress(data, STEP_BYTES)
        except zlib.error as exc:
            if self._later_member:
                self._trailing = True
                return b"", b""
            if not self._raw_fallback:
                raise httpx.DecodingError(f"content decoding failed: {exc}") from None
            self._raw_fallback = False
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            return self.step(data)
        self._raw_fallback = False
        if self._gzip and self._zlib.eof:
            return out, self._zlib.unused_data  # the next member, if any
        return out, self._zlib.unconsumed_tail


def _layers(codings: Iterable[str]) -> list[_Layer]:
    """Decoders for `codings` (in `Content-Encoding` order), outermost first; empty when the
    body is to be kept as sent."""
    names = [name.strip().lower() for name in codings]
    names = [name for name in names if name not in ("", "identity")]
    if len(names) > MAX_CODINGS or any(name not in _DECODED for name in names):
        return []
    return [_Layer(name) for name in reversed(names)]


class BodyDecoder:
    """Decodes a body chunk by chunk, never holding more than asked for (see the module)."""

    def __init__(self, codings: Iterable[str]) -> None:
        """`codings`: the `Content-Encoding` values, in order of application."""
        self._layers = _layers(codings)

    def decode(self, chunk: bytes, room: int) -> bytes:
        """The next decoded bytes that `chunk` (as received) yields, at most `room` (>= 1). Less
        than `room` means all of `chunk` was decoded; exactly `room` means decoding may have
        stopped there, and the rest of the body is to be dropped, not decoded further."""
        if not self._layers:
            return chunk[:room]
        out = bytearray()
        self._pump(0, chunk, room, out.extend)
        return bytes(out)

    def _pump(self, depth: int, data: bytes, room: int, emit: Callable[[bytes], None]) -> int:
        """Feed `data` through the layers from `depth` on, emitting at most `room` final
        bytes; returns how many were emitted. Stops early once `room` is reached."""
        if depth == len(self._layers):
            emit(data[:room])
            return min(len(data), room)
        layer, emitted = self._layers[depth], 0
        while emitted < room:
            piece, data = layer.step(data)
            emitted += self._pump(depth + 1, piece, room - emitted, emit)
            if not data and len(piece) < STEP_BYTES:  # this layer is drained for now
                break
        return emitted
