"""The README's code examples run, so they cannot rot."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

import structlog

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.http_agent import HttpParams
from taskstream.agents.registry import Registry
from taskstream.core.specfile import parse_task_file_text

README = (Path(__file__).parents[2] / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.DOTALL)


def test_the_agent_example_defines_a_registrable_agent() -> None:
    [source] = blocks("python")
    module = types.ModuleType("readme_agents")
    exec(compile(source, "README.md", "exec"), module.__dict__)
    agents = module.__dict__["AGENTS"]
    assert [type(a) for a in agents] == [FunctionAgent]
    registry = Registry()
    for agent in agents:
        registry.register(agent)
    assert registry.names() == {"ping"}
    ctx = AgentContext("i1", "ping", 1, "ping:1", 0, structlog.get_logger())
    params = module.__dict__["Params"](url="http://127.0.0.1:1/hook")
    assert asyncio.run(module.__dict__["ping"](ctx, params)) == {"pinged": params.url}
    assert ctx.side_effects == ["ping:1:notify"]


def test_the_task_examples_validate() -> None:
    ids = []
    for source in blocks("yaml"):
        taskfile = parse_task_file_text(source, "README.md", known_agents={"echo", "http"})
        ids += [t.id for t in taskfile.tasks]
    assert ids == ["nightly-summary", "daily-report"]


def test_the_http_example_payload_is_valid_http_params() -> None:
    source = blocks("yaml")[0]
    [task] = parse_task_file_text(source, "README.md", known_agents={"http"}).tasks
    assert HttpParams.model_validate(task.payload).method == "POST"
