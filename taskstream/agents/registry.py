"""Agent registry: name -> agent. Built once at process start and passed down."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from taskstream.agents.base import Agent
from taskstream.core.errors import ConfigError, TaskstreamError
from taskstream.core.plugins import import_named


class UnknownAgent(TaskstreamError):
    """No agent is registered under that name."""


class Registry:
    """A read-mostly mapping of agent names to agents."""

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}

    def register(self, agent: Agent) -> None:
        if agent.name in self._agents:
            raise ValueError(f"an agent named {agent.name!r} is already registered")
        self._agents[agent.name] = agent

    def get(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            raise UnknownAgent(name) from None

    def names(self) -> set[str]:
        return set(self._agents)

    def __iter__(self) -> Iterator[Agent]:
        return iter(self._agents.values())


def default_registry(modules: tuple[str, ...] = ()) -> Registry:
    """The built-in agents plus those of `modules` (importable names, each exposing a
    sequence `AGENTS`), e.g. `TASKSTREAM_AGENT_MODULES=myteam.agents`."""
    from taskstream.agents.builtin import BUILTINS  # noqa: PLC0415 - avoids an import cycle

    registry = Registry()
    for builtin in BUILTINS:
        registry.register(builtin)
    for name in dict.fromkeys(modules):  # a module named twice is loaded once
        for agent in _module_agents(name):
            try:
                registry.register(agent)
            except ValueError as exc:  # its name is taken (a built-in's, another module's)
                raise ConfigError([f"agent module {name!r}: {exc}"]) from None
    return registry


def _module_agents(name: str) -> list[Agent]:
    agents = getattr(import_named("agent", name), "AGENTS", None)
    if not isinstance(agents, list | tuple):
        raise ConfigError([f"agent module {name!r} has no AGENTS list"])
    for agent in agents:
        problem = agent_problem(agent)
        if problem is not None:
            raise ConfigError([f"agent module {name!r}: {problem}"])
    return list(agents)


def agent_problem(agent: object) -> str | None:
    """Why `agent` could never run (None when it could): it has no name, its params model is
    not a pydantic model class (a dataclass, say), or its `run` is not callable. Refused where
    the module is loaded, so no task is applied for it and no run of it fails every attempt."""
    name = getattr(agent, "name", None)
    if not isinstance(name, str):
        return f"AGENTS holds what is not an agent: {repr(agent)[:80]}"
    model = getattr(agent, "params_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return f"agent {name!r}: params_model is not a pydantic model class ({repr(model)[:80]})"
    if not callable(getattr(agent, "run", None)):
        return f"agent {name!r}: its run is not callable"
    return None
