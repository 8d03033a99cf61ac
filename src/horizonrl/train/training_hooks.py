"""The features of ``horizon train`` that plug into the training loop as hooks
(:mod:`horizonrl.train.step_hooks`), each switched on by the config alone:

- :class:`FailurePenalties` (``train.failure_penalties``): failures as signals, the reward trained on
  reduced by the penalties of the failure modes found (``rewards``);
- :class:`StaleFilter` (``train.max_staleness``): samples too old for the policy left out
  (``before_update``);
- :class:`ExperienceHook` (``experience.enabled``): the experience pool's notes in the rollouts, its
  extraction after them, the samples stripped and clipped before the update;
- :class:`AttributionHook` (``attribution.enabled``): the judge's per-token advantages;
- :class:`PeakMemory`: the peak resident memory of every step.

:func:`training_hooks` lists them as the config switches them on; :func:`role_stages` builds the LLM
roles they ask and the experience and attribution stages on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.analysis.signals import penalize
from horizonrl.memory import peak_rss_gib
from horizonrl.train.attribution import AttributionStage
from horizonrl.train.experience import ExperienceStage
from horizonrl.train.staleness import filter_stale
from horizonrl.train.step_hooks import StepBatch, StepHook
from horizonrl.types import Task, Trajectory


class FailurePenalties(StepHook):
    """The reward trained on, reduced by the penalties of the failure modes each trajectory shows
    (``annotator``: the annotator role, asked about every trajectory as well)."""

    def __init__(self, penalties: Mapping[str, float], annotator: Any = None) -> None:
        self.penalties = penalties
        self.annotator = annotator

    def rewards(
        self, step: int, rollout: Sequence[Trajectory], kept: list[Trajectory], metrics: dict[str, float]
    ) -> list[Trajectory]:
        shaped, signal_metrics = penalize(kept, self.penalties, self.annotator)
        metrics.update(signal_metrics)
        return shaped


class StaleFilter(StepHook):
    """Samples whose policy version lags the engine's by more than ``max_staleness`` left out (or
    kept, importance-weighted), and samples that mix versions always."""

    def __init__(self, version: Callable[[], int], max_staleness: int, stale_samples: Any) -> None:
        self.version = version
        self.max_staleness = max_staleness
        self.stale_samples = stale_samples

    def before_update(self, step: int, batch: StepBatch) -> None:
        batch.trainable, version_metrics = filter_stale(
            batch.trainable, self.version(), self.max_staleness, self.stale_samples
        )
        batch.metrics.update(version_metrics)


class ExperienceHook(StepHook):
    """The experience pool in the loop: learn from the samples, then train on them stripped."""

    def __init__(self, stage: ExperienceStage) -> None:
        self.stage = stage

    def on_fresh_start(self) -> dict[str, float]:
        return self.stage.seed_pool()

    def load(self, checkpoint: Path) -> None:
        self.stage.load(checkpoint)

    def write_extras(self, checkpoint: Path) -> None:
        self.stage.save(checkpoint)

    def before_rollout(self, step: int, tasks: Sequence[Task]) -> dict[str, str] | None:
        return self.stage.notes(tasks)

    def before_update(self, step: int, batch: StepBatch) -> None:
        batch.metrics.update(asyncio.run(self.stage.extract(batch.sampled, step)))
        batch.trainable, batch.clip_high, experience_metrics = self.stage.prepare(batch.trainable)
        batch.metrics.update(experience_metrics)


class AttributionHook(StepHook):
    """The judge labels the trainable samples' steps before the weights move; their per-token
    advantages replace the algorithm's (its labels recorded in ``run_dir/attribution/``)."""

    def __init__(self, stage: AttributionStage, run_dir: Path) -> None:
        self.stage = stage
        self.run_dir = run_dir

    def load(self, checkpoint: Path) -> None:
        self.stage.load(checkpoint)

    def write_extras(self, checkpoint: Path) -> None:
        self.stage.save(checkpoint)

    def before_update(self, step: int, batch: StepBatch) -> None:
        if not batch.trainable:
            return
        record = self.run_dir / "attribution" / f"step_{step:06d}.jsonl"
        batch.token_advantages, attribution_metrics = asyncio.run(
            self.stage.advantages(batch.trainable, record)
        )
        batch.metrics.update(attribution_metrics)


class PeakMemory(StepHook):
    """``peak_rss_gib``: the peak resident memory so far, in every step's metrics."""

    def after_update(self, step: int, batch: StepBatch, metrics: dict[str, Any]) -> None:
        metrics["peak_rss_gib"] = peak_rss_gib()


@dataclass
class RoleStages:
    """The LLM roles a training run asks and the stages built on them."""

    #: name -> client of every role the run asks (whose calls and tokens it counts)
    used_roles: dict[str, Any] = field(default_factory=dict)
    annotator: Any = None
    experience: ExperienceStage | None = None
    attribution: AttributionStage | None = None


def role_stages(config: Any, engine: Any, tokenizer: Any, env_factory: Callable[[], Any]) -> RoleStages:
    """The roles ``config`` asks for (the annotator of ``train.failure_judge``, the extractor of
    ``experience.enabled``, the judge of ``attribution.enabled``), served by ``engine`` unless
    ``roles`` names another, and the experience and attribution stages on them."""
    cfg = config
    if not (cfg.experience.enabled or cfg.attribution.enabled or cfg.train.failure_judge):
        return RoleStages()
    from horizonrl.roles import Roles

    roles = Roles(cfg.roles, engine, tokenizer)
    wanted = [
        name
        for name, on in (
            ("annotator", cfg.train.failure_judge),
            ("extractor", cfg.experience.enabled),
            ("judge", cfg.attribution.enabled),
        )
        if on
    ]
    built = RoleStages({name: roles.get(name) for name in wanted})
    built.annotator = built.used_roles.get("annotator")
    if cfg.experience.enabled:
        tools = [t.name for t in env_factory().tools] or None  # None: they vary by task
        built.experience = ExperienceStage(cfg.experience, built.used_roles["extractor"], tokenizer, tools)
    if cfg.attribution.enabled:
        built.attribution = AttributionStage(cfg.attribution, built.used_roles["judge"])
    return built


def training_hooks(
    config: Any, stages: RoleStages, version: Callable[[], int], run_dir: Path
) -> list[StepHook]:
    """``horizon train``'s hooks, in the order the loop calls them: failure penalties (when
    ``train.failure_penalties`` names any), the staleness filter (``version``: the engine's weights
    version), experience and attribution (when their stages are built), and the peak memory."""
    tc = config.train
    hooks: list[StepHook] = []
    if tc.failure_penalties:  # failures as signals: the reward trained on is shaped
        hooks.append(FailurePenalties(tc.failure_penalties, stages.annotator))
    hooks.append(StaleFilter(version, tc.max_staleness, tc.stale_samples))
    if stages.experience is not None:  # learn from the samples, then train on them stripped
        hooks.append(ExperienceHook(stages.experience))
    if stages.attribution is not None:  # the judge labels before the weights move
        hooks.append(AttributionHook(stages.attribution, run_dir))
    hooks.append(PeakMemory())
    return hooks
