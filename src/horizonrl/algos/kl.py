"""Per-token estimators of KL(pi || pi_ref) from log-probabilities of sampled tokens.

Tokens are sampled from the policy ``pi``; with ``log_ratio = logp - ref_logp = log(pi / pi_ref)``
at each sampled token (Schulman, "Approximating KL Divergence", 2020):

- ``k1 = log_ratio``: unbiased, high variance, can be negative per token.
- ``k2 = 0.5 * log_ratio**2``: biased, low variance, always >= 0.
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (i.e. ``r - 1 - log r`` with ``r = pi_ref / pi``): unbiased,
  low variance and always >= 0 (``exp(x) >= 1 + x``). GRPO's KL penalty.

For ``k3`` the log-ratio is clamped to ``[-20, 20]`` before ``exp`` so that one token whose
probabilities diverge wildly cannot produce inf (``exp(20)`` ~ 4.9e8 is finite in float32); the
gradient is 0 at clamped tokens. ``exp(-x) - 1`` is computed with ``expm1`` so that tiny log-ratios do
not round to a small negative value.

Shapes: ``logp`` and ``ref_logp`` have the same (any) shape, typically ``[N, T]``; the result has that
shape, one estimate per token and no reduction (apply a mask with
:func:`horizonrl.algos.losses.masked_mean` or :func:`horizonrl.algos.losses.reduce_loss`).

A sampled-token estimator sees a token only when it is sampled: once the policy rarely samples a
token the reference liked, nothing pulls its probability back. :func:`forward_topk` is not an
estimate from samples but the KL between two whole next-token distributions, in the other direction
(``KL(pi_ref || pi)``, which grows when the policy drops mass the reference had), over the
reference's ``k`` most likely tokens with every other token lumped into one outcome. Lumping can only
lose divergence, so it is a lower bound on the full forward KL that is exact when the top ``k`` hold
all of the reference's mass, and its gradient needs no sampling.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = ["KLKind", "estimate", "forward_topk"]

KLKind = Literal["k1", "k2", "k3"]

_KINDS: tuple[str, ...] = get_args(KLKind)
_MAX_LOG_RATIO = 20.0


def estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (k1, k2 or k3), same shape as ``logp``; see the module docstring.

    Gradients flow through whichever of ``logp`` / ``ref_logp`` requires them.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}; got {kind!r}")
    if ref_logp.shape != logp.shape:
        raise ValueError(
            f"ref_logp: expected shape {tuple(logp.shape)} (same as logp), got {tuple(ref_logp.shape)}"
        )
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(-log_ratio) + log_ratio


def forward_topk(ref_top_logp: torch.Tensor, logp_at_ref_top: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(pi_ref || pi)`` over the reference's top-``k`` tokens and the rest as one.

    ``ref_top_logp`` [..., k]: the reference's log-probabilities of its ``k`` most likely tokens;
    ``logp_at_ref_top`` [..., k]: the policy's log-probabilities of the same tokens (the gradient
    flows through it). Returns [...]: ``sum_i p_ref_i (log p_ref_i - log p_i) + r_ref (log r_ref -
    log r)``, ``r`` being the mass outside the ``k`` tokens; >= 0, 0 where the two agree on them.
    """
    if ref_top_logp.shape != logp_at_ref_top.shape:
        raise ValueError(
            f"logp_at_ref_top: expected shape {tuple(ref_top_logp.shape)} (same as ref_top_logp), "
            f"got {tuple(logp_at_ref_top.shape)}"
        )
    ref_top_logp = ref_top_logp.detach()
    on_top = (ref_top_logp.exp() * (ref_top_logp - logp_at_ref_top)).sum(-1)
    ref_rest, rest = _log_rest(ref_top_logp), _log_rest(logp_at_ref_top)
    return on_top + ref_rest.exp() * (ref_rest - rest)


def _log_rest(top_logp: torch.Tensor) -> torch.Tensor:
    """``log(1 - sum exp(top_logp))``: the log-mass outside the given tokens, floored at 1e-12."""
    covered = torch.logsumexp(top_logp, dim=-1).clamp(max=0.0)
    return torch.log((-torch.expm1(covered)).clamp(min=1e-12))
