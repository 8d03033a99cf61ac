"""PPO's critic: a value head on the policy, generalised advantage estimation over its values, and
the clipped value loss. The one algorithm of the suite with learned state beyond the policy
(``train.critic: value_head``, the ``ppo`` preset).

How an RL step uses it (:func:`horizonrl.train.update.train_step`, through :class:`Critic`):

1. **old values** — the no-grad pass before the update runs the head on the same forward pass as the
   old logprobs (:func:`horizonrl.train.logprobs.old_outputs`), one value per model token;
2. **advantages** — :meth:`Critic.advantages`: :func:`gae` over the per-token rewards and those
   values, whitened over the batch, and the returns the value loss regresses to;
3. **loss** — :meth:`Critic.loss`: :func:`value_loss` of each micro-batch (the head runs on the
   gradient pass's forward too), added to the policy loss times ``coef`` (``train.vf_coef``).

:func:`gae` and :func:`value_loss` are pure functions on ``[N, T]`` tensors like the rest of
:mod:`horizonrl.algos`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from horizonrl.algos.advantages import _check_token_tensors, _check_unit, _float_dtype, whiten
from horizonrl.algos.losses import Reduction, _check_2d, _check_same, masked_mean, reduce_loss
from horizonrl.errors import TrainingError

__all__ = ["Critic", "ValueHead", "gae", "make_value_head", "value_loss"]


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
    """A fresh value head for ``model``, on the device its weights are on."""
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if not hidden:
        raise TrainingError("train.critic='value_head' needs a model whose config has hidden_size")
    return ValueHead(int(hidden)).to(next(model.parameters()).device)


@dataclass(frozen=True)
class Critic:
    """The critic's part of an RL step: its ``head``, GAE with ``gamma`` and ``lam``, and the value
    loss clipped at ``clip`` (None: unclipped), reduced by ``reduction`` and weighted by ``coef``."""

    head: Any
    gamma: float = 1.0
    lam: float = 0.95
    coef: float = 0.5
    clip: float | None = 0.2
    reduction: Reduction = "token_mean"

    def advantages(
        self, rewards: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` ``[N, T]``: GAE over ``rewards`` and the critic's ``old_values``,
        the advantages whitened over every masked token of the batch."""
        adv, returns = gae(rewards, old_values, mask, self.gamma, self.lam)
        return whiten(adv, mask), returns

    def loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of a micro-batch (unweighted) and its stats."""
        return value_loss(values, old_values, returns, mask, self.clip, self.reduction)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the masked positions:
    ``(advantages, returns)``, both ``[N, T]``, detached, 0 at masked-out positions.

    Unmasked positions (environment tokens between turns) are not actions and are skipped: the next
    state value of masked position ``t`` is the value at the row's next masked position, and 0 after
    the last one (terminal)::

        delta_t = r_t + gamma * V_next - V_t
        A_t = delta_t + gamma * lam * A_next
        returns_t = A_t + V_t
    """
    _check_token_tensors(rewards=rewards, values=values, mask=mask)
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    valid = mask != 0
    dtype = _float_dtype(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).detach().to(dtype)
    v = torch.where(valid, values, torch.zeros_like(values)).detach().to(dtype)
    rows, vals, keep = r.tolist(), v.tolist(), valid.tolist()
    out = [[0.0] * len(row) for row in rows]
    for i, row in enumerate(rows):
        next_value = 0.0
        next_adv = 0.0
        for t in range(len(row) - 1, -1, -1):
            if not keep[i][t]:
                continue
            delta = row[t] + gamma * next_value - vals[i][t]
            next_adv = delta + gamma * lam * next_adv
            out[i][t] = next_adv
            next_value = vals[i][t]
    adv = torch.tensor(out, dtype=dtype, device=r.device).reshape(r.shape)
    return adv, torch.where(valid, adv + v, torch.zeros_like(adv))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
    reduction: Reduction = "token_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``.

    All ``[N, T]``; ``values`` carry the gradient, ``old_values`` (the critic before this update) and
    ``returns`` are constants. ``clip_range=None`` gives the unclipped ``0.5 * (V - R)^2``. Stats:
    ``vf_clip_frac`` (fraction of masked tokens where the clipped term is larger) and ``value_mean``.
    """
    _check_2d("values", values)
    _check_same("old_values", old_values, "values", values)
    _check_same("returns", returns, "values", values)
    _check_same("mask", mask, "values", values)
    if clip_range is not None and not clip_range > 0:
        raise ValueError(f"clip_range must be > 0 (or None); got {clip_range}")
    valid = mask != 0
    zeros = torch.zeros_like(values)
    v = torch.where(valid, values, zeros)
    old = torch.where(valid, old_values.detach().to(values.dtype), zeros)
    ret = torch.where(valid, returns.detach().to(values.dtype), zeros)
    plain = (v - ret).square()
    per_token = plain
    chosen = torch.zeros_like(valid)
    if clip_range is not None:
        clipped = (old + torch.clamp(v - old, -clip_range, clip_range) - ret).square()
        chosen = clipped > plain
        per_token = torch.maximum(plain, clipped)
    loss = reduce_loss(0.5 * per_token, mask, reduction)
    with torch.no_grad():
        stats = {
            "vf_clip_frac": float(masked_mean(chosen.to(values.dtype), valid)),
            "value_mean": float(masked_mean(v, valid)),
        }
    return loss, stats
