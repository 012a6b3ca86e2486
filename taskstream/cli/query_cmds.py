"""Read-only views: `status`, `instances`, `inspect`, `url`."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import typer
from redis.exceptions import RedisError
from rich.table import Column, Table
from rich.text import Text

from taskstream.cli.common import (
    Cluster,
    console,
    open_cluster,
    print_json,
    run_async,
    settings,
)
from taskstream.cli.shown import err_line
from taskstream.cli.upstreams_view import render_upstreams, upstreams_status
from taskstream.core import lost_letters, streams, streams_admin
from taskstream.core.errors import QueueUnavailable, TaskstreamError
from taskstream.core.spec import INSTANCE_ID_LENGTH, format_utc_ms
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.urls import redact_url
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.runtime.endpoint import resolve

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")


def status_cmd(as_json: bool = JSON_OPT) -> None:
    """Queue depth, pending entries, consumers, dead letters (and the letters Redis lost of
    instances FAILED poison), instances by status, and every upstream's limiter usage and
    breaker state. With Redis down or not serving us (a refusal, a wrong database number, not
    Redis at all), the store's counts alone and the Redis error, exit 1. Rows whose status
    no state has (a hand edit in SQL) are named beside the counts of the others, on stderr
    too, exit 1."""
    data = run_async(_status())
    if as_json:
        print_json(data)
    else:
        _print_status(data)
    for unreadable in data.get("instances_unreadable", ()):
        err_line(f"error: {unreadable}")
    if "redis_error" in data or "instances_unreadable" in data:
        raise typer.Exit(1)


def _print_status(data: dict[str, Any]) -> None:
    console.print(f"redis {data['redis_url']}   store {data['database_url']}")
    if "redis_error" in data:
        console.print(f"redis unavailable: {data['redis_error']} (streams and upstreams unknown)")
    else:
        table = Table("stream", "length", "pending", "lag", "consumers")
        for name, st in data["streams"].items():
            table.add_row(
                name,
                str(st["length"]),
                str(st["pending"]),
                str(st["lag"]),
                _consumers_text(st["consumers"]),
            )
        console.print(table)
        console.print(f"dead letters: {data['dead']}{_lost_text(data)}")
    counts = "  ".join(f"{k}={v}" for k, v in data["instances"].items())
    console.print(f"instances: {counts or 'none'}")
    for unreadable in data.get("instances_unreadable", ()):
        console.print(f"  unreadable: {unreadable}")
    if "upstreams" in data:
        render_upstreams(console, data["upstreams"])


def _lost_text(data: dict[str, Any]) -> str:
    """`, lost: 2 (...)` after the dead letters' count, when some letters were lost; `among
    the latest 1,000 poison failures` when older ones were not judged."""
    count = data["lost_letters"]
    if not count:
        return ""
    among = (
        ""
        if data["lost_letters_all_examined"]
        else f" among the latest {data['lost_letters_examined']:,} poison failures"
    )
    return (
        f", lost: {count}{among} (instances FAILED poison with no letter on the stream;"
        " see `taskstream dead list`)"
    )


def _consumers_text(consumers: list[dict[str, Any]]) -> str:
    """`2`, or `2 (1 gone)` when some have no liveness key (dead, not yet pruned)."""
    gone = sum(1 for c in consumers if not c.get("alive", True))
    return f"{len(consumers)} ({gone} gone)" if gone else str(len(consumers))


async def _status() -> dict[str, Any]:
    async with open_cluster(settings()) as cluster:
        data: dict[str, Any] = {
            "redis_url": redact_url(cluster.endpoints.redis_url),
            "database_url": redact_url(cluster.endpoints.database_url),
            "namespace": cluster.settings.namespace,
        }
        counts = await cluster.store.count_by_status()
        data["instances"] = {s.value: counts.counts.get(s, 0) for s in Status}
        if counts.unreadable:
            data["instances_unreadable"] = list(counts.unreadable)
        try:
            data |= await _queue_view(cluster)
        except (QueueUnavailable, RedisError, *streams.DRIVER_ERRORS) as exc:
            # The store is the truth and still answers: show it, and say what is missing
            # (Redis down, or answering but not serving us: a refused command, a database
            # number it does not have, a port where something else answers).
            data["redis_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return data


async def _queue_view(cluster: Cluster) -> dict[str, Any]:
    """The streams, dead letters (lost ones too) and upstreams: everything `status` reads
    from Redis."""
    queue = await streams_admin.queue_view(cluster.queue, cluster.keys)
    dead = cluster.keys.dead
    lost = await lost_letters.latest_lost(
        cluster.store, cluster.queue, dead, examine=lost_letters.LOST_EXAMINED
    )
    upstreams = await upstreams_status(
        cluster.store,
        RedisLimiter(cluster.queue, cluster.keys),
        RedisBreakers(cluster.queue, cluster.keys),
        BreakerConfig(),  # the executors' default; stored `breaker:` settings override it
    )
    counted = {
        "lost_letters": len(lost.lost),
        "lost_letters_examined": lost.examined,
        "lost_letters_all_examined": lost.all_examined,
    }
    return {**queue, **counted, **upstreams}


def instances_cmd(
    task: str = typer.Option(None, "--task", help="Only this task."),
    status: Status = typer.Option(None, "--status", help="Only this status."),
    limit: int = typer.Option(50, min=1, max=10_000),
    as_json: bool = JSON_OPT,
) -> None:
    """List instances, oldest fire time first. A row that cannot be read (it holds what
    taskstream never writes: a hand edit in SQL) is listed as unreadable and named, row and
    column, on stderr, exit 1."""
    rows = run_async(_instances(task, status, limit))
    if as_json:
        print_json(rows)
    else:
        console.print(_instances_table(rows))
    unreadable = [r["error"] for r in rows if r.get("unreadable")]
    for error in unreadable:
        err_line(f"error: {error}")
    if unreadable:
        raise typer.Exit(1)


def _instances_table(rows: list[dict[str, Any]]) -> Table:
    # The id is what `inspect` takes: never cut it, however narrow the terminal.
    table = Table(Column("id", no_wrap=True, min_width=INSTANCE_ID_LENGTH))
    for name in ("task", "status", "attempt", "scheduled_for (UTC)", "fail_class"):
        table.add_column(name)
    for r in rows:
        if r.get("unreadable"):
            table.add_row(r["id"], "", "(unreadable)", "", "", "")
            continue
        table.add_row(
            r["id"],
            r["task_id"],
            r["status"],
            str(r["attempt"]),
            format_utc_ms(r["scheduled_for_ms"]),
            r["fail_class"] or "",
        )
    return table


async def _instances(task: str | None, status: Status | None, limit: int) -> list[dict[str, Any]]:
    """The listed rows as dicts; one that cannot be read as its id, `unreadable` and the
    `error` naming its column."""
    async with open_cluster(settings(), need_redis=False) as cluster:
        rows = await cluster.store.list_instances_or_unreadable(
            task_id=task, status=status, limit=limit
        )
    return [
        asdict(r)
        if isinstance(r, InstanceRow)
        else {"id": r.id, "unreadable": True, "error": r.error}
        for r in rows
    ]


def inspect_cmd(instance_id: str = typer.Argument(...), as_json: bool = JSON_OPT) -> None:
    """One instance: its row (attempt, lease owner, lease expiry) and its status history."""
    data = run_async(_inspect(instance_id))
    if as_json:
        print_json(data)
        return
    for key, value in data["instance"].items():
        shown = f"{value} ({format_utc_ms(value)})" if _is_time(key, value) else value
        console.print(Text.assemble((key, "bold"), f": {shown}"), highlight=False)
    table = Table(Column("at (UTC)", no_wrap=True), "from", "to", "attempt")
    table.add_column("owner", overflow="fold")
    table.add_column("reason", overflow="fold")
    for h in data["history"]:
        table.add_row(
            format_utc_ms(h["at_ms"]),
            str(h["from_status"] or "-"),
            h["to_status"],
            str(h["attempt"]),
            h["owner"] or "",
            # A note is text (a person's, as written): shown as it is, never read as markup.
            Text(h["reason"] if h["note"] is None else f"{h['reason']}: {h['note']}"),
        )
    console.print(table)


def _is_time(key: str, value: object) -> bool:
    """Every `*_ms` field of an instance row is an instant in UTC epoch milliseconds."""
    return key.endswith("_ms") and isinstance(value, int)


async def _inspect(instance_id: str) -> dict[str, Any]:
    async with open_cluster(settings(), need_redis=False) as cluster:
        row = await cluster.store.get_instance(instance_id)
        if row is None:
            raise TaskstreamError(f"no instance with id {instance_id!r}")
        history = await cluster.store.history(instance_id)
    return {"instance": asdict(row), "history": [asdict(h) for h in history]}


def url_cmd(which: str = typer.Argument(..., help="redis or database")) -> None:
    """Print the cluster's Redis or database URL (for redis-cli or a SQL client)."""
    if which not in ("redis", "database"):  # a usage error, whether a cluster is found or not
        raise typer.BadParameter("expected 'redis' or 'database'")
    eps = resolve(settings(), need_redis=which == "redis")
    sys.stdout.write((eps.redis_url if which == "redis" else eps.database_url) + "\n")
