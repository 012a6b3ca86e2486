"""The upstreams section of `taskstream status`: every upstream the cluster knows (stored
`upstreams:` limits plus the names tasks declare), its limiter's usage in the current window,
and its breaker's stored state, all read on the Redis server's clock without recording anything.

Each breaker is shown with its own settings: the upstream's stored `breaker:`, else the default
`BreakerConfig` the executors run with, passed in as `cfg`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from taskstream.core.definitions import from_record, upstream_from_config
from taskstream.core.errors import ConfigError
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.core.store.port import DefinitionRecord, Store
from taskstream.ratelimit.backend import Breakers, Limiter, Usage
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, cooldown_ends_ms
from taskstream.ratelimit.breaker_config import BreakerConfig, upstream_breaker_config
from taskstream.ratelimit.window import Limits, limits_from_spec


def known_upstreams(
    stored: Mapping[str, object], records: Sequence[DefinitionRecord]
) -> dict[str, list[str]]:
    """Every stored or task-named upstream -> the ids of the tasks naming it, sorted.

    A stored definition that no longer validates names no upstream here.
    """
    found: dict[str, set[str]] = {name: set() for name in stored}
    for record in records:
        try:
            spec = from_record(record)
        except ConfigError:
            continue
        for name in spec.upstreams:
            found.setdefault(name, set()).add(spec.id)
    return {name: sorted(found[name]) for name in sorted(found)}


def stored_upstream(name: str, config: Mapping[str, Any]) -> UpstreamLimit | str:
    """A stored upstream's spec, or why it does not validate (its first problem)."""
    try:
        return upstream_from_config(name, config)
    except ConfigError as exc:
        return exc.problems[0].removeprefix(f"stored upstream '{name}': ")


def limiter_view(limits: Limits, usage: Usage) -> dict[str, Any]:
    """Limits and usage of one limiter; `used_pct` is `used` as a percentage of `limit`
    (above 100 while burst headroom is in use)."""
    return {
        **limits._asdict(),
        "used": usage.used,
        "used_pct": round(100 * usage.used / limits.limit, 1),
        "in_horizon": usage.in_horizon,
    }


def breaker_view(state: BreakerState, at_ms: int, cfg: BreakerConfig) -> dict[str, Any]:
    """A breaker's stored state and its settings `cfg`; for an open one, when its cool-down
    ends (UTC epoch ms) and how long that is after `at_ms` (0 once over: the next call goes
    half-open)."""
    ends_ms = cooldown_ends_ms(state, cfg)
    return {
        **asdict(state),
        "status": state.status.value,
        "failure_threshold": cfg.failure_threshold,
        "failure_rate": cfg.failure_rate,
        "min_calls": cfg.min_calls,
        "rate_window_ms": cfg.window_ms,
        "cooldown_ms": cfg.cooldown_ms,
        "probes": cfg.probes,
        "probe_timeout_ms": cfg.probe_timeout_ms,
        "cooldown_ends_ms": ends_ms,
        "cooldown_left_ms": None if ends_ms is None else max(0, ends_ms - at_ms),
    }


async def upstreams_status(
    store: Store, limiter: Limiter, breakers: Breakers, cfg: BreakerConfig
) -> dict[str, Any]:
    """The status keys `upstreams` ({name: {tasks, limiter, breaker}}) and `upstreams_at_ms`
    (the Redis server's clock when the breakers were read)."""
    stored = await store.list_upstreams()
    names = known_upstreams(stored, await store.list_definitions())
    read = await breakers.states(list(names))
    upstreams: dict[str, Any] = {}
    for name, tasks in names.items():
        spec = stored_upstream(name, stored[name]) if name in stored else None
        limiter_data: dict[str, Any] | None = None
        if isinstance(spec, str):
            limiter_data = {"error": spec}
        elif spec is not None and (limits := limits_from_spec(spec)) is not None:
            limiter_data = limiter_view(limits, await limiter.usage(name, limits.window_ms))
        own = upstream_breaker_config(spec if isinstance(spec, UpstreamLimit) else None, cfg)
        upstreams[name] = {
            "tasks": tasks,
            "limiter": limiter_data,
            "breaker": breaker_view(read.states[name], read.at_ms, own),
        }
    return {"upstreams": upstreams, "upstreams_at_ms": read.at_ms}


# --- human output --------------------------------------------------------------------------


def _seconds(ms: int) -> str:
    return f"{round(ms / 1000, 1):g}s"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _limit_cells(limiter: Mapping[str, Any] | None) -> tuple[str, str]:
    if limiter is None:
        return "-", "-"
    if "error" in limiter:
        return f"invalid: {limiter['error']}", "-"
    burst = f" +{limiter['burst']} burst" if limiter["burst"] else ""
    limit = f"{limiter['limit']} / {_seconds(limiter['window_ms'])}{burst}"
    return limit, f"{limiter['used']} ({limiter['used_pct']:g}%)"


def _breaker_cells(breaker: Mapping[str, Any]) -> tuple[str, str]:
    status = breaker["status"]
    if status == BreakerStatus.OPEN:
        left = breaker["cooldown_left_ms"]
        ends = _utc(breaker["cooldown_ends_ms"])
        when = f"cool-down until {ends} (in {_seconds(left)})" if left else "cool-down over"
        return f"open, {when}", f"opened {_utc(breaker['since_ms'])}"
    if status == BreakerStatus.HALF_OPEN:
        probes = f"probes: {breaker['probes_admitted']} out, {breaker['probe_successes']} ok"
        return "half-open", probes
    failures = (
        f"{breaker['consecutive_failures']}/{breaker['failure_threshold']} in a row, "
        f"{breaker['window_failures']} of {breaker['window_calls']} in window"
    )
    return "closed", failures


def _settings_cell(breaker: Mapping[str, Any]) -> str:
    probes = breaker["probes"]
    rate = round(100 * breaker["failure_rate"], 1)
    return (
        f"{breaker['failure_threshold']} in a row or {rate:g}% of "
        f"{breaker['min_calls']}+ in {_seconds(breaker['rate_window_ms'])}; "
        f"cool-down {_seconds(breaker['cooldown_ms'])}, {probes} probe{'s' if probes > 1 else ''}"
    )


def render_upstreams(console: Console, upstreams: Mapping[str, Any]) -> None:
    """The `upstreams` status key as a table."""
    if not upstreams:
        console.print("upstreams: none")
        return
    table = Table("upstream", "limit", "used", "breaker", "failures", "breaker settings", "tasks")
    for name, data in upstreams.items():
        limit, used = _limit_cells(data["limiter"])
        breaker, failures = _breaker_cells(data["breaker"])
        settings = _settings_cell(data["breaker"])
        tasks = ", ".join(data["tasks"]) or "-"
        table.add_row(name, limit, used, breaker, failures, settings, tasks)
    console.print(table)
