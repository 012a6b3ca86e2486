"""Task definitions as stored: conversion between validated specs and store records, and a
cache that reloads only when the store says definitions changed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from taskstream.core.errors import ConfigError
from taskstream.core.spec import TaskFile, TaskSpec, spec_hash
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
    """The file's `upstreams:` section as stored (JSON per upstream name)."""
    return {name: limit.model_dump(mode="json") for name, limit in taskfile.upstreams.items()}


def from_record(record: DefinitionRecord) -> TaskSpec:
    """The spec of a stored record. A record that no longer validates is a `ConfigError`."""
    try:
        return TaskSpec.model_validate(record.spec)
    except ValueError as exc:
        raise ConfigError([f"stored task '{record.task_id}': {exc}"]) from exc


@dataclass(slots=True)
class LoadedDefinitions:
    """Specs by task id, with the paused flag of each."""

    specs: dict[str, TaskSpec] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    invalid: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class DefinitionCache:
    """Definitions from the store, reloaded when `definitions_version()` changes."""

    store: Store
    version: str | None = None
    current: LoadedDefinitions = field(default_factory=LoadedDefinitions)
    min_interval_s: float = 0.0
    """Checks closer together than this are skipped (hot loops check at most this often)."""
    _checked_at: float = float("-inf")

    async def refresh(self) -> bool:
        """Reload if the store's version moved. Returns True when something was reloaded."""
        now = time.monotonic()
        if now - self._checked_at < self.min_interval_s:
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
        self.current, self.version = loaded, version
        return True

    def get(self, task_id: str) -> TaskSpec | None:
        return self.current.specs.get(task_id)
