"""Task definitions (DESIGN.md §2): the `TaskSpec` model, the `TaskFile` model, and pure helpers
deriving business dates, dedupe keys, instance ids and definition hashes.

Units: every duration field is float seconds; `scheduled_for_ms` is UTC epoch milliseconds;
times of day are local to `schedule.timezone`. Models are frozen and reject unknown fields.
A task that uses local-time rules (`not_before`, `off_peak`, a restricting `calendar`) must name
`schedule.timezone`; no host timezone and no silent UTC is ever assumed for them.
"""

from __future__ import annotations

import hashlib
import math
import re
import string
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Final, Literal
from zoneinfo import ZoneInfo

from pydantic import (
    BeforeValidator,
    Field,
    JsonValue,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from taskstream.core.durations import LeaseDuration, PositiveDuration
from taskstream.core.protocol import Priority
from taskstream.core.spec_parts import (
    Calendar,
    Catchup,
    Name,
    Names,
    Number,
    OffPeak,
    RetryPolicy,
    Schedule,
    SpecModel,
    TimeOfDay,
)
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.core.store.records import stored_json

ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"
DEFAULT_DEDUPE_KEY: Final = "{task_id}:{scheduled_for}"
MAX_DEDUPE_KEY_LEN: Final = 255
TIME_PLACEHOLDERS: Final = frozenset({"business_date", "scheduled_for"})
_PAYLOAD_FIELD: Final = re.compile(r"payload(?:\.[A-Za-z0-9_-]+)+")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

Placeholder = str
"""`task_id`, `business_date`, `scheduled_for` or `payload.<field>[.<field>...]`."""


def parse_dedupe_template(template: str) -> list[tuple[str, Placeholder | None]]:
    """Split a dedupe template into (literal text, placeholder or None) pieces.

    ValueError for unbalanced braces, format specs or conversions, and unknown placeholders.
    Literal braces are written `{{` and `}}`. A NUL character is refused: PostgreSQL's text
    cannot hold one, so no instance with such a key could ever be stored there.
    """
    if "\x00" in template:
        raise ValueError(f"invalid template {template!r}: holds a NUL character")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"invalid template {template!r}: {exc}") from None
    pieces: list[tuple[str, Placeholder | None]] = []
    for literal, field, spec, conversion in parsed:
        if field is not None:
            _check_placeholder(field, spec or conversion)
        pieces.append((literal, field))
    return pieces


def _check_placeholder(field: str, spec_or_conversion: str | None) -> None:
    if spec_or_conversion:
        raise ValueError(f"format specs are not supported: {{{field}...}}")
    known = field == "task_id" or field in TIME_PLACEHOLDERS
    if not known and not _PAYLOAD_FIELD.fullmatch(field):
        raise ValueError(
            f"unknown placeholder {{{field}}} (allowed: task_id, business_date, "
            "scheduled_for, payload.<field>)"
        )


def check_json_object(value: object) -> object:
    """Return `value` when it is a JSON object (str keys; finite numbers; no dates, sets, bytes)."""
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    _check_json(value, "")
    return value


