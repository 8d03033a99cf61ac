"""Token-level advantages (``reinforce_pp``, ``reinforce_pp_baseline``, ``gae``): one per model token.

The rewards are per response token: the episode reward at the last model token or, with
``reward_placement: per_turn``, each turn's reward at that turn's last model token and the rest of the
episode reward (what no turn earned: an outcome, or step credit the env took back) at the last one,
so the token rewards always add up to the episode reward (discounted across turns by ``gamma``);
with ``kl_in: reward`` the per-token KL penalty is subtracted from them
(:meth:`horizonrl.train.kl_penalty.KLPenalty.reward_penalty`). Then either REINFORCE++
(:func:`horizonrl.algos.advantages.reinforce_pp`: returns-to-go, minus a group baseline for
``reinforce_pp_baseline`` — the group's mean episode reward, or with ``group_baseline: turn`` its
mean return from the same turn on — whitened over the batch) or, with PPO's critic, GAE over its
values (:meth:`horizonrl.algos.critic.Critic.advantages`, which also gives the returns).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from horizonrl.algos import advantages as adv_fns
from horizonrl.algos.critic import Critic
from horizonrl.config import TrainConfig
from horizonrl.errors import DataError, TrainingError
from horizonrl.train.advantages import Advantages, check_rewards
from horizonrl.train.batching import turn_ends, turn_ids
from horizonrl.train.kl_penalty import KLPenalty
from horizonrl.types import Trajectory


def token_rewards(traj: Trajectory, placement: str) -> list[float]:
    """Per-response-token rewards that add up to the episode reward: all of it at the last model
    token, or with ``placement='per_turn'`` each turn's reward at that turn's last model token and
    the rest (``reward - sum(turn_rewards)``) at the last one. The episode reward is what the env
    scored (the sum of the turns' rewards unless its evaluate() gave an outcome), so a turn's reward
    is never paid twice, and credit the env took back is taken back from the return."""
    out = [0.0] * len(traj.response_ids)
    ends = turn_ends(traj.loss_mask)
    if not ends:
        return out
    if placement == "per_turn":
        if len(traj.turn_rewards) > len(ends):
            raise DataError(
                f"trajectory {traj.id!r} has {len(traj.turn_rewards)} turn rewards for {len(ends)} "
                "model turns"
            )
        for end, reward in zip(ends, traj.turn_rewards, strict=False):
            out[end] += reward
        out[ends[-1]] += traj.reward - sum(traj.turn_rewards)
        return out
    out[ends[-1]] += traj.reward
    return out


def _pad(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def token_advantages(
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    old_values: Sequence[Sequence[float]] | None = None,
    kl_penalty: Sequence[Sequence[float]] | None = None,
    critic: Critic | None = None,
) -> tuple[list[list[float]], list[list[float]] | None]:
    """Per-response-token advantages (and, with ``critic``, GAE returns) over the whole batch (the
    whitening is batch-wide): REINFORCE++, or GAE over the critic's ``old_values``. ``kl_penalty``
    (per response token, already weighted) is subtracted from the rewards."""
    check_rewards(trajectories)
    width = max((len(t.response_ids) for t in trajectories), default=0)
    rewards = _pad([token_rewards(t, cfg.reward_placement) for t in trajectories], width)
    if kl_penalty is not None:
        rewards = rewards - _pad(kl_penalty, width)
    mask = _pad([t.loss_mask for t in trajectories], width)
    returns = None
    if cfg.advantage == "gae":
        if critic is None or old_values is None:
            raise TrainingError("advantage 'gae' needs the critic's values")
        adv, ret = critic.advantages(rewards, _pad(old_values, width), mask)
        returns = [ret[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajectories)]
    else:
        turns = _pad([turn_ids(t.loss_mask) for t in trajectories], width, torch.long)
        groups = [t.group_id for t in trajectories] if cfg.advantage == "reinforce_pp_baseline" else None
        adv = adv_fns.reinforce_pp(
            rewards, mask, cfg.gamma, group_ids=groups, turn_ids=turns, baseline=cfg.group_baseline
        )
    rows = [adv[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajectories)]
    return rows, returns


def token_level_advantages(
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    old: dict[str, list[list[float]]],
    critic: Critic | None = None,
    kl: KLPenalty | None = None,
) -> Advantages:
    """:func:`token_advantages` with the inputs of the no-grad pass ``old``: the KL penalty of a KL
    in the reward, and the critic's old values (zeros for a trajectory the pass did not cover)."""
    penalty = kl.reward_penalty(trajectories, old) if kl is not None and kl.in_reward else None
    values = old.get("old_values")
    if values is not None:
        values = [row or [0.0] * len(t.response_ids) for row, t in zip(values, trajectories, strict=True)]
    rows, returns = token_advantages(trajectories, cfg, values, penalty, critic)
    return Advantages(list(rows), returns)
