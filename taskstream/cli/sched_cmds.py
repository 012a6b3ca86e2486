"""Scheduling commands: `plan`, `explain`, `trigger`, `backfill`, `pause`, `resume`, `mark`.

Their times (`--from`, `--to`, `--at`) are read by `cli.instants`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Final, TypeVar

import typer
from rich.table import Column, Table
from rich.text import Text

from taskstream.cli.common import (
    Cluster,
    checked_now,
    console,
    open_cluster,
    operator,
    print_json,
    run_async,
    settings,
)
from taskstream.cli.instants import at_instant, time_range
from taskstream.cli.shown import err_line
from taskstream.core.definitions import from_record, unwaited_marker, valid_specs
from taskstream.core.errors import TaskstreamError
from taskstream.core.markers import is_business_date, is_marker_name
from taskstream.core.outbox import Emitted, Outbox
from taskstream.core.payloads import parse_json_object, payload_problem
from taskstream.core.spec import TaskSpec, format_utc_ms
from taskstream.core.store.port import DefinitionRecord
from taskstream.executor.reconciler import GRACE_MS
from taskstream.scheduler import manual, preview

T = TypeVar("T")
JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")
TASK_ARG = typer.Argument(..., help="Task id.")
UNPUBLISHED_NOTE = (
    "not on a work stream yet (Redis failed); the sweeper's reconciler publishes it once it"
    f" is {GRACE_MS // 1000} s old and Redis answers"
)
TIME_HELP: Final = "ISO 8601 with an offset or Z, a date (midnight UTC), or now"
FROM_OPT = typer.Option(..., "--from", help=f"Range start (inclusive): {TIME_HELP}.")
TO_OPT = typer.Option(
    ...,
    "--to",
    help="Range end (inclusive): ISO 8601 with an offset or Z, a date (to the end of that day,"
    " UTC), or now.",
)


async def load_record(cluster: Cluster, task_id: str) -> DefinitionRecord:
    """The stored record of `task_id` (its spec and whether it is paused); TaskstreamError
    (exit 1) when there is none."""
    for record in await cluster.store.list_definitions():
        if record.task_id == task_id:
            return record
    raise TaskstreamError(f"unknown task {task_id!r} (define it with `taskstream tasks apply`)")


def with_record(
    task: str,
    use: Callable[[Cluster, DefinitionRecord], Awaitable[T]],
    *,
    need_redis: bool = False,
) -> T:
    """Open the cluster, load `task`'s stored record and run `use` on both."""

    async def go() -> T:
        async with open_cluster(settings(), need_redis=need_redis) as cluster:
            return await use(cluster, await load_record(cluster, task))

    return run_async(go())


def with_spec(
    task: str, use: Callable[[Cluster, TaskSpec], Awaitable[T]], *, need_redis: bool = False
) -> T:
    """`with_record`, given `task`'s definition."""

    async def spec_of(cluster: Cluster, record: DefinitionRecord) -> T:
        return await use(cluster, from_record(record))

    return with_record(task, spec_of, need_redis=need_redis)


async def _spec(_: Cluster, spec: TaskSpec) -> TaskSpec:
    return spec


