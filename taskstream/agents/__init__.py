"""Agents: the work itself. An agent is an async callable with a name and a params model."""

from taskstream.agents.base import Agent, AgentContext
from taskstream.agents.errors import AgentError, FatalError, NeedsReview, RetriableError
from taskstream.agents.registry import Registry, default_registry

__all__ = [
    "Agent",
    "AgentContext",
    "AgentError",
    "FatalError",
    "NeedsReview",
    "Registry",
    "RetriableError",
    "default_registry",
]
