"""The typed errors an agent raises to say how its run failed (no I/O, safe for pure code)."""

from __future__ import annotations

from taskstream.core.errors import TaskstreamError


class AgentError(TaskstreamError):
    """Base of the errors an agent raises to say how its run failed."""


class RetriableError(AgentError):
    """A transient failure: the run may succeed if tried again."""


class FatalError(AgentError):
    """A permanent failure: trying again cannot help."""


class NeedsReview(AgentError):
    """The run needs a human decision before anything else happens."""
