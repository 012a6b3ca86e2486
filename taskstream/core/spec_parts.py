"""Building blocks of a task definition: schedule, calendar, catch-up and retry (an upstream's
limit and breaker are in `spec_upstreams`).

Every model is frozen and forbids unknown fields. Durations are float seconds (see
`taskstream.core.durations`); times of day are `datetime.time` read from `"HH:MM"` strings and
are local to the task's `schedule.timezone`. Time ranges (`start`, `end`) whose end is earlier
than their start wrap past midnight; equal start and end are rejected.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from datetime import date, time
from typing import Annotated, Final, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from taskstream.core.cron import check_cron
from taskstream.core.durations import Duration, PositiveDuration

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"
"""Readiness markers, preconditions and upstreams: e.g. `raw_data.ready`, `openai`."""
MAX_ATTEMPTS: Final = 10_000
"""The most attempts a task may allow (the store keeps attempts in a 32-bit column)."""

_TIME_OF_DAY: Final = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::00)?")

T = TypeVar("T", bound=Hashable)


class SpecModel(BaseModel):
    """Base of every task-definition model: immutable, unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def unique_items(values: tuple[T, ...]) -> tuple[T, ...]:
    """Return `values` unchanged; ValueError naming the first item listed twice."""
    seen: set[T] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{value!r} is listed more than once")
        seen.add(value)
    return values


def check_timezone(name: str) -> str:
    """Return `name` when it is an IANA zone ZoneInfo can load; never the host's `localtime`."""
    if name.strip().lower() == "localtime":
        raise ValueError("unknown timezone 'localtime': name an IANA zone such as 'Europe/Berlin'")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r}") from None
    return name


