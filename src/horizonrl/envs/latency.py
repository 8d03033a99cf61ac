"""``latency``: an env that only takes time, for measuring and tuning rollout scheduling.

It stands in for a long-horizon env whose costs are waiting — starting a sandbox (init), running a
command (step), running the tests (eval) — without doing any of it. Each episode lasts a seeded
number of turns (uniform in ``min_turns..max_turns``) whatever the model writes (it accepts free
text), and every reset, step and evaluate sleeps for a duration drawn from a log-normal distribution
with the given mean and sigma (the standard deviation of the log). The reward is 1 for every
completed episode. ``benchmarks/rollout_pipeline.py`` runs the standard workload on it.

Draws are seeded per trajectory: the k-th episode of a task made by one factory
(:meth:`LatencyEnv.factory`) always gets the same turns and latencies, so two schedulers given
fresh factories face the same workload.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import ClassVar

from pydantic import Field

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.types import Action, Message, StepResult, Task


class LatencyOptions(EnvOptions):
    min_turns: int = Field(2, ge=1, description="Fewest turns of an episode.")
    max_turns: int = Field(8, ge=1, description="Most turns of an episode.")
    init_mean_s: float = Field(1.0, ge=0, description="Mean latency of reset (env start-up).")
    init_sigma: float = Field(0.5, ge=0, description="Sigma of the log of the reset latency.")
    step_mean_s: float = Field(0.2, ge=0, description="Mean latency of one step (a tool call).")
    step_sigma: float = Field(1.0, ge=0, description="Sigma of the log of the step latency (heavy tail).")
    eval_mean_s: float = Field(2.0, ge=0, description="Mean latency of evaluate (running the tests).")
    eval_sigma: float = Field(0.5, ge=0, description="Sigma of the log of the evaluate latency.")


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A log-normal draw with the given mean (not median) and log-standard-deviation."""
    if mean <= 0:
        return 0.0
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)


class LatencyEnv(Env[LatencyOptions]):
    name = "latency"
    Options = LatencyOptions
    accepts_text = True
    _shared_draws: ClassVar[Counter[str]] = Counter()

    def __init__(self, options: LatencyOptions | None = None, draws: Counter[str] | None = None) -> None:
        super().__init__(options)
        if self.options.min_turns > self.options.max_turns:
            raise ValueError(
                f"latency env: min_turns ({self.options.min_turns}) > max_turns ({self.options.max_turns})"
            )
        self._draws = draws if draws is not None else self._shared_draws
        self.turn = 0

    @classmethod
    def factory(cls, options: LatencyOptions | None = None) -> Callable[[], LatencyEnv]:
        """An env factory with its own per-task episode counter (a reproducible workload)."""
        draws: Counter[str] = Counter()
        return lambda: cls(options, draws)

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: LatencyOptions) -> list[Task]:
        return [
            Task(
                id=f"latency-{split}-{seed}-{i}",
                env=cls.name,
                split=split,
                data={"seed": f"{split}:{seed}:{i}"},
            )
            for i in range(n)
        ]

    async def reset(self, task: Task) -> list[Message]:
        k = self._draws[task.id]
        self._draws[task.id] += 1
        self.rng = random.Random(f"{task.data.get('seed', task.id)}#{k}")
        o = self.options
        self.turns = self.rng.randint(o.min_turns, o.max_turns)
        await asyncio.sleep(lognormal(self.rng, o.init_mean_s, o.init_sigma))
        return [
            Message(role="system", content="You are exploring a slow environment. Write any action."),
            Message(role="user", content=f"Task {task.id}: act {self.turns} times."),
        ]

    async def step(self, action: Action) -> StepResult:
        await asyncio.sleep(lognormal(self.rng, self.options.step_mean_s, self.options.step_sigma))
        self.turn += 1
        done = self.turn >= self.turns
        return StepResult(observations=[Message(role="user", content=f"Observation {self.turn}.")], done=done)

    async def evaluate(self) -> float:
        await asyncio.sleep(lognormal(self.rng, self.options.eval_mean_s, self.options.eval_sigma))
        return 1.0
