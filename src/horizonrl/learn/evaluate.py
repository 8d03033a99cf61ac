"""Evaluation: a candidate plays an env's training levels (episodes for selection and for the
optimizer to read) and its validation levels (its score), through the ordinary rollout pipeline.

The prompt component goes at the end of the env's system message of every episode; an
agent-code component plays the turns from its sandbox (:class:`~horizonrl.learn.agent_code.AgentCodePolicy`);
a model component is the engine's weights. One engine is kept per model and reused while
consecutive candidates share it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from horizonrl.config import RunConfig
from horizonrl.envs.registry import get_env_class, parse_env_options
from horizonrl.errors import ConfigError
from horizonrl.learn.agent_code import AgentCodePolicy
from horizonrl.learn.candidate import Components, Metrics
from horizonrl.learn.config import LearnConfig, LearnEnv
from horizonrl.seeds import derive_seed
from horizonrl.train.eval_records import success_estimate, task_outcomes
from horizonrl.types import Task, Trajectory

PROMPT_HEADER = "\n\nGuidelines:\n"


def prompt_note(prompt: str) -> str:
    """The text a prompt component adds to the env's system message."""
    return PROMPT_HEADER + prompt if prompt.strip() else ""


def env_config(config: RunConfig, env: LearnEnv) -> RunConfig:
    """``config`` with ``env`` as its environment and ``env.overrides`` applied (checked: a bad env
    option or override is a ConfigError naming the env)."""
    from pydantic import ValidationError

    from horizonrl.config import apply_overrides, format_validation_error

    parse_env_options(env.name, env.options)
    data = config.model_dump(mode="json")
    data["env"] = {"name": env.name, "options": dict(env.options)}
    data = apply_overrides(data, list(env.overrides))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, f"learn.envs {env.title()!r} overrides")) from None


def val_split(env: LearnEnv) -> str:
    if env.val_split:
        return env.val_split
    splits = get_env_class(env.name).splits()
    return "val" if "val" in splits else "test"


class Evaluator:
    """Plays candidates; holds one runtime (model, engine, agent) at a time."""

    def __init__(self, config: RunConfig, learn: LearnConfig, run_dir: Path) -> None:
        self.config = config
        self.learn = learn
        self.run_dir = run_dir
        self._runtime: Any = None
        self._model_key: str | None = None
        self._recipes: dict[str, RunConfig] = {}
        self._tasks: dict[str, tuple[list[Task], list[Task]]] = {}

    def recipe(self, env: LearnEnv) -> RunConfig:
        """The recipe with ``env`` as its environment (built once per env)."""
        if env.title() not in self._recipes:
            self._recipes[env.title()] = env_config(self.config, env)
        return self._recipes[env.title()]

    def model_path(self, components: Components) -> str:
        return str(self.run_dir / components.model) if components.model else self.config.model.path

    def runtime(self, components: Components) -> Any:
        from horizonrl.train.runtime import build_runtime

        key = self.model_path(components)
        if self._runtime is None or key != self._model_key:
            self.close()
            cfg = self.config.model_copy(update={"model": self.config.model.model_copy(update={"path": key})})
            self._runtime = build_runtime(cfg)
            self._model_key = key
        return self._runtime

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None
            self._model_key = None

    def tasks(self, env: LearnEnv) -> tuple[list[Task], list[Task]]:
        """``env``'s training and validation levels (the same for every candidate; drawn once)."""
        from horizonrl.envs.factory import make_tasks

        if env.title() not in self._tasks:
            cfg = self.recipe(env)
            n_train, n_val = env.train_tasks or self.learn.train_tasks, env.val_tasks or self.learn.val_tasks
            self._tasks[env.title()] = (
                make_tasks(cfg.env, env.train_split, n_train, self.config.seed),
                make_tasks(cfg.env, val_split(env), n_val, self.config.eval.seed),
            )
        return self._tasks[env.title()]

    def play(
        self, components: Components, env: LearnEnv, tasks: list[Task], temperature: float, label: str
    ) -> tuple[list[Trajectory], int, float]:
        """The candidate's episodes on ``tasks``; (records, generated tokens, wall seconds)."""
        from horizonrl.agent.loop import Agent
        from horizonrl.envs.factory import env_factory
        from horizonrl.rollout.runner import run_rollouts

        runtime = self.runtime(components)
        cfg = self.recipe(env)
        agent = Agent(runtime.tokenizer, runtime.engine, cfg.sampling, cfg.agent, runtime.engine.max_context)
        sampling = cfg.sampling.model_copy(
            update={"temperature": temperature, "seed": derive_seed(self.config.seed, "learn", label)}
        )
        policy = None
        if components.agent_code is not None:
            policy = AgentCodePolicy(
                components.agent_code,
                runtime.engine,
                runtime.tokenizer,
                sampling,
                timeout_s=self.learn.code_timeout_s,
                max_asks=self.learn.code_max_asks,
                label=f"agent-code {env.title()}",
            )
        note = prompt_note(components.prompt)
        before = runtime.engine.stats.get("generated_tokens", 0)
        start = time.perf_counter()

        async def go() -> Any:
            try:
                return await run_rollouts(
                    agent,
                    env_factory(cfg.env),
                    tasks,
                    1,
                    cfg.eval.concurrency,
                    policy=policy,
                    sampling=sampling,
                    mode=cfg.rollout.mode,
                    notes={t.id: note for t in tasks} if note else None,
                    eta=1.0,
                )
            finally:
                if policy is not None:
                    await policy.aclose()

        trajs = list(asyncio.run(go()))
        wall = time.perf_counter() - start
        tokens = int(runtime.engine.stats.get("generated_tokens", 0) - before)
        return trajs, tokens, wall

    def measure(
        self, components: Components, env: LearnEnv
    ) -> tuple[Metrics, list[Trajectory], list[Trajectory]]:
        """Training episodes (sampled at the recipe's temperature) and validation episodes (at
        eval.temperature) of one candidate, and its metrics. Every candidate of an env samples with
        the same seeds."""
        train_tasks, val_tasks = self.tasks(env)
        cfg = self.recipe(env)
        label = env.title()
        train, t_tokens, t_wall = self.play(
            components, env, train_tasks, cfg.sampling.temperature, f"{label}/train"
        )
        val, v_tokens, v_wall = self.play(components, env, val_tasks, cfg.eval.temperature, f"{label}/val")
        rate = success_estimate(task_outcomes(val)) if val else None
        metrics = Metrics(
            train_reward=_mean([t.reward for t in train]),
            train_success=_mean([float(t.success) for t in train]),
            val_reward=_mean([t.reward for t in val]),
            val_success=_mean([float(t.success) for t in val]),
            val_success_low=rate.low if rate else 0.0,
            val_success_high=rate.high if rate else 0.0,
            cost_tokens=v_tokens / max(len(val), 1),
            eval_tokens=t_tokens + v_tokens,
            eval_wall_s=t_wall + v_wall,
            train_episodes=len(train),
            val_episodes=len(val),
            finishes=dict(Counter(t.finish for t in val)),
        )
        return metrics, train, val


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
