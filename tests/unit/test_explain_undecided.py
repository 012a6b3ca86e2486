"""`taskstream explain` on a task with no decision yet says when the first one comes."""

from __future__ import annotations

from datetime import UTC, datetime

from taskstream.cli.explain_cmd import explain_data, undecided
from taskstream.core.spec import TaskSpec


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).astimezone(UTC).timestamp() * 1000)


DAILY = TaskSpec.model_validate(
    {"id": "rep", "agent": "echo", "schedule": {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}}
)


def test_a_scheduled_task_names_its_next_fire_time_in_utc_and_local_time() -> None:
    assert undecided(DAILY, ms("2026-12-04T15:00:00Z")) == (
        "no decision recorded yet: the scheduler records one when a fire time falls due; "
        "the next is 2026-12-05T08:00:00.000Z (2026-12-05T09:00:00.000+01:00)"
    )


def test_the_next_fire_time_is_strictly_after_now() -> None:
    every = TaskSpec.model_validate({"id": "hb", "agent": "echo", "schedule": {"every": "10m"}})
    at_fire = undecided(every, ms("2026-12-04T15:10:00Z"))
    assert at_fire.endswith("the next is 2026-12-04T15:20:00.000Z (2026-12-04T15:20:00.000+00:00)")


def test_a_paused_task_says_it_is_paused() -> None:
    assert undecided(DAILY, 0, paused=True) == (
        "no decision recorded: the task is paused, and the scheduler decides none of its "
        "fire times until `taskstream resume rep`"
    )


def test_an_on_demand_task_says_where_its_decisions_come_from() -> None:
    # Only a trigger: a backfill needs fire times, and refuses a task without a schedule.
    on_demand = TaskSpec.model_validate({"id": "od", "agent": "echo"})
    assert undecided(on_demand, 0) == (
        "no decision recorded: the task has no schedule; `taskstream trigger od` records its "
        "decisions"
    )


def test_the_answer_without_decisions_carries_that_outcome() -> None:
    now_ms = ms("2026-12-04T15:00:00Z")
    data = explain_data(DAILY, None, None, [], now_ms=now_ms)
    assert (data["decisions"], data["fire_time_ms"]) == ([], None)
    assert data["outcome"] == undecided(DAILY, now_ms)
