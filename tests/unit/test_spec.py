"""Task definition models and the pure helpers derived from them."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time
from typing import Any

import pytest
from croniter import croniter
from pydantic import ValidationError

from taskstream.core.protocol import Priority
from taskstream.core.spec import (
    TaskFile,
    TaskSpec,
    business_date,
    format_utc_ms,
    instance_id_for,
    render_dedupe_key,
    spec_hash,
)
from taskstream.core.spec_parts import Schedule
from taskstream.scheduler.instances import trigger_of
from taskstream.scheduler.ticks import fire_times

NOV_30_0900_UTC_MS = 1_796_029_200_000
BERLIN = {"timezone": "Europe/Berlin"}


def make(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"id": "t", "agent": "echo", **fields})


def problems(**fields: Any) -> list[tuple[str, str]]:
    """(dotted location, message) of every validation error of a task with `fields`."""
    with pytest.raises(ValidationError) as caught:
        make(**fields)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in caught.value.errors()]


def test_defaults() -> None:
    spec = make()
    assert spec.schedule is None
    assert (spec.window, spec.deadline, spec.timeout, spec.lease) == (300.0, None, 60.0, None)
    assert spec.effective_lease_s == 150.0
    assert spec.priority is Priority.DEFAULT
    assert spec.concurrency == "allow"
    assert spec.dedupe_key == "{task_id}:{scheduled_for}"
    assert (spec.catchup.enabled, spec.catchup.max_delay, spec.catchup.mode) == (
        True,
        3600.0,
        "latest",
    )
    assert spec.retry.max_attempts == 3
    assert (spec.retry.backoff.base, spec.retry.backoff.factor, spec.retry.backoff.max) == (
        1.0,
        2.0,
        300.0,
    )
    assert spec.retry.retry_on == ("retriable", "timeout")
    assert (spec.review, spec.payload, spec.timezone) == (0.0, {}, None)


@pytest.mark.parametrize(
    ("fields", "lease_s"),
    [({"timeout": "10s"}, 50.0), ({"timeout": "10s", "lease": "5m"}, 300.0)],
)
def test_effective_lease(fields: dict[str, Any], lease_s: float) -> None:
    assert make(**fields).effective_lease_s == lease_s


@pytest.mark.parametrize("task_id", ["a", "daily-report", "etl.raw_data:v2", "9lives", "x" * 200])
def test_valid_ids(task_id: str) -> None:
    assert make(id=task_id).id == task_id


@pytest.mark.parametrize("task_id", ["", "-lead", "has space", "a/b", "x" * 201, "é"])
def test_invalid_ids(task_id: str) -> None:
    assert [loc for loc, _ in problems(id=task_id)] == ["id"]


@pytest.mark.parametrize(
    ("cron", "after", "first_fire"),
    [
        ("0 0 9 * * *", datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 11, 30, 9, tzinfo=UTC)),
        ("30 15 9 * * *", datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 11, 30, 9, 15, 30)),
        ("0 9 * * *", datetime(2026, 11, 30, 10, tzinfo=UTC), datetime(2026, 12, 1, 9)),
    ],
)
def test_cron_seconds_come_first(cron: str, after: datetime, first_fire: datetime) -> None:
    schedule = make(schedule={"cron": cron, "timezone": "UTC"}).schedule
    assert schedule is not None and schedule.cron == cron
    assert schedule.cron_has_seconds == (len(cron.split()) == 6)
    fire = croniter(schedule.cron, after, second_at_beginning=True).get_next(datetime)
    assert fire == first_fire.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "kind"),
    [
        ({"cron": "0 9 * * *", **BERLIN}, "cron"),
        ({"every": "10s"}, "every"),
        ({"every": 10, "timezone": "UTC"}, "every"),
        (BERLIN, "on_demand"),
        ({}, "on_demand"),
    ],
)
def test_schedule_kinds(schedule: dict[str, Any], kind: str) -> None:
    assert Schedule.model_validate(schedule).kind == kind


@pytest.mark.parametrize(
    ("schedule", "location", "fragment"),
    [
        ({"cron": "0 9 * * *", "every": "1h", **BERLIN}, "schedule.every", "cannot be combined"),
        ({"cron": "0 9 * * *"}, "schedule.timezone", "required when cron is set"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Base"}, "schedule.timezone", "'Mars/Base'"),
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "schedule.timezone", "'localtime'"),
        ({"cron": "0 9 * *", **BERLIN}, "schedule.cron", "expected 5 fields"),
        ({"cron": "0 0 9 * * * 2026", **BERLIN}, "schedule.cron", "(got 7)"),
        ({"cron": "@daily", **BERLIN}, "schedule.cron", "expected 5 fields"),
        ({"cron": "61 * * * *", **BERLIN}, "schedule.cron", "invalid cron expression '61"),
        ({"cron": "0 0 30 2 *", **BERLIN}, "schedule.cron", "never fires"),
        ({"cron": "R * * * *", **BERLIN}, "schedule.cron", "'R' (a random value)"),
        ({"cron": "0 r(0-5) * * *", **BERLIN}, "schedule.cron", "'r(0-5)' (a random value)"),
        ({"cron": "0 9 * * 1,R/2", **BERLIN}, "schedule.cron", "'R/2' (a random value)"),
        ({"cron": "H * * * *", **BERLIN}, "schedule.cron", "'H' (a hashed value)"),
        ({"every": "0s"}, "schedule.every", "greater than 0"),
        ({"every": "-1m"}, "schedule.every", "negative"),
        ({"dst": {"gap": "jump"}, **BERLIN}, "schedule.dst.gap", "'shift' or 'skip'"),
        ({"crn": "0 9 * * *"}, "schedule.crn", "Extra inputs"),
    ],
)
def test_schedule_rejections(schedule: dict[str, Any], location: str, fragment: str) -> None:
    [(loc, message)] = problems(schedule=schedule)
    assert loc == location
    assert fragment in message


@pytest.mark.parametrize(
    ("fields", "location", "fragment"),
    [
        ({"dedupe_key": "{task_id}:{when}"}, "dedupe_key", "unknown placeholder {when}"),
        ({"dedupe_key": "{payload[x]}:{scheduled_for}"}, "dedupe_key", "unknown placeholder"),
        ({"dedupe_key": "{scheduled_for:%Y}"}, "dedupe_key", "format specs"),
        ({"dedupe_key": "{task_id"}, "dedupe_key", "invalid template"),
        ({"dedupe_key": "{}"}, "dedupe_key", "unknown placeholder {}"),
        ({"dedupe_key": "{task_id}\x00"}, "dedupe_key", "NUL character"),
        (
            {"dedupe_key": "{task_id}", "schedule": {"every": "1h"}},
            "dedupe_key",
            "needs {scheduled_for} or {business_date}",
        ),
        ({"not_before": "09:00"}, "not_before", "needs schedule.timezone"),
        ({"off_peak": {"start": "22:00", "end": "06:00"}}, "off_peak", "needs schedule.timezone"),
        ({"calendar": {"allow_weekend": False}}, "calendar", "needs schedule.timezone"),
        ({"not_before": 570, "schedule": BERLIN}, "not_before", "quoted"),
        ({"not_before": "24:00", "schedule": BERLIN}, "not_before", "invalid time of day"),
        ({"off_peak": {"start": "01:00", "end": "1:00"}, "schedule": BERLIN}, "off_peak", "differ"),
        ({"payload": {"when": date(2026, 1, 1)}}, "payload", "date is not a JSON value"),
        ({"payload": {"x": [1, math.nan]}}, "payload", "at 'x[1]'"),
        ({"payload": {1: "one"}}, "payload", "keys must be strings"),
        ({"payload": {"tags": {"a", "b"}}}, "payload", "set is not a JSON value"),
        ({"payload": ["a"]}, "payload", "must be a mapping"),
        ({"retry": {"backoff": {"base": "1m", "max": "10s"}}}, "retry.backoff", "max must be >="),
        ({"retry": {"backoff": {"base": "10m"}}}, "retry.backoff", "300s (the default); set max"),
        ({"retry": {"max_attempts": 0}}, "retry.max_attempts", "greater than or equal to 1"),
        ({"retry": {"jitter": 1.5}}, "retry.jitter", "less than or equal to 1"),
        ({"retry": {"retry_on": ["fatal"]}}, "retry.retry_on.0", "'retriable' or 'timeout'"),
        ({"depends_on": ["raw.ready", "raw.ready"]}, "depends_on", "listed more than once"),
        ({"depends_on": ["bad marker"]}, "depends_on.0", "should match pattern"),
        ({"concurrency": "queue"}, "concurrency", "'forbid', 'allow' or 'replace'"),
        ({"priority": "urgent"}, "priority", "'high', 'default' or 'low'"),
        ({"review": 2}, "review", "less than or equal to 1"),
        (
            {
                "schedule": {"every": "1h"},
                "dedupe_key": "{task_id}:{scheduled_for}:{payload.region}",
                "payload": {"other": 1},
            },
            "",
            "Value error, dedupe_key: needs {payload.region}, a field the payload does not have",
        ),
        (
            {"schedule": {"every": "1h"}, "dedupe_key": "{scheduled_for}" + "x" * 240},
            "",
            "Value error, dedupe_key: renders to 264 characters, over the limit of 255",
        ),
        ({"timeout": 0}, "timeout", "greater than 0"),
        ({"timeout": 0.0009}, "timeout", "too short: at least 1ms"),
        ({"lease": "500ms"}, "lease", "too short: at least 1s"),
        ({"calendar": {"exclude_dates": [0]}}, "calendar.exclude_dates", "a number, not a date"),
        ({"timeout": 1.0e300}, "timeout", "too long: at most 3650d"),
        ({"deadline": 1.0e20}, "deadline", "too long: at most 3650d"),
        ({"schedule": {"every": "0.4ms"}}, "schedule.every", "too short: at least 1ms"),
        ({"retry": {"max_attempts": 10**23}}, "retry.max_attempts", "less than or equal to 10000"),
        ({"retry": {"backoff": {"factor": 1.0e300}}}, "retry.backoff.factor", "less than or equal"),
        ({"agent": ""}, "agent", "at least 1 character"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_task_rejections(fields: dict[str, Any], location: str, fragment: str) -> None:
    [(loc, message)] = problems(**fields)
    assert loc == location
    assert fragment in message


def test_full_spec_round_trips_through_json() -> None:
    spec = make(
        schedule={"cron": "0 0 9 * * MON-FRI", **BERLIN, "dst": {"gap": "skip", "fold": "both"}},
        window="15m",
        deadline="2h",
        calendar={
            "allow_weekend": False,
            "exclude_dates": ["2026-12-25", date(2026, 12, 26)],
            "maintenance": [{"start": "23:00", "end": "01:30", "days": ["Sun", "sat"]}],
        },
        depends_on=["raw_data.ready"],
        preconditions=["api.reachable"],
        dedupe_key="{task_id}:{business_date}:{payload.region}",
        concurrency="forbid",
        catchup={"enabled": True, "max_delay": "1h", "mode": "all", "only_if_ready": True},
        retry={"max_attempts": 5, "backoff": {"base": "2s", "factor": 3, "max": "1m"}},
        lease="10m",
        priority="high",
        not_before="7:05",
        off_peak={"start": "22:00", "end": "06:00"},
        upstreams=["openai"],
        payload={"region": "eu", "limits": {"n": 3, "ok": True, "none": None}},
        review=0.25,
    )
    assert spec.not_before == time(7, 5)
    assert spec.calendar.maintenance[0].days == ("sun", "sat")
    dumped = spec.model_dump(mode="json")
    assert dumped["not_before"] == "07:05"
    again = TaskSpec.model_validate(dumped)
    assert again == spec
    assert spec_hash(again) == spec_hash(spec)


def test_specs_are_frozen() -> None:
    spec = make()
    with pytest.raises(ValidationError, match="frozen"):
        spec.timeout = 5.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "change", [{"timeout": "61s"}, {"payload": {"a": 1}}, {"priority": "low"}, {"agent": "sleep"}]
)
def test_spec_hash_follows_content(change: dict[str, Any]) -> None:
    base = spec_hash(make())
    assert base == spec_hash(make())
    assert len(base) == 64
    assert spec_hash(make(**change)) != base


@pytest.mark.parametrize(
    ("instant", "tz", "expected"),
    [
        (datetime(2026, 11, 30, 23, 30, tzinfo=UTC), "Europe/Berlin", "2026-12-01"),
        (datetime(2026, 11, 30, 23, 30, tzinfo=UTC), None, "2026-11-30"),
        (datetime(2026, 12, 1, 3, 0, tzinfo=UTC), "America/New_York", "2026-11-30"),
        (datetime(2026, 12, 31, 12, 0, tzinfo=UTC), "Pacific/Kiritimati", "2027-01-01"),
    ],
)
def test_business_date(instant: datetime, tz: str | None, expected: str) -> None:
    assert business_date(instant, tz) == expected


def test_business_date_needs_an_aware_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        business_date(datetime(2026, 11, 30, 9), None)


@pytest.mark.parametrize(
    ("epoch_ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (NOV_30_0900_UTC_MS, "2026-11-30T09:00:00.000Z"),
        (NOV_30_0900_UTC_MS + 7, "2026-11-30T09:00:00.007Z"),
        (NOV_30_0900_UTC_MS + 59_999, "2026-11-30T09:00:59.999Z"),
    ],
)
def test_format_utc_ms(epoch_ms: int, text: str) -> None:
    assert format_utc_ms(epoch_ms) == text


@pytest.mark.parametrize(
    ("fields", "payload", "key"),
    [
        ({}, {}, "t:2026-11-30T09:00:00.000Z"),
        (
            {
                "dedupe_key": "{task_id}:{business_date}",
                "schedule": {"timezone": "Pacific/Pago_Pago"},
            },
            {},
            "t:2026-11-29",
        ),
        ({"dedupe_key": "{payload.region}/{payload.n}"}, {"region": "eu", "n": 3}, "eu/3"),
        ({"dedupe_key": "{payload.a.b}"}, {"a": {"b": [1, "x"]}}, '[1,"x"]'),
        ({"dedupe_key": "{{{task_id}}}"}, {}, "{t}"),
    ],
)
def test_render_dedupe_key(fields: dict[str, Any], payload: dict[str, Any], key: str) -> None:
    assert render_dedupe_key(make(**fields), NOV_30_0900_UTC_MS, payload) == key


@pytest.mark.parametrize(
    ("template", "payload", "fragment"),
    [
        ("{payload.region}", {}, "dedupe_key: needs {payload.region}, a field the payload"),
        ("{payload.a.b}", {"a": "flat"}, "needs {payload.a.b}, a field the payload does not"),
        ("{payload.blob}:{scheduled_for}", {"blob": "x" * 250}, "over the limit of 255"),
        ("{payload.region}", {"region": "eu\x00"}, "dedupe_key: renders with a NUL character"),
    ],
)
def test_render_dedupe_key_failures(template: str, payload: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        render_dedupe_key(make(dedupe_key=template), NOV_30_0900_UTC_MS, payload)


def test_instance_ids_come_from_the_dedupe_key() -> None:
    key = "daily-report:2026-11-30T09:00:00.000Z"
    assert instance_id_for(key) == "i_8eff87a5b64be7d07f7ce8a3"
    assert instance_id_for(key + "x") != instance_id_for(key)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"tasks": [{"id": "a", "agent": "echo"}, {"id": "a", "agent": "x"}]}, "'a'"),
        (
            {
                "tasks": [{"id": "a", "agent": "echo", "upstreams": ["gpt"]}],
                "upstreams": {"openai": {"limit": 10, "window": "1m"}},
            },
            "undeclared upstream 'gpt'",
        ),
        ({"tasks": [], "upstreams": {"openai": {"limit": 0, "window": "1m"}}}, "limit"),
        ({"tasks": [], "extra": 1}, "extra"),
    ],
)
def test_task_file_rejections(document: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        TaskFile.model_validate(document)


def test_upstream_names_are_free_when_none_are_declared() -> None:
    document = {"tasks": [{"id": "a", "agent": "echo", "upstreams": ["gpt"]}]}
    assert TaskFile.model_validate(document).tasks[0].upstreams == ("gpt",)


@pytest.mark.parametrize(
    ("cron", "per_week"),
    [
        ("0 9 * * MON-MON", 1),
        ("0 9 * * 1-1", 1),
        ("0 9 * * mon-Mon", 1),
        ("0 9-9 * * *", 7),
        ("0 09-9 * * *", 7),
        ("0 9-9/2 * * *", 7),
        ("30-30 9 * * *", 7),
        ("0 9 * * 1,3-3,5-5", 3),
        ("0 8-10 * * *", 21),
    ],
)
def test_a_range_of_one_value_is_that_value(cron: str, per_week: int) -> None:
    """croniter reads a range of one value (`9-9`, `MON-MON`) as every value of the field:
    it is written as the value itself, so the task fires when the cron says."""
    spec = TaskSpec.model_validate(
        {"id": "t", "agent": "echo", "schedule": {"cron": cron, "timezone": "UTC"}}
    )
    trigger = trigger_of(spec)
    assert trigger is not None
    monday = int(datetime(2026, 1, 5, tzinfo=UTC).timestamp() * 1000)
    fires = fire_times(trigger, monday - 1, monday + 7 * 86_400_000 - 1, limit=10_000)
    assert len(fires) == per_week


@pytest.mark.parametrize(
    ("cron", "per_year"),
    [
        ("0 9 * * MON-1", 52),
        ("0 9 * * 1-mon", 52),
        ("0 9 * * SUN-0", 52),
        ("0 9 1 JAN-1 *", 1),
        ("0 9 1 1-jan *", 1),
        ("0 9 1 dec-12/2 *", 1),
    ],
)
def test_a_range_of_one_value_named_and_numbered_is_that_value(cron: str, per_year: int) -> None:
    """A range whose ends are one value, once by name and once by number (`MON-1`, `JAN-1`),
    is that value too: croniter would read it as every value of the field."""
    spec = make(schedule={"cron": cron, "timezone": "UTC"})
    trigger = trigger_of(spec)
    assert trigger is not None
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    end = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert len(fire_times(trigger, start - 1, end - 1, limit=10_000)) == per_year