def plan_cmd(
    task: str = TASK_ARG,
    from_: str = FROM_OPT,
    to: str = TO_OPT,
    limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="Most lines shown."),
    as_json: bool = JSON_OPT,
) -> None:
    """Preview fire times in a range (UTC and local, DST gaps and folds, calendar exclusions,
    deferrals). Runs nothing and writes nothing."""
    _, (from_ms, to_ms) = checked_now(lambda now: time_range(from_, to, now))
    spec = with_spec(task, _spec)
    lines = preview.preview(spec, from_ms=from_ms, to_ms=to_ms, limit=limit + 1)
    rows, truncated = [_plan_row(line) for line in lines[:limit]], len(lines) > limit
    if as_json:
        meta = {"task_id": task, "from_ms": from_ms, "to_ms": to_ms, "truncated": truncated}
        print_json({**meta, "fires": rows})
        return
    console.print(Text(f"plan of {task} from {format_utc_ms(from_ms)} to {format_utc_ms(to_ms)}"))
    local = f"local ({spec.timezone or 'UTC'})"
    table = Table(Column("utc", no_wrap=True), Column(local, no_wrap=True))
    table.add_column("dst", overflow="fold")
    table.add_column("note", overflow="fold")
    for row in rows:
        utc = row["utc"].replace(".000Z", "Z")
        table.add_row(*(Text(v) for v in (utc, row["local"], row["dst_text"], row["note"])))
    console.print(table)
    fires = sum(1 for row in rows if row["at_ms"] is not None)
    more = f" (first {limit} lines; raise --limit for more)" if truncated else ""
    console.print(Text(f"{fires} fire time(s){more}; nothing was run"))


def _plan_row(line: preview.PreviewLine) -> dict[str, Any]:
    """One plan line as JSON-ready data, with `dst_text` and `note` for the table."""
    fire, block, held = line.fire, line.excluded, line.deferral
    row: dict[str, Any] = {**asdict(fire), "excluded": None, "deferred": None, "note": ""}
    row["utc"] = "-" if fire.at_ms is None else format_utc_ms(fire.at_ms)
    shifted = f" from {', '.join(w[11:] for w in fire.shifted_from)}" if fire.shifted_from else ""
    row["dst_text"] = (fire.dst or "") + shifted
    if block is not None:
        seen = block.details
        shown = seen.get("maintenance") or seen.get("excluded_date") or seen["weekday"]
        row["excluded"], row["note"] = asdict(block), f"excluded: {block.rule} ({shown})"
    elif held is not None:
        row["deferred"] = {**asdict(held), "past_window": line.held_past_window}
        row["note"] = _held_note(held.details, fire.local, line.held_past_window)
    return row


def _held_note(seen: dict[str, Any], fire_local: str, past: bool) -> str:
    """`deferred to 10:00`, with the maintenance window that holds the start and what a hold
    that ends too late turns into."""
    until = str(seen.get("until_local", "never"))
    when = until[11:16] if until[:10] == fire_local[:10] else until[:16]
    if "maintenance" not in seen:
        return f"deferred to {when}" + ("; after the window: skip_window" if past else "")
    note = f"deferred to {when}, end of maintenance {seen['maintenance']}"
    return note + ("; past catchup.max_delay: skip_calendar" if past else "")


def _payload(text: str | None, limit_bytes: int) -> dict[str, Any] | None:
    """The `--payload` object, refused (exit 2) when it is not one strict JSON object or is
    over `limit_bytes` as stored JSON (see `core.payloads`)."""
    if text is None:
        return None
    try:
        value = parse_json_object(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--payload") from None
    problem = payload_problem(value, limit_bytes)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="--payload")
    return value


def trigger_cmd(
    task: str = TASK_ARG,
    payload: str | None = typer.Option(
        None, "--payload", help="JSON object that replaces the task's payload for this run."
    ),
    at: str | None = typer.Option(None, "--at", help="Fire time of the run (default: now)."),
) -> None:
    """Run a task now, through the same dedupe key as scheduled runs."""
    body = _payload(payload, settings().max_payload_bytes)
    now_ms, at_ms = checked_now(lambda now: at_instant(at, now))

    async def go(cluster: Cluster, spec: TaskSpec) -> Emitted:
        outbox = Outbox(cluster.store, cluster.queue, cluster.keys)
        return await manual.trigger(
            outbox, spec, now_ms=now_ms, payload=body, at_ms=at_ms, who=operator()
        )

    unrecorded = None
    try:
        done = with_spec(task, go, need_redis=True)
    except manual.DecisionUnrecorded as exc:  # the run is made: say so, exit 0
        done, unrecorded = exc.emitted, exc
    fire = format_utc_ms(now_ms if at_ms is None else at_ms)
    status = "" if done.outcome != "duplicate" or done.status is None else f", {done.status.value}"
    sys.stdout.write(f"{task}: {done.outcome} {done.instance_id} (fire time {fire}{status})\n")
    if done.outcome == "unpublished":
        sys.stdout.write(f"{task}: {UNPUBLISHED_NOTE}\n")
    if unrecorded is not None:
        err_line(f"warning: {unrecorded}")


