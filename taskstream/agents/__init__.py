"""Agents: the work itself. An agent is an async callable with a name and a params model."""

from taskstream.agents.base import Agent, AgentContext
from taskstream.agents.errors import (
    AgentError,
    FatalError,
    NeedsReview,
    RetriableError,
    UpstreamDeferred,
    UpstreamRejected,
    UpstreamUnavailable,
)
from taskstream.agents.registry import Registry, default_registry
from taskstream.agents.upstream import UpstreamClient
from taskstream.agents.upstream_access import CallTicket, UpstreamAccess
from taskstream.agents.upstream_response import UpstreamResponse

__all__ = [
    "Agent",
    "AgentContext",
    "AgentError",
    "CallTicket",
    "FatalError",
    "NeedsReview",
    "Registry",
    "RetriableError",
    "UpstreamAccess",
    "UpstreamClient",
    "UpstreamDeferred",
    "UpstreamRejected",
    "UpstreamResponse",
    "UpstreamUnavailable",
    "default_registry",
]
