"""The Env contract.

An environment is a small async object: ``reset`` gives the initial messages for a task, ``step``
executes the model's action and answers with observations, a reward and whether the episode is over,
``close`` releases resources. Most envs subclass :class:`ToolEnv`, which implements ``step`` by
dispatching the model's tool calls to methods marked ``@tool``; a new env is then ~30 lines::

    class EchoEnv(ToolEnv[EnvOptions]):
        name = "echo"

        async def reset(self, task):
            self.task = task
            return [Message(role="system", content="Repeat the word."),
                    Message(role="user", content=task.data["word"])]

        @tool
        def finish(self, answer: str) -> ToolResult:
            '''Submit the answer.

            Args:
                answer: The word.
            '''
            return ToolResult(content="done", reward=float(answer == self.task.data["word"]), done=True)

An env is generic over its options model: ``class CalcEnv(ToolEnv[CalcOptions])`` with
``Options = CalcOptions`` types ``self.options`` as ``CalcOptions`` (the registry validates the
config's ``env.options`` block against ``Options`` before the env is made, so an env never
re-validates its own options).
"""

from __future__ import annotations

import inspect
import traceback
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel, ConfigDict

from horizonrl.envs.tools import Tool, ToolArgumentError, collect_tools
from horizonrl.errors import HorizonError
from horizonrl.types import Action, Message, StepResult, Task, ToolCall, ToolSpec, Trajectory, read_tasks


class ScriptedPolicy(Protocol):
    """A policy written as code (an oracle): given the task and the conversation so far, the text of
    the next assistant turn, in the same tool-call format a model writes."""

    def act(self, task: Task, messages: list[Message]) -> str: ...


@runtime_checkable
class TurnPolicy(ScriptedPolicy, Protocol):
    """A scripted policy whose turns must be awaited (agent code in a sandbox that consults the
    model): the agent loop calls ``act_turn`` instead of ``act``."""

    async def act_turn(
        self, episode_id: str, task: Task, messages: list[Message], tools: list[ToolSpec]
    ) -> str: ...


class EnvOptions(BaseModel):
    """Base for an env's options (the ``env.options`` block of a config). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


OptionsT = TypeVar("OptionsT", bound=EnvOptions)


class Env(ABC, Generic[OptionsT]):
    """An async, stateful environment for one episode at a time.

    Attributes every env has (set by ``Env.__init__``, so a subclass that defines ``__init__`` must
    call ``super().__init__(options)``):

    - ``options``: the env's validated options, an instance of its ``Options`` model (typed
      ``OptionsT``); the defaults of ``Options`` when none are given.
    - ``tools``: the tool specs shown to the model (OpenAI "tools" format); a fresh empty list per
      instance by default (a free-text env keeps it empty; :class:`ToolEnv` fills it from its
      ``@tool`` methods).
    - ``metrics``: numbers about the episode (e.g. ``{"success": 1.0}``, per-test results), a
      fresh empty dict per instance by default. The agent loop copies them into the trajectory's
      ``metrics`` after :meth:`evaluate`, so an env sets them in ``reset``/``step``/``evaluate``;
      an env reused for several episodes resets them in ``reset``.
    """

    name: ClassVar[str] = ""
    #: The options model; the registry validates a config's ``env.options`` against it.
    Options: ClassVar[type[EnvOptions]] = EnvOptions
    #: True for envs whose action is the model's free text (text games): a turn without a readable
    #: tool call goes to ``step`` as ``Action(text, tool_calls=[])`` instead of getting the
    #: malformed-call feedback.
    accepts_text: ClassVar[bool] = False
    #: True for envs whose action is the model's whole reply, read by the env's own parser
    #: (skyrl-gym's ``<sql>…</sql>``, ``#### 42``, ``\boxed{}``): the loop parses no tool calls, sends
    #: no format feedback and never constrains a turn; every reply goes to ``step`` as
    #: ``Action(text)``, and the env says a reply was unreadable by ``StepResult.malformed``.
    text_actions: ClassVar[bool] = False
    options: OptionsT
    tools: list[ToolSpec]
    metrics: dict[str, float]

    def __init__(self, options: OptionsT | None = None) -> None:
        self.options = options if options is not None else cast(OptionsT, self.Options())
        self.tools = []
        self.metrics = {}

    def reply_choices(self) -> tuple[str, ...] | None:
        """For a text-action env whose actions are a fixed set of replies (a gymnasium ``Discrete``
        space's action names), those replies, once ``reset`` has run: with ``agent.constrain`` set,
        the loop holds every turn to exactly one of them. None (the default): replies are free text."""
        return None

    @abstractmethod
    async def reset(self, task: Task) -> list[Message]:
        """Start an episode on ``task``; return the initial messages (system/user)."""

    @abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Execute the model's action; return observation messages, reward and done."""

    async def evaluate(self) -> float | None:
        """Outcome reward computed after the episode (e.g. run the tests), or None to keep the
        reward earned by the steps. Runs in the rollout's eval stage; afterwards the numbers in
        ``self.metrics`` (e.g. per-test results) go into the trajectory's ``metrics``."""
        return None

    async def close(self) -> None:  # an optional hook: most envs hold nothing
        """Release resources (sandboxes, processes). Called once, also after errors.

        Every method runs on the rollout's event loop: do blocking work with ``await
        asyncio.to_thread(...)`` (or a subprocess), or it stalls every other episode and no
        stage timeout can interrupt it."""

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: OptionsT) -> list[Task]:
        """Generate ``n`` tasks of ``split`` deterministically from ``seed`` (``options``: the env's
        validated options).

        Envs without a generator read tasks from a file instead (``env.tasks_file``)."""
        raise HorizonError(
            f"env {cls.name!r} does not generate tasks; give a task file with env.tasks_file=PATH.jsonl"
        )

    @classmethod
    def read_tasks(cls, path: Path, options: OptionsT) -> list[Task]:
        """The tasks in ``path`` (``env.tasks_file``; ``options``: the env's validated options): one
        Task per JSONL line. An env that takes another framework's dataset rows reads those instead."""
        return read_tasks(path)

    @classmethod
    def oracle(cls, options: OptionsT | None = None) -> ScriptedPolicy:
        """A scripted policy that solves this env's tasks (for demonstrations, SFT and tests);
        ``options`` (the env's options) may choose how it writes its turns."""
        raise HorizonError(f"env {cls.name!r} has no scripted oracle")

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        """The task splits ``make_tasks`` understands."""
        return ("train", "test")

    @classmethod
    def answer_of(cls, trajectory: Trajectory) -> str | None:
        """The episode's final answer, read from its record and written so that two samples of a
        task agree exactly when their answers are equal (what maj@k votes on); None when the episode
        states none. The default: the env has no answers, and an eval reports no maj@k for it."""
        return None

    @classmethod
    def has_answers(cls) -> bool:
        """Whether the env says which answers agree (it overrides :meth:`answer_of`)."""
        hook = inspect.getattr_static(cls, "answer_of", None)  # a tool of that name is no hook
        return isinstance(hook, classmethod) and hook.__func__ is not Env.__dict__["answer_of"].__func__

    @classmethod
    def task_group(cls, task: Task) -> str | None:
        """The group an eval also reports a task's figures under: by default the task data's
        ``group``, ``category`` or ``kind`` (the first set); None: no group."""
        for key in ("group", "category", "kind"):
            value = task.data.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
                return str(value)
        return None