def _check_json(value: object, path: str) -> None:
    where = f" at {path!r}" if path else ""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"keys must be strings, got {key!r}{where}")
            _check_json(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a JSON number{where}")
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise ValueError(
            f"{type(value).__name__} is not a JSON value{where} (quote dates and times)"
        )


class TaskSpec(SpecModel):
    """One task definition. Only `id` and `agent` are required.

    Seconds: `window` (start allowed until fire time + window), `deadline` (must finish by fire
    time + deadline), `timeout` (per attempt), `lease` (claim lease; see `effective_lease_s`).
    `review` is the fraction (0..1) of runs sampled for human review.
    """

    id: Annotated[str, StringConstraints(pattern=ID_PATTERN)]
    agent: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    schedule: Schedule | None = None
    window: PositiveDuration = 300.0
    deadline: PositiveDuration | None = None
    calendar: Calendar = Field(default_factory=Calendar)
    depends_on: Names = ()
    preconditions: Names = ()
    dedupe_key: str = Field(default=DEFAULT_DEDUPE_KEY, min_length=1, max_length=255)
    concurrency: Literal["forbid", "allow", "replace"] = "allow"
    catchup: Catchup = Field(default_factory=Catchup)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout: PositiveDuration = 60.0
    lease: LeaseDuration | None = None
    priority: Priority = Priority.DEFAULT
    not_before: TimeOfDay | None = None
    off_peak: OffPeak | None = None
    upstreams: Names = ()
    payload: Annotated[dict[str, JsonValue], BeforeValidator(check_json_object)] = Field(
        default_factory=dict
    )
    review: Number = Field(default=0.0, ge=0.0, le=1.0)

    @field_validator("dedupe_key")
    @classmethod
    def _dedupe_key_valid(cls, value: str, info: ValidationInfo) -> str:
        used = {field for _, field in parse_dedupe_template(value) if field is not None}
        schedule = info.data.get("schedule")
        scheduled = isinstance(schedule, Schedule) and schedule.kind != "on_demand"
        if scheduled and not used & TIME_PLACEHOLDERS:
            raise ValueError(
                "a scheduled task's key needs {scheduled_for} or {business_date}, "
                "else only its first fire could ever run"
            )
        return value

    @model_validator(mode="after")
    def _scheduled_key_renders(self) -> TaskSpec:
        """A scheduled task's instances carry its own payload: its dedupe key must render
        (every `{payload.<field>}` found, at most 255 characters), else no fire time could
        ever make an instance."""
        if self.schedule is not None and self.schedule.kind != "on_demand":
            render_dedupe_key(self, SAMPLE_FIRE_MS, self.payload)
        return self

    @field_validator("calendar", "not_before", "off_peak")
    @classmethod
    def _local_rules_need_timezone(cls, value: object, info: ValidationInfo) -> object:
        if "schedule" not in info.data or (isinstance(value, Calendar) and not value.restricts):
            return value
        schedule = info.data["schedule"]
        if value is not None and (schedule is None or schedule.timezone is None):
            raise ValueError("needs schedule.timezone: local times are never guessed")
        return value

    @property
    def timezone(self) -> str | None:
        """IANA zone of the task's local times and business date; None means UTC."""
        return None if self.schedule is None else self.schedule.timezone

    @property
    def effective_lease_s(self) -> float:
        """Claim lease in seconds: `lease`, or 2 x `timeout` + 30 when unset."""
        return self.lease if self.lease is not None else 2 * self.timeout + 30


def duplicate_ids(ids: Sequence[str | None]) -> dict[int, int]:
    """Map the index of every repeated id to the index of its first occurrence (None skipped)."""
    first: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for index, task_id in enumerate(ids):
        if task_id is None:
            continue
        if task_id in first:
            repeats[index] = first[task_id]
        else:
            first[task_id] = index
    return repeats


def undeclared_upstreams(spec: TaskSpec, declared: Mapping[str, object]) -> list[str]:
    """Upstream names `spec` uses that `declared` lacks; empty when nothing is declared."""
    if not declared:
        return []
    return [name for name in spec.upstreams if name not in declared]


class TaskFile(SpecModel):
    """A `tasks.yaml` document: tasks with unique ids, and optional shared upstream limits.

    When `upstreams` declares at least one limit, it is the complete list: every upstream a
    task names must be declared there. When it is empty, upstream names are not checked here
    (their limits come from elsewhere, e.g. the store or an agent's own declaration).
    """

    tasks: tuple[TaskSpec, ...]
    upstreams: dict[Name, UpstreamLimit] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> TaskFile:
        problems = [
            f"duplicate task id {self.tasks[i].id!r} (tasks #{first + 1} and #{i + 1})"
            for i, first in duplicate_ids([t.id for t in self.tasks]).items()
        ]
        for spec in self.tasks:
            problems.extend(
                f"task {spec.id!r} uses undeclared upstream {name!r}"
                for name in undeclared_upstreams(spec, self.upstreams)
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def business_date(scheduled_for: datetime, tz: str | None) -> str:
    """ISO date (`YYYY-MM-DD`) of the aware `scheduled_for` in zone `tz` (UTC when None)."""
    if scheduled_for.tzinfo is None or scheduled_for.utcoffset() is None:
        raise ValueError("scheduled_for must be timezone-aware")
    zone = ZoneInfo(tz) if tz is not None else UTC
    return scheduled_for.astimezone(zone).date().isoformat()


def format_utc_ms(epoch_ms: int) -> str:
    """`2026-11-30T09:00:00.000Z` for UTC epoch milliseconds, exact to the millisecond."""
    instant = _EPOCH + timedelta(milliseconds=epoch_ms)
    return f"{instant:%Y-%m-%dT%H:%M:%S}.{instant.microsecond // 1000:03d}Z"


def _payload_value(payload: Mapping[str, object], path: str) -> str:
    value: object = payload
    for part in path.split(".")[1:]:
        if not isinstance(value, Mapping) or part not in value:
            raise ValueError(f"dedupe_key: needs {{{path}}}, a field the payload does not have")
        value = value[part]
    if isinstance(value, str):
        return value
    return canonical_json(value)


SAMPLE_FIRE_MS: Final = 1_800_000_000_000
"""A fire time to render a key with at validation (every fire time renders as long)."""


def render_dedupe_key(spec: TaskSpec, scheduled_for_ms: int, payload: Mapping[str, object]) -> str:
    """Fill `spec.dedupe_key` for one fire time (UTC epoch ms) and payload.

    Non-string payload values render as canonical JSON. ValueError when a payload field is
    missing, the key is longer than 255 characters or holds a NUL (PostgreSQL refuses it).
    """
    values = {
        "task_id": spec.id,
        "scheduled_for": format_utc_ms(scheduled_for_ms),
        "business_date": business_date(
            _EPOCH + timedelta(milliseconds=scheduled_for_ms), spec.timezone
        ),
    }
    parts: list[str] = []
    for literal, field in parse_dedupe_template(spec.dedupe_key):
        parts.append(literal)
        if field is not None:
            parts.append(values[field] if field in values else _payload_value(payload, field))
    key = "".join(parts)
    if "\x00" in key:
        raise ValueError(
            "dedupe_key: renders with a NUL character (from the payload), which a store"
            " cannot keep in a key"
        )
    if len(key) > MAX_DEDUPE_KEY_LEN:
        raise ValueError(
            f"dedupe_key: renders to {len(key)} characters, over the limit of {MAX_DEDUPE_KEY_LEN}"
        )
    return key


def canonical_json(value: object) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 kept as is; the text a store
    keeps for the value (`stored_json`). Specs and payloads hold finite numbers only, so it
    never meets the NaN that `stored_json` refuses."""
    return stored_json(value)


def spec_hash(spec: TaskSpec) -> str:
    """sha256 hex of the canonical JSON of the spec (defaults included): changes iff it does."""
    dumped = spec.model_dump(mode="json")
    return hashlib.sha256(canonical_json(dumped).encode()).hexdigest()


INSTANCE_ID_LENGTH = 26
"""Characters in every instance id: `i_` and 24 hex digits."""


def instance_id_for(dedupe_key: str) -> str:
    """Instance id derived from its dedupe key: `i_` + first 24 hex chars of sha256(key)."""
    return "i_" + hashlib.sha256(dedupe_key.encode()).hexdigest()[:24]
