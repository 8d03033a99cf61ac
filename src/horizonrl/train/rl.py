"""One RL update from a step's trajectories: advantages, the policy loss, the optimizer steps.

What runs is chosen by :class:`~horizonrl.config.TrainConfig` alone (``train.algorithm`` presets):

- **Advantages** (:mod:`horizonrl.algos.advantages`): sequence-level ``grpo`` (Dr.GRPO without the
  std) and ``rloo``, one scalar per trajectory broadcast to its model tokens; token-level
  ``reinforce_pp`` / ``reinforce_pp_baseline`` and ``gae`` (with a value head) over per-token rewards:
  the episode reward at the last model token, or with ``reward_placement: per_turn`` each turn's reward
  at that turn's last model token, discounted across turns by ``gamma``; with ``kl_in: reward`` the
  per-token KL to the starting policy is subtracted from those rewards.
- **Policy loss** (:mod:`horizonrl.algos.losses`): ``ppo_clip`` (clip-higher, optional dual clip),
  ``gspo`` (sequence ratio) or ``is``; any reduction; an entropy bonus; KL as a loss term; truncated
  importance weights (``tis_cap``) against the sampler's logprobs; the clipped value loss.
- **Batch shaping**: overlong filtering (trajectories cut by the token budget leave the loss but keep
  their place in their group's baseline). Dynamic sampling happens before, in the rollout loop.

With one optimizer step per rollout batch (``ppo_epochs = mini_batches = 1``) the policy that sampled
is the policy being trained (up to the sampler's precision), so the "old" logprobs are the current
ones detached and no extra forward pass is needed. Several steps per batch, a critic or a KL in the
reward need a no-grad pass first that records the old logprobs, old values and reference logprobs.
Non-finite rewards, logprobs, losses and gradients raise naming the trajectory; nothing is applied.
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
from horizonrl.config import SEQUENCE_ADVANTAGES, TrainConfig
from horizonrl.errors import DataError, TrainingError
from horizonrl.train.batching import TokenBatch, collate, micro_batches, turn_ends, turn_ids
from horizonrl.train.logprobs import policy_forward
from horizonrl.train.update import accumulate_gradients, optimizer_step, shared_prompt_prefix
from horizonrl.types import Trajectory

#: Finish reasons of trajectories cut by the token budget (masked out by ``overlong_filter``).
OVERLONG = ("context_overflow",)


class ValueHead(torch.nn.Module):
    """The critic of PPO: a linear map from the policy's last hidden state to a scalar value,
    initialised to predict 0 (so the first advantages are the returns themselves)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)


def make_value_head(model: Any) -> ValueHead:
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if not hidden:
        raise TrainingError("train.critic='value_head' needs a model whose config has hidden_size")
    return ValueHead(int(hidden))


# ---------------------------------------------------------------------------------------------------
# rewards and advantages


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


def token_rewards(traj: Trajectory, placement: str) -> list[float]:
    """Per-response-token rewards: the episode reward at the last model token and, with
    ``placement='per_turn'``, each turn's reward at that turn's last model token."""
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
) -> tuple[list[list[float]], list[list[float]] | None]:
    """Per-response-token advantages (and GAE returns) of ``reinforce_pp``, ``reinforce_pp_baseline``
    or ``gae`` over the whole batch (the whitening is batch-wide). ``kl_penalty`` (per response
    token, already weighted) is subtracted from the rewards."""
    check_rewards(trajectories)
    width = max((len(t.response_ids) for t in trajectories), default=0)
    rewards = _pad([token_rewards(t, cfg.reward_placement) for t in trajectories], width)
    if kl_penalty is not None:
        rewards = rewards - _pad(kl_penalty, width)
    mask = _pad([t.loss_mask for t in trajectories], width)
    turns = _pad([turn_ids(t.loss_mask) for t in trajectories], width, torch.long)
    returns = None
    if cfg.advantage == "gae":
        if old_values is None:
            raise TrainingError("advantage 'gae' needs the critic's values")
        values = _pad(old_values, width)
        adv, ret = adv_fns.gae(rewards, values, mask, cfg.gamma, cfg.lam)
        adv = adv_fns.whiten(adv, mask)
        returns = [ret[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajectories)]
    else:
        groups = [t.group_id for t in trajectories] if cfg.advantage == "reinforce_pp_baseline" else None
        adv = adv_fns.reinforce_pp(rewards, mask, cfg.gamma, group_ids=groups, turn_ids=turns)
    rows = [adv[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajectories)]
    return rows, returns