def tool_calls_with_results(trajectory: Trajectory) -> list[tuple[ToolCall, str | None]]:
    """Every tool call of the record's assistant turns, in order, with the text of the tool message
    that answered it (matched by call id, else by position; None when none did)."""
    out: list[tuple[ToolCall, str | None]] = []
    pending: list[int] = []  # indices in ``out`` of the last assistant turn's unanswered calls
    for message in trajectory.messages:
        if message.role == "assistant":
            pending = []
            for call in message.tool_calls or []:
                pending.append(len(out))
                out.append((call, None))
        elif message.role == "tool" and pending:
            index = next((i for i in pending if out[i][0].id == message.tool_call_id), pending[0])
            pending.remove(index)
            out[index] = (out[index][0], message.content)
    return out


class ToolResult(BaseModel):
    """What a tool returns when it wants to give a reward or end the episode (a plain value is
    shown to the model as the observation)."""

    content: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = {}


class ToolEnv(Env[OptionsT]):
    """An Env whose actions are calls to its ``@tool`` methods.

    ``step`` runs each tool call in order and answers with one ``tool`` message per call. A call to
    an unknown tool, with bad arguments, or a tool that raises becomes an error observation the model
    can read; the episode goes on.
    """

    def __init__(self, options: OptionsT | None = None) -> None:
        super().__init__(options)
        self._tools: dict[str, Tool] = collect_tools(self)
        self.tools = [t.spec for t in self._tools.values()]

    async def step(self, action: Action) -> StepResult:
        result = StepResult()
        for call in action.tool_calls:
            tool_ = self._tools.get(call.name)
            if tool_ is None:
                content = f"Error: unknown tool {call.name!r}. Available tools: {', '.join(self._tools)}."
                result.info.setdefault("tool_errors", 0)
                result.info["tool_errors"] += 1
            else:
                try:
                    out = await tool_(call.arguments, bound_to=self)
                except ToolArgumentError as exc:
                    content = f"Error: {exc}"
                    result.info["tool_errors"] = result.info.get("tool_errors", 0) + 1
                except Exception as exc:  # a tool failing is an observation, not a crash
                    content = f"Error: {type(exc).__name__}: {exc}"
                    result.info["tool_errors"] = result.info.get("tool_errors", 0) + 1
                    result.info.setdefault("tool_tracebacks", []).append(traceback.format_exc(limit=3))
                else:
                    if isinstance(out, ToolResult):
                        content = out.content
                        result.reward += out.reward
                        result.done = result.done or out.done
                        result.info.update(out.info)
                    else:
                        content = str(out)
            result.observations.append(
                Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
            )
            if result.done:
                break
        return result
