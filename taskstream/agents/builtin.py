"""Built-in agents: `echo` and `sleep`, which need no upstream, and `http` (`http_agent`)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.http_agent import HTTP_AGENT


class EchoParams(BaseModel):
    """Any JSON object; it is returned as the result."""

    model_config = ConfigDict(extra="allow")


async def _echo(ctx: AgentContext, params: EchoParams) -> dict[str, Any]:
    ctx.log.debug("agent.echo")
    return params.model_dump()


class SleepParams(BaseModel):
    """`seconds`: how long to sleep, at most one hour."""

    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(default=1.0, ge=0.0, le=3600.0)


async def _sleep(ctx: AgentContext, params: SleepParams) -> dict[str, float]:
    await asyncio.sleep(params.seconds)
    return {"slept_s": params.seconds}


BUILTINS = (
    FunctionAgent(name="echo", params_model=EchoParams, fn=_echo),
    FunctionAgent(name="sleep", params_model=SleepParams, fn=_sleep),
    HTTP_AGENT,
)
