"""Tools from typed Python functions: schema from signature and docstring, argument validation."""

from typing import Literal

import pytest

from horizonrl.envs.base import ToolEnv, ToolResult
from horizonrl.envs.tools import Tool, ToolArgumentError, parse_docstring, tool
from horizonrl.types import Action, Message, Task, ToolCall


def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast") -> str:
    """Search the index.

    Longer explanation.

    Args:
        query: What to look for.
        limit: Most results
            to return.
        mode: Matching mode.
    """
    return f"{query}:{limit}:{mode}"


def test_schema_from_signature_and_docstring():
    spec = Tool(search).spec
    assert spec.name == "search"
    assert spec.description == "Search the index. Longer explanation."
    props = spec.parameters["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["limit"]["description"] == "Most results to return."
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert spec.parameters["required"] == ["query"]


def test_parse_docstring_without_args():
    assert parse_docstring("Just a line.") == ("Just a line.", {})


async def test_call_validates_and_coerces():
    t = Tool(search)
    assert await t({"query": "x", "limit": "3"}) == "x:3:fast"
    with pytest.raises(ToolArgumentError, match="query"):
        await t({"limit": 3})
    with pytest.raises(ToolArgumentError, match="bogus: Extra inputs"):
        await t({"query": "x", "bogus": 1})
    with pytest.raises(ToolArgumentError, match="mode"):
        await t({"query": "x", "mode": "slow"})


def test_untyped_parameter_is_rejected():
    def bad(x):
        """No hints."""

    with pytest.raises(TypeError, match="type hint"):
        Tool(bad)


class EchoEnv(ToolEnv):
    name = "echo-test"

    async def reset(self, task: Task) -> list[Message]:
        self.word = task.data["word"]
        return [Message(role="user", content=self.word)]

    @tool
    def shout(self, text: str) -> str:
        """Upper-case text.

        Args:
            text: Text.
        """
        return text.upper()

    @tool
    def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("kaput")

    @tool
    def finish(self, answer: str) -> ToolResult:
        """Submit.

        Args:
            answer: The word.
        """
        return ToolResult(content="ok", reward=float(answer == self.word), done=True)


async def test_tool_env_dispatches_and_reports_errors_as_observations():
    env = EchoEnv()
    assert [t.name for t in env.tools] == ["shout", "boom", "finish"]
    await env.reset(Task(id="t", env="echo-test", data={"word": "hi"}))
    calls = [
        ToolCall(id="a", name="shout", arguments={"text": "hi"}),
        ToolCall(id="b", name="nope", arguments={}),
        ToolCall(id="c", name="boom", arguments={}),
        ToolCall(id="d", name="shout", arguments={}),
    ]
    result = await env.step(Action(text="", tool_calls=calls))
    contents = [m.content for m in result.observations]
    assert contents[0] == "HI"
    assert "unknown tool 'nope'" in contents[1] and "shout" in contents[1]
    assert "RuntimeError: kaput" in contents[2]
    assert contents[3].startswith("Error: bad arguments for shout")
    assert [m.tool_call_id for m in result.observations] == ["a", "b", "c", "d"]
    assert result.info["tool_errors"] == 3 and not result.done
    done = await env.step(
        Action(text="", tool_calls=[ToolCall(id="e", name="finish", arguments={"answer": "hi"})])
    )
    assert done.done and done.reward == 1.0
