"""The wire: every Redis key, the consumer group, and the stream entry format.

Keys (all share one hash tag so a namespace lives in one Redis Cluster slot)::

    {prefix}:{{{namespace}}}:stream:high|default|low   work streams, one per priority
    {prefix}:{{{namespace}}}:dead                      dead-letter stream
    {prefix}:{{{namespace}}}:leader                    scheduler leader lease ("owner|token")
    {prefix}:{{{namespace}}}:leader:epoch              fencing token counter of the lease
    {prefix}:{{{namespace}}}:alive:{consumer}          executor liveness (short TTL)
    {prefix}:{{{namespace}}}:released:{instance}:{attempt}
                                                       a stopping executor's release of that
                                                       run, which the store could not take:
                                                       the lease owner's consumer name, and
                                                       for a run whose end the store did not
                                                       take "|" and that end's reason
                                                       ("owner|completed"); a day's TTL; the
                                                       sweeper makes the release
    {prefix}:{{{namespace}}}:limit:{upstream}          sliding-window limiter (sorted set)
    {prefix}:{{{namespace}}}:breaker:{upstream}        circuit breaker state (hash)
    {prefix}:{{{namespace}}}:control                   pub/sub channel: "something changed,
                                                       scheduler wake up" (definitions,
                                                       markers, retries); a hint, never data

Consumer group on every work stream: `executors`.

Work entry fields (flat strings, protocol version `v` = "1"):

    v                 protocol version
    instance_id       primary key of the instance row
    task_id           task definition id
    agent             agent name
    attempt           attempt the entry was emitted for (the claim makes attempt + 1)
    scheduled_for_ms  fire time, UTC epoch milliseconds
    emitted_at_ms     publish time, UTC epoch milliseconds
    trace_id          opaque correlation id
    redeliveries      deliveries of this attempt on the entries this one replaced (only on an
                      entry the sweeper published again; absent means 0)

The payload never travels in the stream; it stays in the store. Dead-letter entries carry
`reason`, `detail`, `source_stream`, `source_id` and the original fields prefixed `orig.`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from taskstream.core.errors import ProtocolError

PROTOCOL_VERSION: Final = "1"
GROUP: Final = "executors"
MAX_ENTRY_BYTES: Final = 4096
"""An entry larger than this is not ours: entries are ids and numbers only."""
RELEASED_TTL_S: Final = 86_400
"""How long a `Keys.released` note lives (s): a sweeper needs it from the stopped executor's
exit until the store answers again, so it outlasts any store outage worth waiting out; after
it, the run is timed out as a lost owner's."""


def release_note(owner: str, lost_end: str | None = None) -> str:
    """The value of a `Keys.released` note: the lease owner's consumer name `owner`, and for a
    run that ended but whose end the store did not take, `|` and that end's reason
    (`lost_end`, e.g. `completed`). Consumer names (`host:pid:start`) hold no `|`."""
    return owner if lost_end is None else f"{owner}|{lost_end}"


def read_release_note(value: str) -> tuple[str, str | None]:
    """(owner, lost end's reason or None) of a `Keys.released` note (`release_note`)."""
    owner, _, lost_end = value.partition("|")
    return owner, lost_end or None


