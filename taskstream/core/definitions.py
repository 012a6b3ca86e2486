"""Task definitions and upstream configs as stored: conversion between validated specs and
store records, a cache of definitions that reloads only when the store says they changed, and
a cache of upstream configs that reloads on an interval."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from taskstream.core.errors import ConfigError
from taskstream.core.spec import TaskFile, TaskSpec, spec_hash
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.core.store.port import DefinitionRecord, Store


def to_records(taskfile: TaskFile) -> list[DefinitionRecord]:
    """One record per task of a validated file."""
    return [
        DefinitionRecord(
            task_id=spec.id, spec=spec.model_dump(mode="json"), spec_hash=spec_hash(spec)
        )
        for spec in taskfile.tasks
    ]


def upstream_configs(taskfile: TaskFile) -> dict[str, dict[str, Any]]:
    """The file's `upstreams:` section as stored (JSON per upstream name).

    `breaker` is stored only when the file sets it, so an upstream without one is stored as
    before breakers were configurable and applying such a file again changes nothing.
    """
    return {name: _stored_upstream(upstream) for name, upstream in taskfile.upstreams.items()}


async def apply_file(store: Store, taskfile: TaskFile) -> dict[str, str]:
    """Write a validated file's tasks and upstream limits in one transaction (a failure
    stores neither). Returns task_id -> change and "upstream NAME" -> change, each change
    "created" | "updated" | "unchanged"."""
    changes, ups = await store.apply_definitions(to_records(taskfile), upstream_configs(taskfile))
    return changes | {f"upstream {name}": change for name, change in ups.items()}


def _stored_upstream(upstream: UpstreamLimit) -> dict[str, Any]:
    data = upstream.model_dump(mode="json")
    if upstream.breaker is None:
        del data["breaker"]
    return data


def upstream_from_config(name: str, config: Mapping[str, Any]) -> UpstreamLimit:
    """The spec of a stored upstream config; a config without `breaker` (stored by an older
    version, or from a file that sets none) loads with `breaker` None. A config that no longer
    validates is a `ConfigError` naming the upstream."""
    try:
        return UpstreamLimit.model_validate(config)
    except ValidationError as exc:
        problems = [_problem(f"stored upstream '{name}'", error) for error in exc.errors()]
        raise ConfigError(problems) from exc


def _problem(label: str, error: ErrorDetails) -> str:
    """One line per problem: where and what, never the stored value (it may be a payload)."""
    where = ".".join(str(part) for part in error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    message = str(cause) if error["type"] == "value_error" and cause else error["msg"]
    return f"{label}: {where + ': ' if where else ''}{message}"


def from_record(record: DefinitionRecord) -> TaskSpec:
    """The spec of a stored record. A record that no longer validates (stored by a newer
    version, say) is a `ConfigError`, one line per problem naming the task and the field."""
    label = f"stored task '{record.task_id}'"
    try:
        return TaskSpec.model_validate(record.spec)
    except ValidationError as exc:
        raise ConfigError([_problem(label, error) for error in exc.errors()]) from exc
    except ValueError as exc:
        raise ConfigError([f"{label}: {exc}"]) from exc


def valid_specs(records: Sequence[DefinitionRecord]) -> list[TaskSpec]:
    """The stored definitions that load (`tasks list` names the others)."""
    specs: list[TaskSpec] = []
    for record in records:
        with contextlib.suppress(ConfigError):
            specs.append(from_record(record))
    return specs


def unwaited_marker(name: str, specs: Sequence[TaskSpec]) -> str | None:
    """A warning when no task in `specs` lists `name` in `depends_on` (a misspelt marker
    would otherwise be set without a word); None when one does."""
    waited = sorted({m for spec in specs for m in spec.depends_on})
    if name in waited:
        return None
    known = ", ".join(waited) or "none"
    return f"no stored task depends on {name!r} (markers tasks wait for: {known})"


@dataclass(slots=True)
class LoadedDefinitions:
    """Specs by task id, with the paused flag of each and when each one's schedule took
    effect (ms; tasks stored before that was kept are not in `schedule_from`)."""

    specs: dict[str, TaskSpec] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    invalid: dict[str, str] = field(default_factory=dict)
    schedule_from: dict[str, int] = field(default_factory=dict)
    cursored: set[str] = field(default_factory=set)
    """Tasks a scheduler has decided ticks of (they have a cursor): the only ones that may
    have ticks waiting."""


@dataclass(slots=True)
class DefinitionCache:
    """Definitions from the store, reloaded when `definitions_version()` changes."""

    store: Store
    version: str | None = None
    current: LoadedDefinitions = field(default_factory=LoadedDefinitions)
    min_interval_s: float = 0.0
    """Checks closer together than this are skipped (hot loops check at most this often)."""
    _checked_at: float = float("-inf")

    async def refresh(self, *, force: bool = False) -> bool:
        """Reload if the store's version moved. Returns True when something was reloaded.
        `force` checks even within `min_interval_s` of the last check (a task id was seen
        that the cache does not know: it may have been applied since)."""
        now = time.monotonic()
        if not force and now - self._checked_at < self.min_interval_s:
            return False
        self._checked_at = now
        version = await self.store.definitions_version()
        if version == self.version:
            return False
        loaded = LoadedDefinitions()
        for record in await self.store.list_definitions():
            try:
                loaded.specs[record.task_id] = from_record(record)
            except ConfigError as exc:
                loaded.invalid[record.task_id] = str(exc)
                continue
            if record.paused:
                loaded.paused.add(record.task_id)
            if record.schedule_from_ms is not None:
                loaded.schedule_from[record.task_id] = record.schedule_from_ms
            if record.cursor_ms is not None:
                loaded.cursored.add(record.task_id)
        self.current, self.version = loaded, version
        return True

    def get(self, task_id: str) -> TaskSpec | None:
        return self.current.specs.get(task_id)


class UpstreamSource(Protocol):
    """Where stored upstream configs come from (the `Store` method)."""

    async def list_upstreams(self) -> dict[str, dict[str, Any]]: ...


@dataclass(slots=True)
class UpstreamCache:
    """Stored upstream specs by name, read again at most every `min_interval_s` seconds (the
    store keeps no version for them). Configs that do not validate are left out of `specs`
    and listed in `invalid` (name -> reason)."""

    store: UpstreamSource
    min_interval_s: float = 10.0
    specs: dict[str, UpstreamLimit] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)
    _checked_at: float = float("-inf")

    @property
    def loaded(self) -> bool:
        """Whether a read has completed, so `specs` holds what the store had then."""
        return self._checked_at != float("-inf")

    async def refresh(self) -> bool:
        """Read the store unless it was read less than `min_interval_s` ago; True when read.

        A failed read raises and the next call tries again. Only a completed read starts the
        interval, so callers never go on with nothing loaded while the first read is under way.
        """
        if time.monotonic() - self._checked_at < self.min_interval_s:
            return False
        stored = await self.store.list_upstreams()
        self._checked_at = time.monotonic()
        specs: dict[str, UpstreamLimit] = {}
        invalid: dict[str, str] = {}
        for name, config in stored.items():
            try:
                specs[name] = upstream_from_config(name, config)
            except ConfigError as exc:
                invalid[name] = str(exc).splitlines()[0]
        self.specs, self.invalid = specs, invalid
        return True
