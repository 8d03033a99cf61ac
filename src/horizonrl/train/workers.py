"""Where a run's workers live, built from its recipe: the backend (:func:`worker_backend`) and, on Ray,
what each data-parallel trainer rank builds and runs (:class:`TrainerRecipe`).

A backend (:mod:`horizonrl.runtime`) reads no recipe: it is handed a
:class:`~horizonrl.runtime.WorkerSpec` made here from the recipe's blocks, the env factory
(:func:`horizonrl.envs.factory.env_factory`), the engine (:mod:`horizonrl.engine.factory`) and this
module's trainer recipe, whose update is training's own (:func:`horizonrl.train.update.train_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from horizonrl.config import RunConfig
from horizonrl.engine.factory import apply_memory_settings, engine_from_config, replica_engine
from horizonrl.envs.factory import env_factory
from horizonrl.models import load_base
from horizonrl.runtime import LocalBackend, WorkerSpec
from horizonrl.seeds import derive_seed


def worker_backend(config: RunConfig) -> Any:
    """Where the run's workers live (``config.runtime``): a :class:`~horizonrl.runtime.LocalBackend`,
    or a :class:`~horizonrl.runtime.ray_backend.RayBackend` (a Ray cluster is joined or started
    here). Either is handed the factories and data its workers are built from, made here."""
    make_envs = partial(env_factory, config.env)
    make_engine = partial(engine_from_config, engine=config.engine, model=config.model, seed=config.seed)
    if config.runtime.backend != "ray":
        return LocalBackend(WorkerSpec(env_factory=make_envs, engine=make_engine))
    from horizonrl.runtime.ray_backend import RayBackend

    device = "cuda" if config.runtime.engine_gpus > 0 else "cpu"  # the GPU a replica reserved, or none
    spec = WorkerSpec(
        env_factory=make_envs,
        engine=make_engine,
        env_name=config.env.name,
        env_options=dict(config.env.options),
        replica_engine=partial(replica_engine, config.engine, config.model, config.seed, device),
        trainer=TrainerRecipe(config.model_dump(mode="json")),  # JSON: what travels to the actors
        engine_dtype=config.engine.dtype,
    )
    return RayBackend(config.runtime, spec)


@dataclass
class TrainerRecipe:
    """What each data-parallel trainer rank (:class:`~horizonrl.runtime.trainer.TrainerRank`) builds
    and runs, from the run's config (as JSON, so that it pickles to the rank's actor): the base
    model, the policy, optimizer and schedule the driver builds, and the update under ``train``."""

    config: dict[str, Any]

    @cached_property
    def cfg(self) -> RunConfig:
        return RunConfig.model_validate(self.config)

    def load_base(self, device: str) -> tuple[Any, Any]:
        apply_memory_settings(self.cfg.engine)
        loaded = load_base(self.cfg.model.model_copy(update={"device": device}))
        return loaded.base, loaded.tokenizer

    def build_policy(self, base: Any) -> Any:
        """As the driver's ``TrainingRun._wrap_policy`` builds its own."""
        from horizonrl.trainable import build_policy

        cfg = self.cfg
        return build_policy(
            base,
            cfg.model,
            optim=cfg.train,
            critic=cfg.train.critic,
            init_seed=derive_seed(cfg.seed, "policy_init"),
        )

    def replay(self, tokenizer: Any, base: Any) -> Any:
        """The masks of constrained turns, rebuilt for the update (``agent.constrain``)."""
        from horizonrl.train.constrained import policy_replay

        return policy_replay(self.cfg.agent.constrain, tokenizer, base)

    def train_step(
        self,
        policy: Any,
        optimizer: Any,
        scheduler: Any,
        trajectories: list[Any],
        pad_id: int,
        temperature: float,
        **options: Any,
    ) -> dict[str, float]:
        from horizonrl.train.update import train_step

        return train_step(
            policy, optimizer, scheduler, trajectories, self.cfg.train, pad_id, temperature, **options
        )
