"""`taskstream tasks validate|apply|list`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table

from taskstream.agents.registry import default_registry
from taskstream.cli.common import console, open_cluster, print_json, run_async, settings
from taskstream.cli.shown import err_line
from taskstream.core import preconditions
from taskstream.core.definitions import apply_file, from_record
from taskstream.core.errors import ConfigError
from taskstream.core.settings import Settings
from taskstream.core.spec import TaskFile, TaskSpec
from taskstream.core.specfile import load_task_file

tasks_app = typer.Typer(no_args_is_help=True, help="Validate, apply and list task definitions.")

TABLE_KEYS = ("task_id", "agent", "schedule", "timezone", "paused")
FILE_ARG = typer.Argument(..., help="A tasks YAML file.")


def _load(path: Path) -> TaskFile:
    return load_checked(path, settings())


def load_checked(path: Path, s: Settings) -> TaskFile:
    """`path` validated against what this host's settings load: agents, precondition
    checks and the payload limit (`tasks validate|apply`, `up --tasks`)."""
    return load_task_file(
        path,
        known_agents=default_registry(s.agent_modules).names(),
        max_payload_bytes=s.max_payload_bytes,
        known_checks=preconditions.load(s.precondition_modules).keys(),
    )


@tasks_app.command("validate")
def validate_cmd(path: Path = FILE_ARG) -> None:
    """Check a task file without touching the store: exit 0, or 2 with one line per problem."""
    taskfile = _load(path)
    sys.stdout.write(f"{path}: ok, {len(taskfile.tasks)} task(s)\n")


@tasks_app.command("apply")
def apply_cmd(path: Path = FILE_ARG) -> None:
    """Validate a task file and write its definitions to the store (nothing on any error)."""
    taskfile = _load(path)
    changes = run_async(_apply(taskfile))
    for task_id, change in sorted(changes.items()):
        sys.stdout.write(f"{task_id}: {change}\n")


async def _apply(taskfile: TaskFile) -> dict[str, str]:
    async with open_cluster(settings(), need_redis=False) as cluster:
        changes = await apply_file(cluster.store, taskfile)
        await cluster.hint("definitions")
        return changes


@tasks_app.command("list")
def list_cmd(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List stored definitions with their schedule and paused flag. A stored definition that
    no longer validates is listed as invalid, its problems go to stderr, and the exit is 1."""
    rows, problems = run_async(_list())
    if as_json:
        print_json(rows)
    else:
        table = Table(*TABLE_KEYS)
        for r in rows:
            table.add_row(*("" if r[k] is None else str(r[k]) for k in TABLE_KEYS))
        console.print(table)
    for line in problems:
        err_line(line)
    if problems:
        raise typer.Exit(1)


async def _list() -> tuple[list[dict[str, object]], list[str]]:
    async with open_cluster(settings(), need_redis=False) as cluster:
        records = await cluster.store.list_definitions()
    out: list[dict[str, object]] = []
    problems: list[str] = []
    for record in records:
        row: dict[str, object] = {"task_id": record.task_id, "agent": None, "timezone": None}
        try:
            row |= _described(from_record(record))
        except ConfigError as exc:
            problems.extend(exc.problems)
            row |= {"schedule": "invalid (see below)", "valid": False}
        out.append(row | {"paused": record.paused, "spec_hash": record.spec_hash})
    return out, problems


def _described(spec: TaskSpec) -> dict[str, object]:
    sched = spec.schedule
    what = "on-demand"
    if sched and sched.cron:
        what = f"cron {sched.cron}"
    elif sched and sched.every:
        what = f"every {sched.every:g}s"
    timezone = sched.timezone if sched else None
    return {"agent": spec.agent, "schedule": what, "timezone": timezone, "valid": True}
