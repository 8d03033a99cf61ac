"""What ``train.algorithm`` makes of an RL step, chosen once from the config: :class:`Algorithm`.

The GRPO family (``grpo``, ``dr_grpo``, ``dapo``, ``rloo``) is the plain case: sequence-level
advantages and the clipped PPO surrogate, nothing else. The other presets and options add hooks,
each in its own module:

- the **advantage estimator**: sequence-level (:func:`horizonrl.train.advantages.group_advantages`)
  or token-level, REINFORCE++ and GAE (:func:`horizonrl.train.token_advantages.token_level_advantages`);
- the **policy loss** (:func:`policy_loss_for`): ``ppo_clip`` (with its dual clip), ``gspo``
  (sequence-level ratio) or ``is``, from :mod:`horizonrl.algos.losses`;
- PPO's **critic** (:class:`horizonrl.algos.critic.Critic`): old values, GAE, the value loss;
- the **KL** to the starting policy (:class:`horizonrl.train.kl_penalty.KLPenalty`), in the reward
  or in the loss;
- truncated importance weights (``tis_cap``) and the entropy bonus, two terms of the loss.

The loss of one micro-batch (:meth:`Algorithm.loss_fn`), scaled by its share of the mini-batch::

    loss = policy_loss + kl_coef * KL [kl_in: loss] - entropy_coef * entropy + vf_coef * value_loss
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from horizonrl.algos import kl as kl_fns
from horizonrl.algos import losses
from horizonrl.algos.critic import Critic
from horizonrl.config import SEQUENCE_ADVANTAGES, TrainConfig
from horizonrl.errors import TrainingError
from horizonrl.train.advantages import Advantages, group_advantages
from horizonrl.train.batching import TokenBatch
from horizonrl.train.gradients import LossFn
from horizonrl.train.kl_penalty import KLPenalty
from horizonrl.train.token_advantages import token_level_advantages
from horizonrl.types import Trajectory

#: policy_loss(logp, old_logp, adv, mask, is_weights=None) -> (loss, stats), all [N, T] but adv [N] or
#: [N, T] and the weights: a loss of :mod:`horizonrl.algos.losses` with its settings bound.
PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def policy_loss_for(cfg: TrainConfig) -> PolicyLoss:
    """``train.policy_loss`` with its clip ranges, reduction and (``ppo_clip``) dual clip bound."""
    clip = {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high}
    return {
        "ppo_clip": partial(losses.ppo_clip, **clip, reduction=cfg.reduction, dual_clip=cfg.dual_clip),
        "gspo": partial(losses.gspo, **clip, reduction=cfg.reduction),
        "is": partial(losses.importance_sampling, reduction=cfg.reduction),
    }[cfg.policy_loss]


def critic_for(cfg: TrainConfig, value_head: Any) -> Critic | None:
    """PPO's critic around ``value_head`` when ``train.critic`` is ``value_head``; else None."""
    if cfg.critic != "value_head":
        if value_head is not None:
            raise TrainingError("a value head was given to the update but train.critic is 'none'")
        return None
    if value_head is None:
        raise TrainingError("train.critic='value_head' but no value head was given to the update")
    return Critic(value_head, cfg.gamma, cfg.lam, cfg.vf_coef, cfg.vf_clip, cfg.reduction)