# ---------------------------------------------------------------------------------------------------
# the no-grad pass before the update


def _response_rows(values: torch.Tensor, batch_trajs: Sequence[Trajectory]) -> list[list[float]]:
    """Rows of a batch tensor [n, L-1] cut back to each trajectory's response positions."""
    out = []
    for i, traj in enumerate(batch_trajs):
        p = len(traj.prompt_ids)
        out.append(values[i, p - 1 : p - 1 + len(traj.response_ids)].tolist())
    return out


@torch.no_grad()
def old_outputs(
    model: Any,
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    pad_id: int,
    temperature: float,
    autocast_dtype: torch.dtype | None,
    value_head: Any = None,
    with_reference: bool = False,
) -> dict[str, list[list[float]]]:
    """Per-response-token ``old_logprobs`` (and ``old_values``, ``ref_logprobs``) under the policy as
    it is before the update; the reference is the policy with its LoRA adapter switched off. A prompt
    prefix every trajectory shares is computed once (under each of the two policies)."""
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    names = ["old_logprobs"] + (["old_values"] if value_head is not None else [])
    names += ["ref_logprobs"] if with_reference else []
    rows: dict[str, list[list[float] | None]] = {name: [None] * len(trajectories) for name in names}
    was_training = model.training
    model.eval()
    try:
        prefix = shared_prompt_prefix(model, trajectories, cfg.micro_batch_tokens, autocast_dtype)
        ref_prefix = None
        if with_reference and prefix is not None:
            with model.disable_adapter():
                ref_prefix = shared_prompt_prefix(model, trajectories, cfg.micro_batch_tokens, autocast_dtype)
        shared = prefix.length if prefix is not None else 0
        for idx in micro_batches([n - shared for n in lengths], cfg.micro_batch_tokens - shared):
            chosen = [trajectories[i] for i in idx]
            batch = collate(chosen, pad_id)
            out = policy_forward(
                model, batch, temperature, autocast_dtype, value_head=value_head, prefix=prefix
            )
            found: dict[str, torch.Tensor] = {"old_logprobs": out.logprobs}
            if value_head is not None:
                found["old_values"] = out.values
            if with_reference:
                with model.disable_adapter():
                    found["ref_logprobs"] = policy_forward(
                        model, batch, temperature, autocast_dtype, prefix=ref_prefix
                    ).logprobs
            for name, tensor in found.items():
                bad = (~torch.isfinite(tensor)).any(dim=-1).nonzero().flatten().tolist()
                if bad:
                    raise TrainingError(
                        f"non-finite {name} for trajectories {[batch.ids[i] for i in bad][:5]}: "
                        "the weights may have diverged"
                    )
                for i, row in zip(idx, _response_rows(tensor, chosen), strict=True):
                    rows[name][i] = row
    finally:
        model.train(was_training)
    return {name: [r or [] for r in values] for name, values in rows.items()}


# ---------------------------------------------------------------------------------------------------
# the loss of one micro-batch


