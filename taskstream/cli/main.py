"""The `taskstream` command line. Human output by default, `--json` for scripts.

Exit codes: 0 ok; 1 an operational error (store or Redis down, no cluster found); 2 invalid
input (task file, arguments, `TASKSTREAM_*` settings).
"""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError
from redis.exceptions import RedisError

from taskstream.cli import explain_cmd, ops_cmds, query_cmds, redis_cli, roles, sched_cmds, up
from taskstream.cli.shown import err_line
from taskstream.cli.tasks_cmds import tasks_app
from taskstream.core.errors import ConfigError, TaskstreamError, UsageError
from taskstream.core.logging import configure
from taskstream.core.redis_errors import outage_text

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    help="taskstream: scheduled work that runs when it should, once, explainably.",
)
app.add_typer(tasks_app, name="tasks")
app.add_typer(ops_cmds.dead_app, name="dead")
app.command("retry")(ops_cmds.retry_cmd)
app.command("up")(up.up_cmd)
app.command("scheduler")(roles.scheduler_cmd)
app.command("executor")(roles.executor_cmd)
app.command("sweeper")(roles.sweeper_cmd)
app.command("migrate")(roles.migrate_cmd)
app.command("status")(query_cmds.status_cmd)
app.command("instances")(query_cmds.instances_cmd)
app.command("inspect")(query_cmds.inspect_cmd)
app.command("url")(query_cmds.url_cmd)
app.command(
    "redis-cli",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(redis_cli.redis_cli_cmd)
app.command("plan")(sched_cmds.plan_cmd)
app.command("explain")(explain_cmd.explain_cmd)
app.command("trigger")(sched_cmds.trigger_cmd)
app.command("backfill")(sched_cmds.backfill_cmd)
app.command("pause")(sched_cmds.pause_cmd)
app.command("resume")(sched_cmds.resume_cmd)
app.command("mark")(sched_cmds.mark_cmd)


def run() -> None:
    """Console-script entry: configure logging, run the app, turn typed errors into exit codes."""
    from taskstream.core.settings import Settings  # noqa: PLC0415 - after env is final

    try:
        configure(Settings().log_level)
        app()
    except ValidationError as exc:
        for line in settings_problems(exc):
            err_line(line)
        sys.exit(2)
    except ConfigError as exc:
        for line in exc.problems:
            err_line(line)
        sys.exit(2)
    except UsageError as exc:
        err_line(f"error: {exc}")
        sys.exit(2)
    except TaskstreamError as exc:
        err_line(f"error: {exc}")
        sys.exit(1)
    except RedisError as exc:
        err_line(f"error: {outage_text(exc)}")
        sys.exit(1)


def settings_problems(exc: ValidationError) -> list[str]:
    """One line per invalid `TASKSTREAM_*` setting, naming the variable (never its value:
    a URL may carry a password)."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        field = "_".join(str(part) for part in error["loc"]).upper()
        lines.append(f"TASKSTREAM_{field}: {error['msg']}")
    return lines