def sampler_gap(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's logprobs of the sampled tokens are from the sampler's: the KL estimate
    k3 of sampler to trainer and the mean absolute log-ratio (a diagnostic of the bfloat16 sampler
    against the training arithmetic; after a batch's first optimizer step it also holds that step's
    change)."""
    if not bool((mask > 0).any()):
        return {}
    return {
        "sampler_kl": float(losses.masked_mean(kl_fns.estimate(logp, sampled, "k3"), mask)),
        "sampler_abs_log_ratio": float(losses.masked_mean((logp - sampled).abs(), mask)),
    }


@dataclass(frozen=True)
class Algorithm:
    """The hooks of an RL step under one config (build it with :meth:`from_config`)."""

    cfg: TrainConfig
    policy_loss: PolicyLoss
    critic: Critic | None = None
    kl: KLPenalty | None = None

    @classmethod
    def from_config(cls, cfg: TrainConfig, model: Any, value_head: Any = None) -> Algorithm:
        """Refuses a KL without a LoRA policy, and a critic without its value head (or the reverse)."""
        kl = KLPenalty.from_config(cfg, model)
        return cls(cfg, policy_loss_for(cfg), critic_for(cfg, value_head), kl)

    @property
    def advantages_need_old_pass(self) -> bool:
        """Whether the advantages need the no-grad pass first: the critic's values, or the
        reference's logprobs of a KL in the reward."""
        return self.critic is not None or (self.kl is not None and self.kl.in_reward)

    @property
    def trains_zero_advantages(self) -> bool:
        """Whether a trajectory whose advantages are all 0 still has a gradient: a KL, entropy or
        value term in the loss."""
        return self.kl is not None or self.cfg.entropy_coef > 0 or self.critic is not None

    def advantages(self, trajectories: Sequence[Trajectory], old: dict[str, list[list[float]]]) -> Advantages:
        """The step's advantages (``old``: the rows of the no-grad pass, where it ran)."""
        if self.cfg.advantage in SEQUENCE_ADVANTAGES:
            return group_advantages(trajectories, self.cfg)
        return token_level_advantages(trajectories, self.cfg, old, self.critic, self.kl)

    def loss_fn(self, total_tokens: int, total_rows: int) -> LossFn:
        """The loss of a micro-batch of a mini-batch with ``total_tokens`` model tokens in
        ``total_rows`` trajectories, scaled by the micro-batch's share of it (its tokens under
        ``token_mean``, else its rows) so that the accumulated gradient is the mini-batch's."""
        cfg = self.cfg

        def loss_fn(
            logp: torch.Tensor,
            entropy: torch.Tensor | None,
            batch: TokenBatch,
            values: torch.Tensor | None = None,
            logprobs_at: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, dict[str, float]]:
            mask = batch.loss_mask.to(logp.device)
            adv = batch.advantages.to(logp.device)
            extras = {k: v.to(logp.device) for k, v in batch.extras.items()}
            sampled = batch.sample_logprobs.to(logp.device)
            old = extras.get("old_logprobs", logp.detach())  # absent: on-policy, the ratio is 1
            weights = None
            if cfg.tis_cap is not None:
                weights = losses.truncated_is_weights(old, sampled, mask, cfg.tis_cap)
            bounds = {"clip_high": extras["clip_high"]} if "clip_high" in extras else {}
            pg_loss, stats = self.policy_loss(logp, old, adv, mask, is_weights=weights, **bounds)
            share = (
                batch.num_loss_tokens / max(total_tokens, 1)
                if cfg.reduction == "token_mean"
                else len(batch.ids) / max(total_rows, 1)
            )
            loss = pg_loss * share
            out = {"pg_loss": float(pg_loss.detach()), **{k: float(v) for k, v in stats.items()}}
            out.update(sampler_gap(logp.detach(), sampled, mask))
            if weights is not None:
                out["tis_weight_mean"] = float(losses.masked_mean(weights, mask))
                clipped = (old.detach() - sampled) > math.log(cfg.tis_cap)  # weight cut to the cap
                out["tis_clipped_share"] = float(losses.masked_mean(clipped.float(), mask))
            if self.kl is not None:
                kl = self.kl.loss_term(logp, batch, mask, cfg.reduction, logprobs_at)
                if self.kl.in_loss:
                    loss = loss + self.kl.coef * kl * share
                out["kl"] = float(kl.detach())
            if entropy is not None:
                if cfg.entropy_coef > 0:
                    bonus = losses.entropy_bonus(entropy, mask, cfg.reduction)
                    loss = loss - cfg.entropy_coef * bonus * share
                out["entropy"] = float(losses.masked_mean(entropy.detach(), mask))
            if self.critic is not None and values is not None:
                vf_loss, vf_stats = self.critic.loss(values, extras["old_values"], extras["returns"], mask)
                loss = loss + self.critic.coef * vf_loss * share
                out["vf_loss"] = float(vf_loss.detach())
                out.update({k: float(v) for k, v in vf_stats.items()})
            return loss, out

        return loss_fn