class Priority(StrEnum):
    """Work stream priority; executors read higher first."""

    HIGH = "high"
    DEFAULT = "default"
    LOW = "low"

    @classmethod
    def of(cls, value: str) -> Priority:
        """The priority named `value`; a ValueError that names the field otherwise."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"priority: {value!r} is not one of {names}") from None


PRIORITY_ORDER: Final = (Priority.HIGH, Priority.DEFAULT, Priority.LOW)
_DEFAULT_FIRST: Final = (Priority.DEFAULT, Priority.HIGH, Priority.LOW)
_LOW_FIRST: Final = (Priority.LOW, Priority.HIGH, Priority.DEFAULT)


def read_order(turn: int) -> tuple[Priority, ...]:
    """Which streams a consumer reads first on its `turn`-th read (pure).

    Higher priority is preferred without starving lower ones: of every 10 turns, 7 start with
    `high`, 2 with `default` and 1 with `low`, so a backlogged `low` stream still gets at
    least a tenth of the reads.
    """
    slot = turn % 10
    if slot == 9:
        return _LOW_FIRST
    if slot in (3, 6):
        return _DEFAULT_FIRST
    return PRIORITY_ORDER


@dataclass(frozen=True, slots=True)
class Keys:
    """Builds every Redis key of one namespace. The only place key strings are made."""

    prefix: str = "ts"
    namespace: str = "default"

    @property
    def base(self) -> str:
        """Common prefix with the hash tag, e.g. `ts:{default}`."""
        return f"{self.prefix}:{{{self.namespace}}}"

    def stream(self, priority: Priority) -> str:
        return f"{self.base}:stream:{priority.value}"

    def streams(self, order: tuple[Priority, ...] = PRIORITY_ORDER) -> list[str]:
        """Work streams, in `order` (highest priority first by default)."""
        return [self.stream(p) for p in order]

    @property
    def dead(self) -> str:
        return f"{self.base}:dead"

    @property
    def leader(self) -> str:
        return f"{self.base}:leader"

    @property
    def leader_epoch(self) -> str:
        return f"{self.base}:leader:epoch"

    @property
    def control(self) -> str:
        return f"{self.base}:control"

    def alive(self, consumer: str) -> str:
        return f"{self.base}:alive:{consumer}"

    def alive_of(self, consumer: bytes) -> bytes:
        """`alive` of a consumer name as Redis holds it, bytes that need not be UTF-8 (a
        name some other program gave a consumer of the group)."""
        return f"{self.base}:alive:".encode() + consumer

    def released(self, instance_id: str, attempt: int) -> str:
        """A stopping executor's note that it released the run of `instance_id` at `attempt`
        (its fencing token) while the store could not take the release, or the run's end
        (`release_note`)."""
        return f"{self.base}:released:{instance_id}:{attempt}"

    def limiter(self, upstream: str) -> str:
        return f"{self.base}:limit:{upstream}"

    def breaker(self, upstream: str) -> str:
        return f"{self.base}:breaker:{upstream}"


INSTANCE_ID_MAX = 128
"""Longest instance id an entry may name (characters)."""


class WorkEntry(BaseModel):
    """One unit of work on a stream. Small and flat; validated on both ends."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    v: str = PROTOCOL_VERSION
    instance_id: str = Field(min_length=1, max_length=INSTANCE_ID_MAX)
    task_id: str = Field(min_length=1, max_length=200)
    agent: str = Field(min_length=1, max_length=200)
    attempt: int = Field(ge=0)
    scheduled_for_ms: int = Field(ge=0)
    emitted_at_ms: int = Field(ge=0)
    trace_id: str = Field(default="", max_length=128)
    redeliveries: int = Field(default=0, ge=0)
    """Deliveries of this attempt on earlier entries, which the sweeper replaced by this one
    (a consumer that read them died before its claim): they count towards `max_deliveries`."""


_INT_FIELDS: Final = ("attempt", "scheduled_for_ms", "emitted_at_ms", "redeliveries")


def encode(entry: WorkEntry) -> dict[str, str]:
    """Entry -> flat string fields for XADD. `redeliveries` is written only when not 0, so a
    first entry has exactly the fields of protocol version 1 before the field existed."""
    fields = {name: str(value) for name, value in entry.model_dump().items()}
    if not entry.redeliveries:
        del fields["redeliveries"]
    return fields


RawFields = Mapping[Any, Any]
"""Fields as read from Redis (bytes) or built in tests (str); `decode` checks every one."""


