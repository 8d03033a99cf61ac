"""What runs inside the Ray actors: env workers (they hold envs and their sandboxes) and engine
replicas (each an :class:`~horizonrl.engine.hf.HFEngine` of its own). Plain classes: the Ray
backend wraps them with ``ray.remote`` when a run chooses it, so nothing here imports Ray.

Everything that crosses a process boundary is plain data (dicts of pydantic dumps, lists of
ints, a dict of weight tensors in the object store) or a picklable factory the backend was handed
(an engine replica's engine)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from horizonrl.types import Action, Task


class EnvWorker:
    """Holds envs of one kind by id and runs their methods (reset, step, evaluate, close)."""

    def __init__(self, env_name: str, options: dict[str, Any]) -> None:
        from horizonrl.envs.registry import make_env, parse_env_options

        self._options = parse_env_options(env_name, options)
        self._make = lambda: make_env(env_name, self._options)
        self.envs: dict[str, Any] = {}

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def live(self) -> int:
        return len(self.envs)

    async def reset(self, env_id: str, task: dict[str, Any]) -> dict[str, Any]:
        env = self._make()
        self.envs[env_id] = env
        messages = await env.reset(Task.model_validate(task))
        return {
            "name": env.name or type(env).__name__,
            "accepts_text": bool(getattr(env, "accepts_text", False)),
            "text_actions": bool(getattr(env, "text_actions", False)),
            "tools": [t.model_dump() for t in env.tools],
            "messages": [m if isinstance(m, dict) else m.model_dump() for m in messages],
            "metrics": dict(env.metrics),
        }

    async def step(self, env_id: str, action: dict[str, Any]) -> dict[str, Any]:
        env = self.envs[env_id]
        result = await env.step(Action.model_validate(action))
        return {"result": result.model_dump(), "metrics": dict(env.metrics)}

    async def evaluate(self, env_id: str) -> dict[str, Any]:
        env = self.envs[env_id]
        return {"outcome": await env.evaluate(), "metrics": dict(env.metrics)}

    async def close(self, env_id: str) -> None:
        env = self.envs.pop(env_id, None)
        if env is not None:
            await env.close()

    async def close_all(self) -> int:
        ids = list(self.envs)
        for env_id in ids:
            await self.close(env_id)
        return len(ids)


class _Weights:
    """A state dict standing in for a policy in :func:`~horizonrl.engine.weights.copy_weights`."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class EngineWorker:
    """One engine replica: builds its engine with ``make_engine`` (handed by the backend: the
    recipe's base model on the replica's device, :func:`horizonrl.engine.factory.replica_engine`)
    and decodes requests sent to it."""

    def __init__(self, make_engine: Callable[[], Any], cpus: float) -> None:
        import math

        import torch

        # Ray sets OMP_NUM_THREADS to the whole CPUs an actor reserves (1 for 1.5): decode with as
        # many threads as the CPUs it reserved, rounded up
        torch.set_num_threads(max(1, math.ceil(cpus)))
        self.engine = make_engine()

    def info(self) -> dict[str, Any]:
        import ray

        return {
            "max_context": self.engine.max_context,
            "eos_token_ids": sorted(self.engine.eos_token_ids),
            "vocab_size": self.engine.vocab_size,
            "pad_token_id": self.engine.pad_token_id,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    async def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        from horizonrl.engine.base import SamplingParams

        completion = await self.engine.generate(prompt_ids, SamplingParams.model_validate(params))
        return completion.model_dump()

    def update_weights(self, state: dict[str, Any], version: int) -> int:
        """Copy ``state`` (plain weights) into the replica's model; its version becomes ``version``."""
        self.engine.update_weights(_Weights(state))
        self.engine.decoder.weights_version = version
        return version

    def drop_caches(self) -> None:
        self.engine.drop_caches()

    def stats(self) -> dict[str, float]:
        return dict(self.engine.stats)
