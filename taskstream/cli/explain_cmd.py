"""`taskstream explain TASK [--at T]`: why a tick ran or did not, rule by rule."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

import typer

from taskstream.cli.common import Cluster, checked_now, print_json
from taskstream.cli.instants import parse_instant
from taskstream.cli.sched_cmds import JSON_OPT, TASK_ARG, with_record
from taskstream.core.definitions import from_record
from taskstream.core.spec import TaskSpec, format_utc_ms
from taskstream.core.store.port import DecisionRow, DefinitionRecord
from taskstream.scheduler.calendar import local_iso, zone_of
from taskstream.scheduler.instances import trigger_of
from taskstream.scheduler.ticks import next_fire
from taskstream.scheduler.trail import decision_trail, nearest_decided_fire, rule_of
from taskstream.scheduler.verdict import NOT_FINAL, SHOULD_RUN, SKIP_DUPLICATED


def explain_cmd(
    task: str = TASK_ARG,
    at: str | None = typer.Option(None, "--at", help="Explain the decided fire time nearest this."),
    as_json: bool = JSON_OPT,
) -> None:
    """Why a tick ran or not: every decision recorded for one fire time, oldest first, with the
    rule that decided and the values it saw. Default: the latest decided fire time."""
    now_ms, at_ms = checked_now(
        lambda now: None if at is None else parse_instant(at, name="--at", now_ms=now)
    )

    async def go(cluster: Cluster, record: DefinitionRecord) -> dict[str, Any]:
        fire_ms = await nearest_decided_fire(cluster.store, task, at_ms)
        trail = await decision_trail(cluster.store, task, fire_ms)
        spec = from_record(record)
        return explain_data(spec, at_ms, fire_ms, trail, now_ms=now_ms, paused=record.paused)

    data = with_record(task, go)
    if as_json:
        print_json(data)
        return
    sys.stdout.write("\n".join(_explain_text(data)) + "\n")


def explain_data(
    spec: TaskSpec,
    at_ms: int | None,
    fire_ms: int | None,
    trail: list[DecisionRow],
    *,
    now_ms: int,
    paused: bool = False,
) -> dict[str, Any]:
    """The explain answer as JSON-ready data: the tick, its decisions and the outcome. With
    no decision at all, the outcome says when one comes (`undecided`)."""
    zone = zone_of(spec.timezone)
    rows = [_trail_row(row) for row in trail]
    return {
        "task_id": spec.id,
        "asked_at_ms": at_ms,
        "fire_time_ms": fire_ms,
        "fire_utc": None if fire_ms is None else format_utc_ms(fire_ms),
        "fire_local": None if fire_ms is None else local_iso(fire_ms, zone),
        "timezone": str(zone),
        "decisions": rows,
        "outcome": _outcome(rows) if rows else undecided(spec, now_ms, paused=paused),
    }


def _trail_row(row: DecisionRow) -> dict[str, Any]:
    rule, saw = rule_of(row.decision, row.details)
    return {
        **asdict(row),
        "rule": rule,
        "saw": saw,
        "decided_utc": format_utc_ms(row.decided_at_ms),
    }


def undecided(spec: TaskSpec, now_ms: int, *, paused: bool = False) -> str:
    """Why a task has no decision yet: the next fire time after `now_ms` (UTC epoch ms) in
    UTC and local time, that a paused task is not decided, or that an on-demand task is
    decided only when triggered (a backfill needs fire times, which it has none of)."""
    trigger = trigger_of(spec)
    if paused and trigger is not None:
        return (
            "no decision recorded: the task is paused, and the scheduler decides none of its "
            f"fire times until `taskstream resume {spec.id}`"
        )
    if trigger is None:
        return (
            "no decision recorded: the task has no schedule; "
            f"`taskstream trigger {spec.id}` records its decisions"
        )
    fire_ms = next_fire(trigger, now_ms)
    local = local_iso(fire_ms, zone_of(spec.timezone))
    return (
        "no decision recorded yet: the scheduler records one when a fire time falls due; "
        f"the next is {format_utc_ms(fire_ms)} ({local})"
    )


def _outcome(rows: list[dict[str, Any]]) -> str:
    ran, last = [r for r in rows if r["decision"] == SHOULD_RUN], rows[-1]
    if ran:
        return f"instance {ran[-1]['instance_id']} was created (see taskstream inspect)"
    if last["decision"] == SKIP_DUPLICATED:
        return f"instance {last['instance_id']} already existed for this dedupe key"
    if last["decision"] in NOT_FINAL:
        return f"not decided yet: {last['decision']} ({last['reason']})"
    return f"did not run: {last['decision']}, by the {last['rule'] or 'unknown'} rule"


def _flat(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key in sorted(values):
        value = values[key]
        if isinstance(value, dict) and value:
            out += _flat(value, f"{prefix}{key}.")
        else:
            shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out.append(f"{prefix}{key}={shown}")
    return out


def _explain_text(data: dict[str, Any]) -> list[str]:
    task, rows = data["task_id"], data["decisions"]
    if not rows:
        return [f"{task}: {data['outcome']}"]
    lines = [f"{task}: fire time {data['fire_utc']} ({data['fire_local']} {data['timezone']})"]
    asked = data["asked_at_ms"]
    if asked is not None and asked != data["fire_time_ms"]:
        lines.append(f"  the decided fire time nearest to {format_utc_ms(asked)}")
    for n, row in enumerate(rows, 1):
        lines.append(f"{n}. {row['decision']}: {row['reason']}")
        lines.append(f"   decided at {row['decided_utc']}, instance {row['instance_id'] or '-'}")
        if row["rule"]:
            lines.append(f"   rule: {row['rule']}, saw:")
            lines += [f"     {item}" for item in _flat(row["saw"])]
        rest = {k: v for k, v in row["details"].items() if k not in row["saw"]}
        lines.append("   context: " + ", ".join(_flat(rest)))
    lines.append(f"outcome: {data['outcome']}")
    return lines
