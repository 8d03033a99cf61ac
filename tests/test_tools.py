"""Tools from typed Python functions: schema from signature and docstring, argument validation."""

from typing import Literal

import pytest

from horizonrl.envs.base import Env, EnvOptions, ToolEnv, ToolResult
from horizonrl.envs.tools import Tool, ToolArgumentError, parse_docstring, tool
from horizonrl.types import Action, Message, StepResult, Task, ToolCall


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


class _PlainEnv(Env):
    """An Env that is not a ToolEnv and declares neither tools nor metrics."""

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="user", content="hi")]

    async def step(self, action: Action) -> StepResult:
        return StepResult(done=True)


def test_env_declares_tools_metrics_and_options_with_fresh_defaults_per_instance():
    a, b = _PlainEnv(), _PlainEnv()
    assert a.tools == [] and a.metrics == {} and isinstance(a.options, EnvOptions)
    a.tools.append(EchoEnv().tools[0])
    a.metrics["success"] = 1.0
    assert b.tools == [] and b.metrics == {}  # no shared mutable default
    assert "tools" not in vars(Env) and "metrics" not in vars(Env)


class _CountOptions(EnvOptions):
    start: int = 3


class _CountEnv(_PlainEnv, Env[_CountOptions]):
    Options = _CountOptions


def test_env_options_default_to_its_options_model():
    assert _CountEnv().options == _CountOptions(start=3)
    assert _CountEnv(_CountOptions(start=5)).options.start == 5


async def test_env_metrics_go_into_the_trajectory(tokenizer):
    from horizonrl.agent.config import AgentConfig
    from horizonrl.agent.loop import Agent
    from horizonrl.engine.base import SamplingParams

    class Scored(_PlainEnv):
        accepts_text = True

        async def evaluate(self) -> float:
            self.metrics = {"success": 1.0, "tests_passed": 3.0}
            return 1.0

    class Say:
        def act(self, task: Task, messages: list[Message]) -> str:
            return "done"

    agent = Agent(tokenizer, None, SamplingParams(max_new_tokens=16), AgentConfig(), context_length=4096)
    traj = await agent.run(Scored(), Task(id="t", env="x", data={}), "t#0", "t", policy=Say())
    assert traj.finish == "finished" and traj.reward == 1.0
    assert traj.metrics["success"] == 1.0 and traj.metrics["tests_passed"] == 3.0
