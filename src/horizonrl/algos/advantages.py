"""Group-relative advantages for GRPO-style training.

GRPO samples several completions for the same prompt (a *group*) and scores each completion against
its siblings instead of against a learned value function. For sample ``i`` in group ``g(i)``::

    A_i = r_i - mean_{j in g(i)} r_j                                   (Dr.GRPO, norm_by_std=False)
    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps)   (GRPO, norm_by_std=True)

``std`` is the sample standard deviation with Bessel's correction (divide by ``n - 1``), which is what
``torch.std`` computes by default and what TRL and veRL use. Two cases get an advantage of exactly 0:
a group of size 1 (there is no sibling to compare with, and the sample std is undefined) and a group
whose rewards are all equal (no learning signal; computing ``(r - mean) / (0 + eps)`` would otherwise
turn float rounding noise in the mean into large spurious advantages).

Shapes: ``rewards`` is ``[N]``, one scalar per sequence; advantages are ``[N]``, and
:func:`broadcast_to_tokens` spreads them over a ``[N, T]`` token mask.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = ["broadcast_to_tokens", "grpo"]


def _float_dtype(tensor: torch.Tensor) -> torch.dtype:
    """``tensor``'s dtype when it is floating point, else float32 (integer and bool rewards)."""
    return tensor.dtype if torch.is_floating_point(tensor) else torch.float32


def _group_index(group_ids: Sequence[Hashable] | torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    """Dense group indices ``[N]`` (0..G-1, in order of first appearance) for arbitrary hashable ids."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids: expected shape [N] (1-D), got {tuple(group_ids.shape)}")
        group_ids = group_ids.tolist()
    if len(group_ids) != n:
        raise ValueError(f"group_ids: expected length N={n} (one id per reward), got {len(group_ids)}")
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(gid, len(dense)) for gid in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device)


def grpo(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages ``[N]`` for ``rewards`` ``[N]``; see the module docstring for the math.

    ``group_ids`` holds one hashable id per reward (strings, ints, or a 1-D tensor); samples with equal
    ids form a group and need not be contiguous. ``norm_by_std=False`` is Dr.GRPO (no std division).
    The result has ``rewards``' dtype, or float32 when ``rewards`` is integer or bool.

    Raises ValueError when ``rewards`` is not 1-D, contains NaN/inf, or ``group_ids`` has the wrong length.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected shape [N] (1-D), got {tuple(rewards.shape)}")
    n = rewards.shape[0]
    index = _group_index(group_ids, n, rewards.device)
    dtype = _float_dtype(rewards)
    r = rewards.to(dtype)
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        raise ValueError(f"rewards contain non-finite values at indices {bad}")
    if n == 0:
        return r.clone()

    num_groups = int(index.max()) + 1
    counts = torch.bincount(index, minlength=num_groups).to(dtype)
    means = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add(0, index, r) / counts
    centered = r - means[index]
    # Degenerate groups (size 1, or all rewards equal) get exactly 0, not rounding noise or NaN.
    gmax = torch.full((num_groups,), -torch.inf, dtype=dtype, device=r.device).scatter_reduce(
        0, index, r, reduce="amax"
    )
    gmin = torch.full((num_groups,), torch.inf, dtype=dtype, device=r.device).scatter_reduce(
        0, index, r, reduce="amin"
    )
    degenerate = ((counts < 2) | (gmax == gmin))[index]
    if norm_by_std:
        sq = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add(0, index, centered * centered)
        std = torch.sqrt(sq / (counts - 1).clamp(min=1))
        centered = centered / (std[index] + eps)
    return torch.where(degenerate, torch.zeros_like(centered), centered)


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``[N, T] = advantages[:, None] * mask`` for sequence advantages ``[N]``.

    ``mask`` is ``[N, T]`` (0/1 or bool); every masked token of sequence ``i`` gets ``advantages[i]``
    and every other position gets 0. The result is floating point (float32 for integer advantages).
    """
    if advantages.dim() != 1:
        raise ValueError(f"advantages: expected shape [N] (1-D), got {tuple(advantages.shape)}")
    n = advantages.shape[0]
    if mask.dim() != 2 or mask.shape[0] != n:
        raise ValueError(f"mask: expected shape [N={n}, T], got {tuple(mask.shape)}")
    dtype = _float_dtype(advantages)
    return advantages.to(dtype)[:, None] * mask.to(dtype)
