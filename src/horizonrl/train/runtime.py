"""A policy loaded to sample from, for every command that plays episodes (rollout, eval, serve,
learn, ...): the model, optionally from a checkpoint, an engine and an agent around it, and the
backend its workers live on (:func:`build_runtime`); and the loader the policy server's
``/v1/horizon/weights`` is handed (:func:`checkpoint_loader`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.agent.loop import Agent
from horizonrl.config import RunConfig
from horizonrl.engine.factory import apply_memory_settings
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_policy
from horizonrl.train.checkpoint import resolve_policy
from horizonrl.train.workers import worker_backend


@dataclass
class Runtime:
    """The objects a rollout or eval needs, built once per command. ``backend`` says where the
    workers live (:mod:`horizonrl.runtime`); ``model`` is the in-process engine's model (None when
    the engine is a router over replicas elsewhere)."""

    model: Any
    tokenizer: Any
    engine: Any
    agent: Agent
    backend: Any = None

    def close(self) -> None:
        """Stop the workers the backend started (a local Ray cluster); nothing for local."""
        if self.backend is not None:
            self.backend.close()


def build_runtime(config: RunConfig, checkpoint: str | Path | None = None) -> Runtime:
    """Load the policy (optionally from ``checkpoint``: a run, a checkpoint, a policy, adapter or
    model directory) and put an engine and an agent around it.

    The engine's model is built as a training run builds its own — the plain base (earlier adapter
    stages merged) copied in ``engine.dtype``, then the last adapter merged in weight by weight — so
    a reloaded policy samples from the same weights the run's evals did."""
    apply_memory_settings(config.engine)
    folder = resolve_policy(Path(checkpoint)) if checkpoint is not None else None
    loaded = load_policy(config.model, folder)
    backend = worker_backend(config)
    try:
        engine = backend.engine(loaded.base, loaded.tokenizer)
        if loaded.adapter is not None or backend.name != "local":
            engine.update_weights(loaded.model())  # replicas load the bare base: send the policy
    except BaseException:
        backend.close()
        raise
    tokenizer = loaded.tokenizer
    del loaded  # the engine holds its own copy
    agent = Agent(tokenizer, engine, config.sampling, config.agent, engine.max_context)
    return Runtime(getattr(engine, "model", None), tokenizer, engine, agent, backend)


def checkpoint_loader(model: ModelConfig) -> Callable[[str], Any]:
    """``load(checkpoint)``: the policy a checkpoint, run, policy or adapter directory holds on
    ``model``'s base, loaded as ``--checkpoint`` does (the policy server's ``/v1/horizon/weights``
    is handed it)."""

    def load(checkpoint: str) -> Any:
        return load_policy(model, resolve_policy(Path(checkpoint))).model()

    return load