def backfill_cmd(
    task: str = TASK_ARG,
    from_: str = FROM_OPT,
    to: str = TO_OPT,
    limit: int = typer.Option(
        manual.DEFAULT_BACKFILL_LIMIT, "--limit", min=1, max=100_000, help="Most fire times."
    ),
) -> None:
    """Create instances for the past fire times in a range (refused when over --limit)."""
    now_ms, (from_ms, to_ms) = checked_now(lambda now: time_range(from_, to, now, past_only=True))

    async def go(cluster: Cluster, spec: TaskSpec) -> manual.BackfillResult:
        outbox = Outbox(cluster.store, cluster.queue, cluster.keys)
        return await manual.backfill(
            outbox, spec, from_ms=from_ms, to_ms=to_ms, now_ms=now_ms, limit=limit, who=operator()
        )

    done = with_spec(task, go, need_redis=True)
    sys.stdout.write(
        f"{task}: {len(done.fire_times)} fire time(s) from {format_utc_ms(from_ms)} to "
        f"{format_utc_ms(to_ms)}: {done.published} published, {done.duplicate} duplicate, "
        f"{done.skipped_calendar} skipped by the calendar\n"
    )
    if done.unpublished:
        sys.stdout.write(f"{task}: {done.unpublished} created but {UNPUBLISHED_NOTE}\n")


def _set_paused(task: str, paused: bool) -> None:
    """Pause or resume `task`; run twice (a double click, a script run again), the second
    says it changed nothing, exit 0, as `mark` does."""

    async def go() -> bool | None:
        async with open_cluster(settings(), need_redis=False) as cluster:
            changed = await cluster.store.set_paused(task, paused)
            if changed:
                await cluster.hint("definitions")
            return changed

    changed = run_async(go())
    if changed is None:
        raise TaskstreamError(f"unknown task {task!r} (define it with `taskstream tasks apply`)")
    if changed:
        said = "paused" if paused else "resumed"
    else:
        said = "already paused" if paused else "not paused, nothing to resume"
    sys.stdout.write(f"{task}: {said}\n")


def pause_cmd(task: str = TASK_ARG) -> None:
    """Stop the scheduler firing a task (manual trigger and backfill still work)."""
    _set_paused(task, True)


def resume_cmd(task: str = TASK_ARG) -> None:
    """Let the scheduler fire a paused task again; fire times that passed during the pause
    follow the task's catch-up policy."""
    _set_paused(task, False)


def mark_cmd(
    name: str = typer.Argument(..., help="Readiness marker name, e.g. raw_data.ready."),
    on: str = typer.Option(..., "--date", help="Business date, YYYY-MM-DD."),
) -> None:
    """Set a readiness marker for a business date (what `depends_on` waits for)."""
    if not is_marker_name(name):
        raise typer.BadParameter(f"{name!r} is not a marker name", param_hint="NAME")
    if not is_business_date(on):
        raise typer.BadParameter(f"{on!r} is not a date (YYYY-MM-DD)", param_hint="--date")

    async def go() -> tuple[bool, list[TaskSpec]]:
        async with open_cluster(settings(), need_redis=False) as cluster:
            marked = await cluster.store.mark_ready(name, on)
            await cluster.hint("marker")
            return marked, valid_specs(await cluster.store.list_definitions())

    marked, specs = run_async(go())
    sys.stdout.write(f"{name} {on}: {'marked' if marked else 'already marked'}\n")
    if (warning := unwaited_marker(name, specs)) is not None:
        err_line(f"warning: {warning}")
