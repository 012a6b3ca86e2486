"""The examples of docs/tasks.md's section on the `http` agent are valid, so they cannot rot."""

from __future__ import annotations

import re
import types
from pathlib import Path

from taskstream.agents.base import FunctionAgent
from taskstream.agents.http_agent import HttpParams
from taskstream.agents.registry import default_registry
from taskstream.core.specfile import parse_task_file_text

DOC = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text()
SECTION = DOC.split("## Calling upstream APIs", 1)[1].split("\n## ", 1)[0]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SECTION, flags=re.DOTALL)


def test_the_http_task_example_validates_with_the_builtin_agent() -> None:
    [source] = blocks("yaml")
    registry = default_registry()
    taskfile = parse_task_file_text(source, "docs/tasks.md", known_agents=registry.names())
    [task] = taskfile.tasks
    assert (task.agent, task.upstreams) == ("http", ("billing",))
    params = registry.get("http").params_model.model_validate(task.payload)
    assert isinstance(params, HttpParams) and params.method == "POST"


def test_the_client_example_defines_a_registrable_agent() -> None:
    [source] = blocks("python")
    module = types.ModuleType("docs_http_agents")
    exec(compile(source, "docs/tasks.md", "exec"), module.__dict__)
    [agent] = module.__dict__["AGENTS"]
    assert isinstance(agent, FunctionAgent) and agent.name == "summarise"
