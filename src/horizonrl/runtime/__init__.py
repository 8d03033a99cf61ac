"""Where a run's workers live: ``runtime.backend: local`` (everything in this process, the
default) or ``ray`` (env/sandbox workers and engine replicas as Ray actors; :mod:`.ray_backend`).

A backend gives a run two things — the env factory its episodes use and the engine its agent
samples from — and the driver loop and the trainer are the same on both. Ray is an optional
extra (``pip install 'horizonrl[ray]'``), imported only when a recipe chooses it.

A backend reads no recipe: it is handed a :class:`WorkerSpec` (the factories and plain data its
workers are built from) by the system that runs, :func:`horizonrl.train.workers.worker_backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.runtime.config import RuntimeConfig


@dataclass(frozen=True)
class WorkerSpec:
    """What a backend's workers are built from. Whatever goes to a Ray actor is plain data or a
    picklable callable (a module-level function, or a partial of one, travels by reference)."""

    #: makes the run's env factory (a zero-argument callable: a fresh env per episode)
    env_factory: Callable[[], Callable[[], Any]]
    #: the in-process engine around a loaded base model and its tokenizer
    engine: Callable[[Any, Any], Any]
    #: ray: the env's name (registered, or module:Class) and its options as written, for the env workers
    env_name: str = ""
    env_options: dict[str, Any] = field(default_factory=dict)
    #: ray: builds an engine replica's engine inside its actor (picklable)
    replica_engine: Callable[[], Any] | None = None
    #: ray: what each trainer rank builds and runs (picklable; :class:`~.trainer.RankRecipe`)
    trainer: Any = None
    #: ray: ``engine.dtype`` of the weights sent to the replicas ("auto": the base model's own)
    engine_dtype: str = "auto"


class LocalBackend:
    """Everything in this process: the recipe's env factory and an in-process engine."""

    name = "local"

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    def env_factory(self) -> Callable[[], Any]:
        return self.spec.env_factory()

    def engine(self, base: Any, tokenizer: Any) -> Any:
        return self.spec.engine(base, tokenizer)

    def trainer_group(self) -> None:
        """The driver trains in this process."""
        return None

    def where(self) -> dict[str, Any]:
        return {"backend": "local"}

    def close(self) -> None:
        return None


__all__ = ["LocalBackend", "RuntimeConfig", "WorkerSpec"]
