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
