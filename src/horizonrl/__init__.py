"""HorizonRL: train multi-turn, tool-using LLM agents with reinforcement learning.

The names a Python user needs, from one place (each loaded on first use, so ``import horizonrl``
stays light)::

    import asyncio
    import horizonrl as hz

    cfg = hz.load_config("configs/calc.yaml", ["agent.max_turns=4"])
    rt = hz.build_runtime(cfg)                   # model, tokenizer, batching engine, agent
    tasks = hz.make_tasks(cfg.env, "train", 8, seed=0)
    trajectories = asyncio.run(hz.run_rollouts(rt.agent, hz.env_factory(cfg.env), tasks, samples_per_task=4))
    hz.TrainingRun(cfg).run()                    # what `horizon train` runs

Everything else lives in the subpackages (docs/architecture.md says which does what).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: name -> the module that defines it
_EXPORTS = {
    # recipes and runs
    "RunConfig": "horizonrl.config",
    "load_config": "horizonrl.config",
    "build_runtime": "horizonrl.train.runtime",
    "TrainingRun": "horizonrl.train.run",
    "run_rollouts": "horizonrl.rollout.runner",
    # envs and their tasks
    "Env": "horizonrl.envs.base",
    "ToolEnv": "horizonrl.envs.base",
    "ToolResult": "horizonrl.envs.base",
    "tool": "horizonrl.envs.tools",
    "make_env": "horizonrl.envs.registry",
    "register_env": "horizonrl.envs.registry",
    "make_tasks": "horizonrl.envs.factory",
    "env_factory": "horizonrl.envs.factory",
    # the records
    "Task": "horizonrl.types",
    "Message": "horizonrl.types",
    "Trajectory": "horizonrl.types",
    "read_trajectories": "horizonrl.types",
    "write_trajectories": "horizonrl.types",
}

if TYPE_CHECKING:  # the same names, for type checkers and readers
    from horizonrl.config import RunConfig, load_config
    from horizonrl.envs.base import Env, ToolEnv, ToolResult
    from horizonrl.envs.factory import env_factory, make_tasks
    from horizonrl.envs.registry import make_env, register_env
    from horizonrl.envs.tools import tool
    from horizonrl.rollout.runner import run_rollouts
    from horizonrl.train.run import TrainingRun
    from horizonrl.train.runtime import build_runtime
    from horizonrl.types import Message, Task, Trajectory, read_trajectories, write_trajectories

__all__ = [
    "Env",
    "Message",
    "RunConfig",
    "Task",
    "ToolEnv",
    "ToolResult",
    "TrainingRun",
    "Trajectory",
    "__version__",
    "build_runtime",
    "env_factory",
    "load_config",
    "make_env",
    "make_tasks",
    "read_trajectories",
    "register_env",
    "run_rollouts",
    "tool",
    "write_trajectories",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'horizonrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