def not_a_bool(value: object) -> object:
    """Return `value` unless it is a YAML boolean: a number field would read `true` as 1."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


Count = Annotated[int, BeforeValidator(not_a_bool)]
"""A whole number that is never read from `true` / `false`."""
Number = Annotated[float, BeforeValidator(not_a_bool)]
"""A number that is never read from `true` / `false`."""


def parse_time_of_day(value: object) -> time:
    """Read a local time of day from `"HH:MM"` (00:00 to 23:59) or a plain `time`.

    `"HH:MM:00"` is accepted too, so that JSON dumps of older records still load.
    """
    if isinstance(value, time):
        if value.tzinfo is not None or value.second or value.microsecond:
            raise ValueError(f"time of day {value} must be whole minutes with no timezone")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(
            f'expected a quoted "HH:MM" string, got the number {value} '
            "(YAML reads an unquoted 9:30 as the number 570)"
        )
    if not isinstance(value, str):
        raise ValueError(f'expected "HH:MM", got {value!r}')
    match = _TIME_OF_DAY.fullmatch(value.strip())
    if match is None:
        raise ValueError(f'invalid time of day {value!r}: expected "HH:MM" from 00:00 to 23:59')
    return time(int(match.group(1)), int(match.group(2)))


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _format_time_of_day(value: time) -> str:
    return f"{value:%H:%M}"


TimeOfDay = Annotated[
    time,
    BeforeValidator(parse_time_of_day),
    PlainSerializer(_format_time_of_day, return_type=str, when_used="json"),
]
"""Field type: local time of day, whole minutes; dumps to JSON as `"HH:MM"`."""
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Names = Annotated[tuple[Name, ...], AfterValidator(unique_items)]
Weekday = Annotated[
    Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], BeforeValidator(_lower)
]


class DstPolicy(SpecModel):
    """What a cron does around DST changes in its timezone.

    `gap`: a local fire time that does not exist (clocks jump forward) is `shift`ed to the first
    valid instant after the gap, or `skip`ped. `fold`: a local fire time that occurs twice
    (clocks fall back) fires on the `first` occurrence only, or on `both`.
    """

    gap: Literal["shift", "skip"] = "shift"
    fold: Literal["first", "both"] = "first"


class Schedule(SpecModel):
    """When a task fires: `cron` in `timezone`, or `every` N seconds; neither means on demand.

    `timezone` is required with `cron` and is never taken from the host.
    """

    cron: str | None = None
    every: PositiveDuration | None = None
    timezone: str | None = Field(default=None, validate_default=True)
    dst: DstPolicy = Field(default_factory=DstPolicy)

    @field_validator("cron")
    @classmethod
    def _cron_valid(cls, value: str | None) -> str | None:
        return None if value is None else check_cron(value)

    @field_validator("every")
    @classmethod
    def _not_both(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("cron") is not None:
            raise ValueError("cannot be combined with cron: choose cron or every")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone_valid(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            if info.data.get("cron") is not None:
                raise ValueError("field required when cron is set (the host timezone is not used)")
            return None
        return check_timezone(value)

    @property
    def kind(self) -> Literal["cron", "every", "on_demand"]:
        """Which trigger this schedule uses."""
        if self.cron is not None:
            return "cron"
        return "every" if self.every is not None else "on_demand"

    @property
    def cron_has_seconds(self) -> bool:
        """True for a six-field cron; pass `second_at_beginning=True` to croniter either way."""
        return self.cron is not None and len(self.cron.split()) == 6


class TimeRange(SpecModel):
    """A local time-of-day range `[start, end)`; wraps past midnight when end < start."""

    start: TimeOfDay
    end: TimeOfDay

    @model_validator(mode="after")
    def _not_empty(self) -> TimeRange:
        if self.start == self.end:
            raise ValueError("start and end must differ")
        return self


class MaintenanceWindow(TimeRange):
    """No run starts inside this range; `days` limits it to some weekdays (None = every day)."""

    days: Annotated[tuple[Weekday, ...], AfterValidator(unique_items)] | None = None


class OffPeak(TimeRange):
    """Deferrable runs wait until the local time is inside this range."""


def no_numbers(values: object) -> object:
    """Dates are written YYYY-MM-DD: a number among them would be read as a Unix timestamp
    (`0` as 1970-01-01), so it is refused."""
    if isinstance(values, list | tuple):
        for value in values:
            if isinstance(value, int | float):  # bool is an int too
                raise ValueError(f"{value!r} is a number, not a date: write dates as YYYY-MM-DD")
    return values


class Calendar(SpecModel):
    """Days and hours on which a run may start, read in the task's timezone."""

    allow_weekend: bool = True
    exclude_dates: Annotated[
        tuple[date, ...], BeforeValidator(no_numbers), AfterValidator(unique_items)
    ] = ()
    maintenance: tuple[MaintenanceWindow, ...] = ()

    @property
    def restricts(self) -> bool:
        """True when any rule can hold a run back (and so needs a timezone)."""
        return not self.allow_weekend or bool(self.exclude_dates or self.maintenance)


class Catchup(SpecModel):
    """Missed fire times after downtime: older than `max_delay` seconds become SKIPPED/missed.

    `mode="latest"` runs only the newest missed tick; `"all"` runs each one.
    """

    enabled: bool = True
    max_delay: Duration = 3600.0
    mode: Literal["latest", "all"] = "latest"
    only_if_ready: bool = False


class Backoff(SpecModel):
    """Delay before attempt n+1: `min(max, base * factor**(n-1))` seconds, before jitter."""

    base: PositiveDuration = 1.0
    factor: Number = Field(default=2.0, ge=1.0, le=1000.0, allow_inf_nan=False)
    max: PositiveDuration = 300.0

    @model_validator(mode="after")
    def _max_not_below_base(self) -> Backoff:
        # After the model, not on the field: a `max` left at its default is checked too.
        if self.max < self.base:
            given = "" if "max" in self.model_fields_set else " (the default); set max"
            raise ValueError(f"max must be >= base ({self.base:g}s), got {self.max:g}s{given}")
        return self


class RetryPolicy(SpecModel):
    """Attempts per instance (never reset by a new cycle) and which failure classes retry.

    `jitter` is the fraction (0..1) of each delay that is randomised.
    """

    max_attempts: Count = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    backoff: Backoff = Field(default_factory=Backoff)
    jitter: Number = Field(default=0.1, ge=0.0, le=1.0)
    retry_on: Annotated[
        tuple[Literal["retriable", "timeout"], ...], AfterValidator(unique_items)
    ] = ("retriable", "timeout")
