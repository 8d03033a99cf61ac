"""A step's rewards → one advantage per trajectory or per model token (``train.advantage``).

- **Sequence-level** (``grpo``, ``rloo``; the GRPO family): one scalar per trajectory, its reward
  against the others of its ``group_id`` group (:func:`horizonrl.algos.advantages.grpo`,
  :func:`~horizonrl.algos.advantages.rloo`), broadcast to its model tokens when batched.
- **Token-level** (``reinforce_pp``, ``reinforce_pp_baseline``, ``gae``): per-token rewards and
  returns, the KL penalty in the reward, the critic's values: :mod:`horizonrl.train.token_advantages`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from horizonrl.algos import advantages as adv_fns
from horizonrl.config import TrainConfig
from horizonrl.errors import DataError, TrainingError
from horizonrl.train.batching import Advantage
from horizonrl.types import Trajectory


@dataclass
class Advantages:
    """The advantages of a step's trajectories, in their order: a scalar or one value per response
    token each; with a critic the ``returns`` (per response token) its value loss regresses to."""

    values: list[Advantage]
    returns: list[list[float]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def weigh_negatives(values: Sequence[Advantage], weight: float) -> list[Advantage]:
    """``values`` with every negative advantage (a scalar, or a token's) multiplied by ``weight``;
    unchanged at 1, only the positive part at 0."""
    if weight == 1.0:
        return list(values)

    def weigh(a: float) -> float:
        return a * weight if a < 0 else a

    return [weigh(v) if isinstance(v, (int, float)) else [weigh(a) for a in v] for v in values]


def check_rewards(trajectories: Sequence[Trajectory]) -> None:
    """Raise naming the first trajectory with a NaN/inf reward or turn reward, or when there are none."""
    if not trajectories:
        raise DataError("the step produced no trajectories (an empty batch): nothing to train on")
    for traj in trajectories:
        if not math.isfinite(traj.reward):
            raise TrainingError(f"trajectory {traj.id!r} has a non-finite reward ({traj.reward})")
        bad = [r for r in traj.turn_rewards if not math.isfinite(r)]
        if bad:
            raise TrainingError(f"trajectory {traj.id!r} has non-finite turn rewards ({bad[:3]})")


def sequence_advantages(trajectories: Sequence[Trajectory], cfg: TrainConfig) -> list[float]:
    """One advantage per trajectory within its ``group_id`` group (``grpo`` or ``rloo``)."""
    check_rewards(trajectories)
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    groups = [t.group_id for t in trajectories]
    if cfg.advantage == "rloo":
        values = adv_fns.rloo(rewards, groups)
    else:
        values = adv_fns.grpo(rewards, groups, norm_by_std=bool(cfg.norm_by_std))
    return [float(v) for v in values]


def group_advantages(trajectories: Sequence[Trajectory], cfg: TrainConfig) -> Advantages:
    """The sequence-level advantages of ``trajectories`` (``grpo`` or ``rloo``), and
    ``groups_zero_advantage``: the groups whose advantages are all 0 (no signal)."""
    values = sequence_advantages(trajectories, cfg)
    with_signal = {t.group_id for a, t in zip(values, trajectories, strict=True) if a != 0.0}
    flat = {t.group_id for t in trajectories} - with_signal
    return Advantages(list(values), metrics={"groups_zero_advantage": float(len(flat))})
