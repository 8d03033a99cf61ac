"""A toy env for trainer tests: rewards that even a tiny random model earns some of the time.

``coin`` takes free text for two turns. The first turn earns a turn reward of 0.25 when the text has
an even number of characters; the episode's reward is 1 when the second turn's text has an odd
number of characters. Samples of one task therefore disagree (groups with signal), the reward is
fully determined by the sampled tokens (reproducible), and there are per-turn rewards.

Import this module to register the env (the subprocess tests do it with ``-c``).

``ParityEnv`` is the same game with options and without registration: configs name it by its
import path, ``env.name=toy_envs:ParityEnv`` (the tests directory is on ``sys.path`` under pytest).
``NotAnEnv`` and ``AbstractEnv`` are there for the registry's error messages.
"""

from __future__ import annotations

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.registry import register_env
from horizonrl.types import Action, Message, StepResult, Task


@register_env
class CoinEnv(Env):
    name = "coin"
    accepts_text = True

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.turn = 0

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options) -> list[Task]:
        return [
            Task(id=f"coin-{split}-{seed}-{i}", env=cls.name, split=split, data={"i": i}) for i in range(n)
        ]

    async def reset(self, task: Task) -> list[Message]:
        return [
            Message(role="system", content="Write anything."),
            Message(role="user", content=f"Toss {task.data['i']}."),
        ]

    async def step(self, action: Action) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            reward = 0.25 if len(action.text) % 2 == 0 else 0.0
            return StepResult(observations=[Message(role="user", content="Again.")], reward=reward)
        return StepResult(reward=float(len(action.text) % 2 == 1), done=True)


class ParityOptions(EnvOptions):
    prefix: str = "parity"


class ParityEnv(CoinEnv, Env[ParityOptions]):
    """The coin game, unregistered, with options (its task ids start with ``options.prefix``)."""

    name = "parity"
    Options = ParityOptions

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: ParityOptions) -> list[Task]:
        return [
            Task(id=f"{options.prefix}-{split}-{seed}-{i}", env=cls.name, split=split, data={"i": i})
            for i in range(n)
        ]

    @classmethod
    def oracle(cls, options: ParityOptions | None = None) -> ParityOracle:
        return ParityOracle()


class ParityOracle:
    """Wins the parity game: an even-length first turn, an odd-length second one."""

    def act(self, task: Task, messages: list[Message]) -> str:
        return "ab" if not any(m.role == "assistant" for m in messages) else "abc"


class NotAnEnv:
    pass


class AbstractEnv(Env):
    async def reset(self, task: Task) -> list[Message]:
        return []