def _loss_fn(
    model: Any,
    cfg: TrainConfig,
    total_tokens: int,
    total_rows: int,
    temperature: float,
    autocast_dtype: torch.dtype | None,
):
    def loss_fn(
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        batch: TokenBatch,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask.to(logp.device)
        adv = batch.advantages.to(logp.device)
        extras = {k: v.to(logp.device) for k, v in batch.extras.items()}
        old = extras.get("old_logprobs", logp.detach())
        weights = None
        if cfg.tis_cap is not None:
            sampled = batch.sample_logprobs.to(logp.device)
            weights = losses.truncated_is_weights(old, sampled, mask, cfg.tis_cap)
        if cfg.policy_loss == "ppo_clip":
            pg_loss, stats = losses.ppo_clip(
                logp, old, adv, mask, cfg.clip_low, cfg.clip_high, cfg.reduction, cfg.dual_clip, weights
            )
        elif cfg.policy_loss == "gspo":
            pg_loss, stats = losses.gspo(
                logp, old, adv, mask, cfg.clip_low, cfg.clip_high, cfg.reduction, is_weights=weights
            )
        else:
            pg_loss, stats = losses.importance_sampling(
                logp, old, adv, mask, cfg.reduction, is_weights=weights
            )
        share = (
            batch.num_loss_tokens / max(total_tokens, 1)
            if cfg.reduction == "token_mean"
            else len(batch.ids) / max(total_rows, 1)
        )
        loss = pg_loss * share
        out = {"pg_loss": float(pg_loss.detach()), **{k: float(v) for k, v in stats.items()}}
        out.update(_sampler_gap(logp.detach(), batch.sample_logprobs.to(logp.device), mask))
        if weights is not None:
            out["tis_weight_mean"] = float(losses.masked_mean(weights, mask))
        if cfg.kl_coef > 0:
            ref = extras.get("ref_logprobs")
            if ref is None:
                with torch.no_grad(), model.disable_adapter():
                    ref = policy_forward(model, batch, temperature, autocast_dtype).logprobs
            kl = losses.reduce_loss(kl_fns.estimate(logp, ref, cfg.kl_kind), mask, cfg.reduction)
            if cfg.kl_in == "loss":
                loss = loss + cfg.kl_coef * kl * share
            out["kl"] = float(kl.detach())
        if entropy is not None:
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * losses.entropy_bonus(entropy, mask, cfg.reduction) * share
            out["entropy"] = float(losses.masked_mean(entropy.detach(), mask))
        if values is not None:
            vf_loss, vf_stats = losses.value_loss(
                values, extras["old_values"], extras["returns"], mask, cfg.vf_clip, cfg.reduction
            )
            loss = loss + cfg.vf_coef * vf_loss * share
            out["vf_loss"] = float(vf_loss.detach())
            out.update({k: float(v) for k, v in vf_stats.items()})
        return loss, out

    return loss_fn


def _sampler_gap(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
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


# ---------------------------------------------------------------------------------------------------
# the update


def _has_signal(advantage: float | Sequence[float]) -> bool:
    if isinstance(advantage, (int, float)):
        return advantage != 0.0
    return any(a != 0.0 for a in advantage)


def _part_extras(extras: dict[str, list[list[float]]], part: list[int]) -> dict[str, list[list[float]]]:
    """The per-token loss inputs of the mini-batch ``part``; one that none of its trajectories has
    (the old logprobs of a first mini-batch, which are its current ones) is left out."""
    out = {}
    for name, rows in extras.items():
        present = [bool(rows[i]) for i in part]
        if all(present):
            out[name] = [rows[i] for i in part]
        elif any(present):
            raise RuntimeError(f"policy_update: {name!r} was computed for only part of a mini-batch")
    return out


def _split(items: list[int], parts: int) -> list[list[int]]:
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)] if items else []


