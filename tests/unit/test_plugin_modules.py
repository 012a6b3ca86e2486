"""Modules named by `TASKSTREAM_AGENT_MODULES` and `TASKSTREAM_PRECONDITION_MODULES`: each
problem with one is a `ConfigError` naming the module (exit 2 at the CLI), never a traceback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import preconditions
from taskstream.core.errors import ConfigError

GOOD = """
from pydantic import BaseModel
from taskstream.agents.base import FunctionAgent

class P(BaseModel):
    pass

async def run(ctx, p):
    return {}

AGENTS = [FunctionAgent(name="NAME", params_model=P, fn=run)]
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Importable modules under fresh names, by what each holds."""
    monkeypatch.syspath_prepend(str(tmp_path))
    sources = {
        "good": GOOD.replace("NAME", "mine"),
        "echo_again": GOOD.replace("NAME", "echo"),
        "not_agents": "AGENTS = [42]\n",
        "raises": "raise RuntimeError('needs a key')\n",
        "no_checks": "PRECONDITIONS = None\n",
        "dataclass_params": GOOD.replace("NAME", "dc").replace(
            "class P(BaseModel):", "from dataclasses import dataclass\n@dataclass\nclass P:"
        ),
        "no_run": "class A:\n    name = 'bare'\n\nAGENTS = [A()]\n",
    }
    names = {}
    for kind, source in sources.items():
        names[kind] = f"plug_{kind}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{names[kind]}.py").write_text(source)
    return names


def test_a_module_named_twice_is_loaded_once(modules: dict[str, str]) -> None:
    registry = default_registry((modules["good"], modules["good"]))
    assert "mine" in registry.names()


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("echo_again", "an agent named 'echo' is already registered"),
        ("not_agents", "AGENTS holds what is not an agent: 42"),
        ("raises", "cannot be imported: RuntimeError: needs a key"),
    ],
)
def test_a_bad_agent_module_is_a_config_error_naming_it(
    modules: dict[str, str], kind: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        default_registry((modules[kind],))
    [line] = caught.value.problems
    assert line.startswith(f"agent module {modules[kind]!r}") and says in line, line


@pytest.mark.parametrize("name", [".relative", "no_such_module_here", ""])
def test_an_unimportable_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match=f"agent module {name!r} cannot be imported"):
        default_registry((name,))
    with pytest.raises(ConfigError, match=f"precondition module {name!r} cannot be imported"):
        preconditions.load([name])


def test_a_precondition_module_that_raises_is_a_config_error(modules: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="RuntimeError: needs a key"):
        preconditions.load([modules["raises"]])
    with pytest.raises(ConfigError, match="has no PRECONDITIONS mapping"):
        preconditions.load([modules["no_checks"]])


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("dataclass_params", "agent 'dc': params_model is not a pydantic model class"),
        ("no_run", "agent 'bare': params_model is not a pydantic model class"),
    ],
)
def test_an_agent_that_could_never_run_is_a_config_error_naming_it(
    modules: dict[str, str], kind: str, says: str
) -> None:
    """Its params model is not a pydantic model class (a dataclass, none at all): it
    was registered, `tasks apply` took tasks naming it, and every attempt of every run of
    theirs failed in the executor (`instance.run_crashed`, `AttributeError`), retried until
    exhausted, instead of the module being refused where it is loaded."""
    with pytest.raises(ConfigError) as caught:
        default_registry((modules[kind],))
    [line] = caught.value.problems
    assert line.startswith(f"agent module {modules[kind]!r}") and says in line, line


def test_an_agent_without_a_run_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"plug_norun_{uuid.uuid4().hex[:8]}"
    source = GOOD.replace("NAME", "idle").replace(
        'AGENTS = [FunctionAgent(name="idle", params_model=P, fn=run)]',
        "class A:\n    name = 'idle'\n    params_model = P\n    run = None\n\nAGENTS = [A()]",
    )
    (tmp_path / f"{name}.py").write_text(source)
    with pytest.raises(ConfigError) as caught:
        default_registry((name,))
    [line] = caught.value.problems
    assert "agent 'idle': its run is not callable" in line, line
