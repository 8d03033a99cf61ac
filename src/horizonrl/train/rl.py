"""GRPO on multi-turn trajectories: one policy update from one step's groups of rollouts.

For each task, G rollouts form a group. A trajectory's advantage is its reward minus the group mean
(divided by the group's std unless ``norm_by_std`` is off: Dr.GRPO), broadcast to every token the
model generated in it (``loss_mask == 1``; prompt and observation tokens get no loss). The loss is
PPO-clip with separate low/high clip (DAPO's clip-higher) on the ratio of the current policy to the
policy that sampled, optionally plus a KL penalty to the starting policy (LoRA: the base weights with
the adapter switched off).

One update per rollout batch: the "old" logprobs are those of the same forward pass, detached — the
ratio is 1 and clipping inactive, and the gradient equals the policy gradient at the sampled policy.
(The sampler may run in bfloat16 and the trainer in float32, so recomputing here rather than
trusting the sampler's logprobs keeps the gradient exact.)

Trajectories whose advantage is 0 (groups where every rollout got the same reward) carry no policy
gradient and are skipped without a forward pass when there is no KL term. Trajectories that failed
(finish "error"/"timeout") are handled before this function by the rollout's failure policy
(:mod:`horizonrl.rollout.failures`). Non-finite rewards raise naming the trajectory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.algos import advantages as adv_fns
from horizonrl.algos import kl as kl_fns
from horizonrl.algos import losses
from horizonrl.config import TrainConfig
from horizonrl.errors import DataError, TrainingError
from horizonrl.train.batching import TokenBatch
from horizonrl.train.logprobs import token_logprobs
from horizonrl.train.update import accumulate_gradients, optimizer_step
from horizonrl.types import Trajectory


def check_rewards(trajectories: Sequence[Trajectory]) -> None:
    """Raise naming the first trajectory with a NaN/inf reward, or when there are none at all."""
    if not trajectories:
        raise DataError("the step produced no trajectories (an empty batch): nothing to train on")
    for traj in trajectories:
        if not math.isfinite(traj.reward):
            raise TrainingError(f"trajectory {traj.id!r} has a non-finite reward ({traj.reward})")


def group_advantages(trajectories: Sequence[Trajectory], norm_by_std: bool) -> list[float]:
    """GRPO advantage of each trajectory within its ``group_id`` group."""
    check_rewards(trajectories)
    groups = Counter(t.group_id for t in trajectories)
    empty = [g for g, n in groups.items() if n == 0]
    if empty:  # pragma: no cover - Counter never yields 0, kept for explicitness
        raise DataError(f"empty groups: {empty}")
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    values = adv_fns.grpo(rewards, [t.group_id for t in trajectories], norm_by_std=norm_by_std)
    return [float(v) for v in values]


def _loss_fn(
    model: Any,
    cfg: TrainConfig,
    total_tokens: int,
    total_rows: int,
    temperature: float,
    autocast_dtype: torch.dtype | None,
):
    def loss_fn(
        logp: torch.Tensor, entropy: torch.Tensor | None, batch: TokenBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask.to(logp.device)
        adv = batch.advantages.to(logp.device)
        pg_loss, stats = losses.ppo_clip(
            logp, logp.detach(), adv, mask, cfg.clip_low, cfg.clip_high, cfg.reduction
        )
        share = (
            batch.num_loss_tokens / max(total_tokens, 1)
            if cfg.reduction == "token_mean"
            else len(batch.ids) / max(total_rows, 1)
        )
        loss = pg_loss * share
        out = {"pg_loss": float(pg_loss.detach()), **{k: float(v) for k, v in stats.items()}}
        if cfg.kl_coef > 0:
            with torch.no_grad(), model.disable_adapter():
                ref, _ = token_logprobs(model, batch, temperature, autocast_dtype)
            kl_tok = kl_fns.estimate(logp, ref, cfg.kl_kind)
            kl = losses.reduce_loss(kl_tok, mask, cfg.reduction)
            loss = loss + cfg.kl_coef * kl * share
            out["kl"] = float(kl.detach())
        if entropy is not None:
            out["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
        return loss, out

    return loss_fn


def grpo_update(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    pad_id: int,
    temperature: float = 1.0,
) -> dict[str, float]:
    """One GRPO optimizer step on a step's trajectories; returns the update's metrics."""
    if cfg.kl_coef > 0 and not hasattr(model, "disable_adapter"):
        raise TrainingError(
            "train.kl_coef > 0 needs a LoRA policy (the reference is the adapter switched off)"
        )
    advantages = group_advantages(trajectories, cfg.norm_by_std)
    keep = [
        i
        for i, t in enumerate(trajectories)
        if sum(t.loss_mask) > 0 and (advantages[i] != 0.0 or cfg.kl_coef > 0)
    ]
    groups = Counter(t.group_id for t in trajectories)
    flat = {
        g for g in groups if all(advantages[i] == 0.0 for i, t in enumerate(trajectories) if t.group_id == g)
    }
    metrics: dict[str, float] = {
        "groups": float(len(groups)),
        "groups_zero_advantage": float(len(flat)),
        "trained_trajectories": float(len(keep)),
    }
    if not keep:
        metrics.update({"loss": 0.0, "grad_norm": 0.0, "update_skipped": 1.0})
        return metrics
    chosen = [trajectories[i] for i in keep]
    total_tokens = sum(sum(t.loss_mask) for t in chosen)
    autocast_dtype = torch.bfloat16 if cfg.autocast == "bfloat16" else None
    model.train()
    stats = accumulate_gradients(
        model,
        chosen,
        [advantages[i] for i in keep],
        _loss_fn(model, cfg, total_tokens, len(chosen), temperature, autocast_dtype),
        pad_id,
        cfg.micro_batch_tokens,
        temperature,
        autocast_dtype,
        with_entropy=True,
    )
    metrics.update(stats)
    metrics["grad_norm"] = optimizer_step(model, optimizer, scheduler, cfg.max_grad_norm)
    metrics["lr"] = scheduler.get_last_lr()[0]
    metrics["update_skipped"] = 0.0
    metrics["trained_tokens"] = float(total_tokens)
    model.eval()
    return metrics
