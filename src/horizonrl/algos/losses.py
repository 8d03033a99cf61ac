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

__all__ = [
    "Reduction",
    "dpo",
    "entropy_bonus",
    "gspo",
    "importance_sampling",
    "masked_mean",
    "ppo_clip",
    "reduce_loss",
    "sft",
    "truncated_is_weights",
]

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


def _per_token(name: str, values: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``values`` as ``[N, T]`` like ``logp``: given per token, or per sequence ``[N]`` (broadcast over T)."""
    if values.dim() == 1 and values.shape[0] == logp.shape[0]:
        return values[:, None].expand_as(logp)
    if values.shape != logp.shape:
        raise ValueError(
            f"{name}: expected shape {tuple(logp.shape)} or ({logp.shape[0]},) to match logp, "
            f"got {tuple(values.shape)}"
        )
    return values


def _prepare(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checked ``(valid, log_ratio, adv)`` for a policy loss: the log-ratio and the advantage are 0 at
    masked-out positions (garbage there cannot reach the loss or the gradient), the log-ratio is
    clamped to ``[-20, 20]`` (``exp`` stays finite in float32), ``adv`` [N] is broadcast over T, and
    ``old_logp`` and ``adv`` are detached."""
    _check_2d("logp", logp)
    _check_same("old_logp", old_logp, "logp", logp)
    _check_same("mask", mask, "logp", logp)
    adv = _per_token("adv", adv, logp)
    valid = mask != 0
    zeros = torch.zeros_like(logp)
    log_ratio = torch.where(valid, logp - old_logp.detach(), zeros).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return valid, log_ratio, torch.where(valid, adv.detach().to(logp.dtype), zeros)


def _weighted(per_token: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    if is_weights is None:
        return per_token
    _check_same("is_weights", is_weights, "logp", per_token)
    return per_token * is_weights.detach().to(per_token.dtype)


def _ratio_stats(ratio: torch.Tensor, log_ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    n_tokens = int(valid.sum())
    return {
        "ratio_mean": float(masked_mean(ratio, valid)),
        "ratio_max": float(ratio[valid].max()) if n_tokens else 0.0,
        "approx_kl": float(masked_mean(0.5 * log_ratio.square(), valid)),
    }


def _check_clip(clip_low: float, clip_high: float | torch.Tensor) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1); got {clip_low}")
    if isinstance(clip_high, torch.Tensor):
        if not bool((clip_high >= 0).all()):
            raise ValueError(
                f"clip_high must be >= 0 at every token; got a minimum of {float(clip_high.min())}"
            )
    elif not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high}")


def _upper_bound(clip_high: float | torch.Tensor, logp: torch.Tensor) -> float | torch.Tensor:
    """``1 + clip_high``: a float, or a detached ``[N, T]`` tensor (given as ``[N, T]`` or ``[N]``)."""
    if not isinstance(clip_high, torch.Tensor):
        return 1.0 + clip_high
    return 1.0 + _per_token("clip_high", clip_high, logp).detach().to(logp.dtype)


def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | torch.Tensor = 0.2,
    reduction: Reduction = "token_mean",
    dual_clip: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO surrogate loss and its diagnostics.

    ``logp`` (current policy, carries the gradient), ``old_logp`` (behaviour policy) and ``mask`` are
    ``[N, T]``; ``adv`` is ``[N, T]`` or ``[N]`` (one advantage per sequence, broadcast over ``T``).
    ``old_logp`` and ``adv`` are treated as constants (detached). The ratio is clipped to
    ``[1 - clip_low, 1 + clip_high]``; ``clip_high > clip_low`` is DAPO's clip-higher. ``clip_high``
    may be a tensor ``[N, T]`` or ``[N]``: a bound per token or per sequence (selective clip
    amplification: a wider bound for experience-guided samples, on-policy ones keep theirs).

    ``dual_clip`` (``c > 1``, Ye et al. 2020): for tokens with ``A < 0`` the loss is further bounded
    by ``-A * c``, so a token whose ratio exploded cannot dominate the update:
    ``l = min(max(-A*ratio, -A*clip(ratio)), -A*c)`` where ``A < 0``. ``is_weights`` ``[N, T]``
    (detached; e.g. :func:`truncated_is_weights`) multiply the per-token loss before the reduction.

    At masked-out positions the log-ratio and the advantage are replaced by 0 before anything else,
    so garbage there (padding, -inf logprobs) cannot produce inf/NaN in the loss or the gradient. The
    log-ratio is also clamped to ``[-20, 20]`` before ``exp``: such ratios are far outside any clip
    range, and the clamp keeps ``exp`` finite in float32.

    Returns ``(loss, stats)`` with float stats over the masked tokens: ``clip_frac`` (fraction where
    the clipped term is strictly chosen: ``ratio > 1 + clip_high`` with ``A > 0`` or
    ``ratio < 1 - clip_low`` with ``A < 0``), ``dual_clip_frac`` (fraction where the dual-clip bound
    is chosen), ``ratio_mean``, ``ratio_max`` and ``approx_kl`` (mean of ``0.5 * (logp -
    old_logp)^2``). Stats are 0.0 when no token is masked.
    """
    _check_clip(clip_low, clip_high)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None); got {dual_clip}")
    valid, log_ratio, adv = _prepare(logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.minimum(
        torch.clamp(ratio, min=1.0 - clip_low), torch.as_tensor(_upper_bound(clip_high, logp))
    )
    per_token = torch.maximum(unclipped, clipped)
    dual_chosen = torch.zeros_like(valid)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_chosen = (adv < 0) & (bound < per_token)
        per_token = torch.where(adv < 0, torch.minimum(per_token, bound), per_token)
    loss = reduce_loss(_weighted(per_token, is_weights), mask, reduction)

    with torch.no_grad():
        stats = {
            "clip_frac": float(masked_mean((clipped > unclipped).to(logp.dtype), valid)),
            "dual_clip_frac": float(masked_mean(dual_chosen.to(logp.dtype), valid)),
            **_ratio_stats(ratio, log_ratio, valid),
        }
    return loss, stats


def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    reduction: Reduction = "seq_mean_token_mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025): the clipped surrogate with one importance ratio per sequence.

    ``s_i = exp(mean over the masked tokens of row i of (logp - old_logp))`` — the geometric mean of
    the token ratios — and, per token, ``s_it = sg(s_i) * exp(logp_it - sg(logp_it))``: its value is
    ``s_i`` and its gradient ``s_i * grad(logp_it)`` (GSPO-token; with one advantage per sequence it
    equals GSPO). ``l_it = max(-A * s_it, -A * clip(s_it, 1 - clip_low, 1 + clip_high))``. Shapes,
    masking, clamping and ``is_weights`` as in :func:`ppo_clip`; clip ranges are much tighter than
    PPO's because a sequence ratio stays close to 1.

    Stats: ``clip_frac`` (fraction of sequences with masked tokens whose ratio was clipped),
    ``ratio_mean`` / ``ratio_max`` (of ``s_i`` over those sequences) and ``approx_kl`` (per token).
    """
    _check_clip(clip_low, clip_high)
    valid, log_ratio, adv = _prepare(logp, old_logp, adv, mask)
    counts = valid.sum(dim=1)
    seq_log_ratio = log_ratio.sum(dim=1) / counts.clamp(min=1).to(logp.dtype)
    seq_ratio = torch.exp(seq_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    safe_logp = torch.where(valid, logp, torch.zeros_like(logp))
    token_ratio = seq_ratio.detach()[:, None] * torch.exp(safe_logp - safe_logp.detach())
    unclipped = -adv * token_ratio
    clipped = -adv * torch.clamp(token_ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = reduce_loss(_weighted(per_token, is_weights), mask, reduction)

    with torch.no_grad():
        rows = counts > 0
        out_of_range = (seq_ratio < 1.0 - clip_low) | (seq_ratio > 1.0 + clip_high)
        n_rows = int(rows.sum())
        stats = {
            "clip_frac": float((out_of_range & rows).sum()) / n_rows if n_rows else 0.0,
            "ratio_mean": float(seq_ratio[rows].mean()) if n_rows else 0.0,
            "ratio_max": float(seq_ratio[rows].max()) if n_rows else 0.0,
            "approx_kl": float(masked_mean(0.5 * log_ratio.square(), valid)),
        }
    return loss, stats


def importance_sampling(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    reduction: Reduction = "token_mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain importance-sampled policy gradient, ``l = -A * exp(logp - old_logp)`` per token, no clip.

    With ``old_logp = logp.detach()`` (on-policy) the gradient is REINFORCE's ``-A * grad(logp)``.
    Shapes, masking, clamping and ``is_weights`` as in :func:`ppo_clip`; stats ``ratio_mean``,
    ``ratio_max``, ``approx_kl``."""
    valid, log_ratio, adv = _prepare(logp, old_logp, adv, mask)
    ratio = torch.exp(log_ratio)
    loss = reduce_loss(_weighted(-adv * ratio, is_weights), mask, reduction)
    with torch.no_grad():
        stats = _ratio_stats(ratio, log_ratio, valid)
    return loss, stats


def truncated_is_weights(
    old_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance weights ``[N, T]`` (TIS; Yao et al. 2025) for samples drawn by a policy
    other than the one being trained — an engine in lower precision, or weights a step stale:
    ``w = min(exp(old_logp - sample_logp), cap)`` at masked positions (log-ratio clamped to
    ``[-20, 20]``), 1.0 elsewhere, detached. ``cap`` must be >= 1."""
    if not cap >= 1.0:
        raise ValueError(f"cap must be >= 1; got {cap}")
    _check_2d("old_logp", old_logp)
    _check_same("sample_logp", sample_logp, "old_logp", old_logp)
    _check_same("mask", mask, "old_logp", old_logp)
    valid = mask != 0
    zeros = torch.zeros_like(old_logp)
    log_w = torch.where(valid, old_logp.detach() - sample_logp.detach(), zeros)
    weights = torch.exp(log_w.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).clamp(max=cap)
    return torch.where(valid, weights, torch.ones_like(weights))


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, reduction: Reduction = "token_mean"
) -> torch.Tensor:
    """The policy's entropy over the masked tokens, reduced like the loss: ``reduce_loss(entropy,
    mask, reduction)``. The trainer subtracts ``entropy_coef`` times it (``entropy`` [N, T] must carry
    the gradient for the bonus to act)."""
    return reduce_loss(entropy, mask, reduction)


def sft(logp: torch.Tensor, mask: torch.Tensor, reduction: Reduction = "token_mean") -> torch.Tensor:
    """Negative log-likelihood of the masked tokens: ``reduce_loss(-logp, mask, reduction)``.

    ``logp`` and ``mask`` are ``[N, T]``; ``logp`` holds the log-probabilities of the target tokens.
    """
    _check_2d("logp", logp)
    _check_same("mask", mask, "logp", logp)
    return reduce_loss(-logp, mask, reduction)


def dpo(
    policy_chosen_logp: torch.Tensor,
    policy_rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Preference Optimization loss (Rafailov et al. 2023) and its diagnostics.

    All four inputs are ``[B]``: the log-probability of each pair's chosen / rejected response (the
    sum of its masked token logprobs, or their mean for length-normalised variants) under the policy
    (carries the gradient) and under the frozen reference (treated as constants). With the implicit
    rewards ``r_c = beta * (policy_chosen - ref_chosen)`` and ``r_r = beta * (policy_rejected -
    ref_rejected)``::

        loss = mean(-logsigmoid(r_c - r_r))

    which is ``log 2`` while the policy equals the reference. ``beta`` (> 0) scales how far the policy
    may move from the reference: larger keeps it closer.

    Returns ``(loss, stats)`` with float stats over the batch: ``reward_accuracy`` (fraction of pairs
    with ``r_c > r_r``; ties count as wrong), ``reward_margin`` (mean ``r_c - r_r``),
    ``chosen_reward`` and ``rejected_reward`` (means). A non-finite input raises ValueError naming the
    input and the rows at fault.
    """
    if not (isinstance(beta, (int, float)) and 0.0 < beta < float("inf")):
        raise ValueError(f"beta must be a finite number > 0; got {beta!r}")
    inputs = {
        "policy_chosen_logp": policy_chosen_logp,
        "policy_rejected_logp": policy_rejected_logp,
        "ref_chosen_logp": ref_chosen_logp,
        "ref_rejected_logp": ref_rejected_logp,
    }
    for name, tensor in inputs.items():
        if tensor.dim() != 1:
            raise ValueError(f"{name}: expected shape [B] (one value per pair), got {tuple(tensor.shape)}")
        _check_same(name, tensor, "policy_chosen_logp", policy_chosen_logp)
    if policy_chosen_logp.numel() == 0:
        raise ValueError("dpo: got an empty batch (B = 0)")
    for name, tensor in inputs.items():
        bad = (~torch.isfinite(tensor.detach())).nonzero().flatten().tolist()
        if bad:
            raise ValueError(
                f"{name} is not finite at rows {bad[:8]} (values {tensor.detach()[bad[:8]].tolist()})"
            )
    chosen_reward = beta * (policy_chosen_logp - ref_chosen_logp.detach())
    rejected_reward = beta * (policy_rejected_logp - ref_rejected_logp.detach())
    margin = chosen_reward - rejected_reward
    loss = -torch.nn.functional.logsigmoid(margin).mean()
    with torch.no_grad():
        stats = {
            "reward_accuracy": float((chosen_reward > rejected_reward).float().mean()),
            "reward_margin": float(margin.mean()),
            "chosen_reward": float(chosen_reward.mean()),
            "rejected_reward": float(rejected_reward.mean()),
        }
    return loss, stats
