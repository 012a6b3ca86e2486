"""Payloads entering from outside: strict JSON objects, and the payload size limit.

A payload's size is that of the text a store keeps for it (`stored_json`: sorted keys, no
whitespace, non-ASCII kept as is) in UTF-8 bytes: the measure by which an executor poisons a
run whose payload is over `Settings.max_payload_bytes` (`payload_too_large`). `tasks
validate`, `tasks apply` and `trigger --payload` check it with `payload_problem`, so such a
payload is refused before anything is stored rather than failing every run later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from taskstream.core.store.records import stored_json, utf8_size


def payload_problem(payload: Mapping[str, object], limit_bytes: int) -> str | None:
    """Why `payload` cannot be stored and run, or None.

    Over `limit_bytes` (UTF-8 bytes of its stored JSON), holding a lone surrogate, which is
    not Unicode text, or a number JSON cannot hold (infinity, NaN), or nested deeper than
    JSON can be written. The text reads after `payload: ` and holds both sizes.
    """
    try:
        text = stored_json(payload)
    except ValueError as exc:  # infinity or NaN from YAML, an int past Python's digit limit
        return f"holds a value JSON cannot hold: {str(exc)[:200]}"
    except RecursionError:
        return "is nested too deeply to be stored as JSON"
    try:
        size = utf8_size(text)
    except UnicodeEncodeError as exc:
        bad = ascii(text[exc.start])
        return f"holds the lone surrogate {bad}, which is not Unicode text"
    if size > limit_bytes:
        return (
            f"{size} bytes as stored JSON, over the limit of {limit_bytes} bytes "
            "(TASKSTREAM_MAX_PAYLOAD_BYTES)"
        )
    return None


def no_json_constant(name: str) -> None:
    """`parse_constant` for `json.loads`: `NaN`, `Infinity` and `-Infinity` are refused
    (ValueError), since no store keeps them."""
    raise ValueError(f"{name} is not a JSON number")


def finite_json_number(digits: str) -> float:
    """`parse_float` for `json.loads`: ValueError for a number beyond the float range
    (`1e999`), which would otherwise parse as infinity, which no store keeps."""
    number = float(digits)
    if not math.isfinite(number):
        raise ValueError(f"{digits[:40]} is too large for a JSON number")
    return number


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object `text` holds.

    ValueError naming what is wrong: not JSON, `NaN` or `Infinity`, a key given twice in one
    object (JSON parsers differ on which one wins, so neither is guessed), or not an object.
    """

    try:
        value = json.loads(
            text,
            parse_constant=no_json_constant,
            parse_float=finite_json_number,
            object_pairs_hook=_unique_keys,
        )
    except _DuplicateKey as exc:
        raise ValueError(str(exc)) from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object ({...})")
    return value


class _DuplicateKey(ValueError):
    """A JSON object names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(
                f"duplicate key {json.dumps(key)}: a JSON object may name each key once"
            )
        out[key] = value
    return out