def policy_update(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    pad_id: int,
    temperature: float = 1.0,
    value_head: Any = None,
    seed: int = 0,
) -> dict[str, float]:
    """The optimizer step(s) of one rollout batch under ``cfg``; returns the update's metrics.

    ``seed`` orders the mini-batches when there are several updates per batch (the same in a resumed
    run). Trajectories are used in the order given (task order), so results do not depend on which
    episode finished first."""
    if cfg.kl_coef > 0 and not hasattr(model, "disable_adapter"):
        raise TrainingError(
            "train.kl_coef > 0 needs a LoRA policy (the reference is the adapter switched off)"
        )
    if cfg.critic == "value_head" and value_head is None:
        raise TrainingError("train.critic='value_head' but no value head was given to the update")
    check_rewards(trajectories)
    trajs = list(trajectories)
    groups = Counter(t.group_id for t in trajs)
    with_tokens = [i for i, t in enumerate(trajs) if sum(t.loss_mask) > 0 and t.prompt_ids]
    overlong = {i for i in with_tokens if cfg.overlong_filter and trajs[i].finish in OVERLONG}
    autocast_dtype = cfg.autocast_dtype
    metrics: dict[str, float] = {"groups": float(len(groups)), "overlong_filtered": float(len(overlong))}

    kl_reward = cfg.kl_in == "reward" and cfg.kl_coef > 0

    def old_of(indices: list[int]) -> dict[str, list[list[float]]]:
        """The no-grad pass over ``trajs[indices]``, its rows at their batch positions ([] elsewhere)."""
        found = old_outputs(
            model,
            [trajs[i] for i in indices],
            cfg,
            pad_id,
            temperature,
            autocast_dtype,
            value_head,
            with_reference=kl_reward,
        )
        rows_at: dict[str, list[list[float]]] = {name: [[] for _ in trajs] for name in found}
        for name, rows in found.items():
            for i, row in zip(indices, rows, strict=True):
                rows_at[name][i] = row
        return rows_at

    # the critic's values and the KL-penalised rewards go into the advantages: all trajectories need them
    old: dict[str, list[list[float]]] = {}
    if (value_head is not None or kl_reward) and with_tokens:
        old = old_of(with_tokens)

    advantages: list[float] | list[list[float]]
    if cfg.advantage in SEQUENCE_ADVANTAGES:
        advantages = sequence_advantages(trajs, cfg)
        flat = {
            g
            for g in groups
            if all(a == 0.0 for a, t in zip(advantages, trajs, strict=True) if t.group_id == g)
        }
        metrics["groups_zero_advantage"] = float(len(flat))
    else:
        penalty = None
        if kl_reward:
            penalty = []
            for i, t in enumerate(trajs):
                if not old["old_logprobs"][i]:
                    penalty.append([0.0] * len(t.response_ids))
                    continue
                lp, ref = torch.tensor(old["old_logprobs"][i]), torch.tensor(old["ref_logprobs"][i])
                kl_tok = kl_fns.estimate(lp, ref, cfg.kl_kind) * torch.tensor(
                    t.loss_mask, dtype=torch.float32
                )
                penalty.append((cfg.kl_coef * kl_tok).tolist())
        values = old.get("old_values")
        if values is not None:
            values = [row or [0.0] * len(t.response_ids) for row, t in zip(values, trajs, strict=True)]
        advantages, returns = token_advantages(trajs, cfg, values, penalty)
        if returns is not None:
            old["returns"] = returns

    always = cfg.kl_coef > 0 or cfg.entropy_coef > 0 or value_head is not None
    keep = [i for i in with_tokens if i not in overlong and (always or _has_signal(advantages[i]))]
    metrics["trained_trajectories"] = float(len(keep))
    if not keep:
        metrics.update({"loss": 0.0, "grad_norm": 0.0, "update_skipped": 1.0})
        return metrics

    order_rng = torch.Generator().manual_seed(seed)
    epochs = [
        _split(
            [keep[j] for j in torch.randperm(len(keep), generator=order_rng).tolist()]
            if cfg.updates_per_step > 1
            else keep,
            cfg.mini_batches,
        )
        for _ in range(cfg.ppo_epochs)
    ]
    if not old and cfg.updates_per_step > 1:
        # The first mini-batch is trained before any step: its current logprobs, detached, are its
        # old ones. Only the trajectories trained after a step need the pass before the update.
        first = set(epochs[0][0]) if cfg.ppo_epochs == 1 else set()
        later = [i for i in keep if i not in first]
        if later:
            old = old_of(later)
    extras_all = {name: rows for name, rows in old.items() if name != "ref_logprobs" or cfg.kl_in == "loss"}
    model.train()
    totals: dict[str, float] = {}
    norms: list[float] = []
    for part in (part for parts in epochs for part in parts):
        chosen = [trajs[i] for i in part]
        total_tokens = sum(sum(t.loss_mask) for t in chosen)
        stats = accumulate_gradients(
            model,
            chosen,
            [advantages[i] for i in part],
            _loss_fn(model, cfg, total_tokens, len(chosen), temperature, autocast_dtype),
            pad_id,
            cfg.micro_batch_tokens,
            temperature,
            autocast_dtype,
            with_entropy=True,
            entropy_grad=cfg.entropy_coef > 0,
            value_head=value_head,
            extras=_part_extras(extras_all, part),
        )
        norms.append(optimizer_step(model, optimizer, scheduler, cfg.max_grad_norm))
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
    updates = len(norms)
    metrics.update({key: value / updates for key, value in totals.items()})
    metrics["grad_norm"] = sum(norms) / updates
    metrics["optimizer_steps"] = float(updates)
    metrics["lr"] = scheduler.get_last_lr()[0]
    metrics["update_skipped"] = 0.0
    metrics["trained_tokens"] = float(sum(sum(trajs[i].loss_mask) for i in keep))
    model.eval()
    return metrics