def _wire_size(value: bytes | str) -> int:
    """Bytes `value` takes in an entry: its length as read from Redis, UTF-8 for text."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(value)


def _size(raw: RawFields) -> int:
    """Bytes of an entry's names and values (`_wire_size`). One loop without calls for the
    bytes Redis returns: it runs for every entry read."""
    size = 0
    for k, v in raw.items():
        size += len(k) if type(k) is bytes else _wire_size(k)
        size += len(v) if type(v) is bytes else _wire_size(v)
    return size


def _text(raw: RawFields) -> dict[str, str]:
    """Fields as text. Their size (names and values, bytes) is checked against
    `MAX_ENTRY_BYTES` before anything is decoded, so a large entry costs no copies."""
    size = _size(raw)
    if size > MAX_ENTRY_BYTES:
        raise ProtocolError("oversize", f"{size} bytes > {MAX_ENTRY_BYTES}")
    out: dict[str, str] = {}
    try:
        for k, v in raw.items():
            key = k.decode() if isinstance(k, bytes) else k
            out[key] = v.decode() if isinstance(v, bytes) else v
    except UnicodeDecodeError as exc:
        raise ProtocolError("bad_encoding", str(exc)) from exc
    return out


def decode(raw: RawFields) -> WorkEntry:
    """Stream fields -> entry. Raises `ProtocolError` with a reason; never anything else.

    A value holding a NUL is a bad field: no id or name of ours holds one, and PostgreSQL's
    text refuses it, so the store could not even look its instance up (the sweeper's pass,
    or an executor's whole batch, would fail on the refusal instead of dead-lettering it)."""
    fields = _text(raw)
    version = fields.get("v")
    if version is None:
        raise ProtocolError("missing_version")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("unknown_version", version)
    for name, value in fields.items():
        if "\x00" in value:
            raise ProtocolError("bad_field", f"{name[:40]!r} holds a NUL")
    values: dict[str, object] = dict(fields)
    for name in _INT_FIELDS:
        text = fields.get(name)
        if text is not None:
            # ASCII digits only: `isdigit` also accepts digits such as "²" that `int` refuses.
            if not (text.isascii() and text.isdigit()):
                raise ProtocolError("bad_field", f"{name}={text[:40]!r}")
            values[name] = int(text)
    try:
        return WorkEntry.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError("bad_field", f"{where}: {first['msg']}") from exc


DEAD_MAX_FIELDS = 64
DEAD_MAX_NAME = 200
"""Bounds on what a dead letter keeps of its entry: fields, and bytes of a name."""


def dead_fields(
    raw: RawFields, *, reason: str, detail: str, stream: str, entry_id: str
) -> dict[str | bytes, str | bytes]:
    """Fields of a dead-letter entry: why, where from, and the original fields, each under
    `orig.` and its name, as the bytes they were (not decoded: a bad encoding is kept as it
    came). A poison entry's size is bounded (`DEAD_MAX_FIELDS` fields, names of
    `DEAD_MAX_NAME` bytes, values of `MAX_ENTRY_BYTES`); `cut` then counts the fields
    dropped or shortened, so a letter says when it is not the whole entry."""
    out: dict[str | bytes, str | bytes] = {
        "reason": reason,
        "detail": detail[:500],
        "source_stream": stream,
        "source_id": entry_id,
    }
    kept: dict[str | bytes, str | bytes] = {}
    cut = 0
    for k, v in raw.items():
        name = b"orig." + (k if isinstance(k, bytes) else str(k).encode())
        value = v if isinstance(v, bytes) else str(v).encode()
        if len(kept) == DEAD_MAX_FIELDS or name[:DEAD_MAX_NAME] in kept:
            cut += 1
            continue
        cut += len(name) > DEAD_MAX_NAME or len(value) > MAX_ENTRY_BYTES
        kept[name[:DEAD_MAX_NAME]] = value[:MAX_ENTRY_BYTES]
    out.update(kept)
    if cut:
        out["cut"] = str(cut)
    return out
