"""Policy-gradient and supervised losses over masked token batches.

All per-token tensors are ``[N, T]``: ``N`` sequences padded to ``T`` positions, with ``mask``
(0/1 or bool, same shape) marking the tokens the loss is taken over (the model-written tokens of a
trajectory; prompt, tool observations and padding are 0). Values at masked-out positions never reach
the loss or its gradient, even when they are NaN or inf.

Reductions (:data:`Reduction`) turn per-token losses ``l`` into a scalar; with ``m`` the mask:

- ``token_mean``: ``sum_{i,t} l*m / max(sum_{i,t} m, 1)``, every token in the batch weighs the same
  (DAPO's token-level loss; long sequences weigh more).
- ``seq_mean_token_mean``: mean over sequences with at least one masked token of
  ``sum_t l*m / sum_t m`` (the original GRPO loss; every sequence weighs the same).
- ``seq_mean_token_sum``: mean over those sequences of ``sum_t l*m`` (Dr.GRPO-style, no length
  normalisation inside a sequence).

A batch with no masked token reduces to a 0.0 that stays connected to the autograd graph, so
``loss.backward()`` still works (and yields zero gradients).

:func:`ppo_clip` is the clipped PPO surrogate with DAPO's "clip-higher" (separate lower and upper clip
ranges). With ``ratio = exp(logp - old_logp)`` and advantage ``A``::

    l = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = ["Reduction", "masked_mean", "ppo_clip", "reduce_loss", "sft"]

Reduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]

_REDUCTIONS: tuple[str, ...] = get_args(Reduction)
# exp() of a log-ratio beyond this would overflow float32 (or be clipped anyway); see ppo_clip.
_MAX_LOG_RATIO = 20.0


def _check_2d(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{name}: expected shape [N, T] (2-D), got {tuple(tensor.shape)}")


def _check_same(name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if tensor.shape != ref.shape:
        raise ValueError(
            f"{name}: expected shape {tuple(ref.shape)} (same as {ref_name}), got {tuple(tensor.shape)}"
        )


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values * mask`` with masked-out positions exactly 0 even when ``values`` is NaN/inf there.

    ``torch.where`` (rather than a product) also keeps the gradient at masked-out positions at 0.
    """
    weight = mask.to(values.dtype)
    return torch.where(weight != 0, values * weight, torch.zeros_like(values))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(values * mask) / max(sum(mask), 1)`` over ``dim`` (all elements when None).

    ``mask`` must have ``values``' shape. Where the mask sums to 0 the result is 0 (never NaN).
    """
    _check_same("mask", mask, "values", values)
    weight = mask.to(values.dtype)
    if dim is None:
        return _masked(values, mask).sum() / weight.sum().clamp(min=1)
    return _masked(values, mask).sum(dim) / weight.sum(dim).clamp(min=1)


def reduce_loss(per_token: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Scalar loss from per-token losses ``[N, T]`` under ``mask`` ``[N, T]``; see the module docstring."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(_REDUCTIONS)}; got {reduction!r}")
    _check_2d("per_token", per_token)
    _check_same("mask", mask, "per_token", per_token)
    masked = _masked(per_token, mask)
    weight = mask.to(per_token.dtype)
    if reduction == "token_mean":
        return masked.sum() / weight.sum().clamp(min=1)
    row_sum = masked.sum(dim=1)
    row_count = weight.sum(dim=1)
    has_tokens = row_count > 0
    if reduction == "seq_mean_token_mean":
        row_sum = row_sum / torch.where(has_tokens, row_count, torch.ones_like(row_count))
    per_seq = torch.where(has_tokens, row_sum, torch.zeros_like(row_sum))
    return per_seq.sum() / has_tokens.sum().clamp(min=1).to(per_token.dtype)


def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    reduction: Reduction = "token_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO surrogate loss and its diagnostics.

    ``logp`` (current policy, carries the gradient), ``old_logp`` (behaviour policy) and ``mask`` are
    ``[N, T]``; ``adv`` is ``[N, T]`` or ``[N]`` (one advantage per sequence, broadcast over ``T``).
    ``old_logp`` and ``adv`` are treated as constants (detached). The ratio is clipped to
    ``[1 - clip_low, 1 + clip_high]``; ``clip_high > clip_low`` is DAPO's clip-higher.

    At masked-out positions the log-ratio and the advantage are replaced by 0 before anything else,
    so garbage there (padding, -inf logprobs) cannot produce inf/NaN in the loss or the gradient. The
    log-ratio is also clamped to ``[-20, 20]`` before ``exp``: such ratios are far outside any clip
    range, and the clamp keeps ``exp`` finite in float32.

    Returns ``(loss, stats)`` with float stats over the masked tokens: ``clip_frac`` (fraction where
    the clipped term is strictly chosen: ``ratio > 1 + clip_high`` with ``A > 0`` or
    ``ratio < 1 - clip_low`` with ``A < 0``), ``ratio_mean``, ``ratio_max`` and ``approx_kl``
    (mean of ``0.5 * (logp - old_logp)^2``). Stats are 0.0 when no token is masked.
    """
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1); got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high}")
    _check_2d("logp", logp)
    _check_same("old_logp", old_logp, "logp", logp)
    _check_same("mask", mask, "logp", logp)
    if adv.dim() == 1 and adv.shape[0] == logp.shape[0]:
        adv = adv[:, None].expand_as(logp)
    elif adv.shape != logp.shape:
        raise ValueError(
            f"adv: expected shape {tuple(logp.shape)} or ({logp.shape[0]},) to match logp, "
            f"got {tuple(adv.shape)}"
        )

    valid = mask != 0
    zeros = torch.zeros_like(logp)
    log_ratio = torch.where(valid, logp - old_logp.detach(), zeros).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    adv = torch.where(valid, adv.detach().to(logp.dtype), zeros)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = reduce_loss(per_token, mask, reduction)

    with torch.no_grad():
        n_tokens = int(valid.sum())
        stats = {
            "clip_frac": float(masked_mean((clipped > unclipped).to(logp.dtype), valid)),
            "ratio_mean": float(masked_mean(ratio, valid)),
            "ratio_max": float(ratio[valid].max()) if n_tokens else 0.0,
            "approx_kl": float(masked_mean(0.5 * log_ratio.square(), valid)),
        }
    return loss, stats


def sft(logp: torch.Tensor, mask: torch.Tensor, reduction: Reduction = "token_mean") -> torch.Tensor:
    """Negative log-likelihood of the masked tokens: ``reduce_loss(-logp, mask, reduction)``.

    ``logp`` and ``mask`` are ``[N, T]``; ``logp`` holds the log-probabilities of the target tokens.
    """
    _check_2d("logp", logp)
    _check_same("mask", mask, "logp", logp)
    return reduce_loss(-logp, mask, reduction)
