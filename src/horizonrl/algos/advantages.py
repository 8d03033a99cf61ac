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
from typing import Literal, NamedTuple

import torch

__all__ = [
    "adca",
    "broadcast_steps",
    "broadcast_to_tokens",
    "discounted_returns",
    "grpo",
    "reinforce_pp",
    "rloo",
    "turn_baseline",
    "whiten",
]


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


class _GroupStats(NamedTuple):
    counts: torch.Tensor  # [G] samples per group (float)
    means: torch.Tensor  # [G] mean reward per group
    degenerate: torch.Tensor  # [G] bool: size 1, or all rewards equal


def _checked_rewards(
    rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float rewards ``[N]`` and dense group indices ``[N]``; raises on bad shapes and NaN/inf."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected shape [N] (1-D), got {tuple(rewards.shape)}")
    index = _group_index(group_ids, rewards.shape[0], rewards.device)
    r = rewards.to(_float_dtype(rewards))
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        raise ValueError(f"rewards contain non-finite values at indices {bad}")
    return r, index


def _group_stats(r: torch.Tensor, index: torch.Tensor) -> _GroupStats:
    num_groups = int(index.max()) + 1
    counts = torch.bincount(index, minlength=num_groups).to(r.dtype)
    means = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add(0, index, r) / counts
    gmax = torch.full((num_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, index, r, reduce="amax"
    )
    gmin = torch.full((num_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, index, r, reduce="amin"
    )
    return _GroupStats(counts, means, (counts < 2) | (gmax == gmin))


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
    r, index = _checked_rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone()

    stats = _group_stats(r, index)
    centered = r - stats.means[index]
    if norm_by_std:
        sq = torch.zeros_like(stats.counts).index_add(0, index, centered * centered)
        std = torch.sqrt(sq / (stats.counts - 1).clamp(min=1))
        centered = centered / (std[index] + eps)
    return torch.where(stats.degenerate[index], torch.zeros_like(centered), centered)


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


def rloo(rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantages ``[N]`` (Ahmadian et al. 2024; Kool et al. 2019).

    Each sample's baseline is the mean reward of the *other* samples of its group::

        A_i = r_i - mean_{j in g(i), j != i} r_j = n / (n - 1) * (r_i - mean_{j in g(i)} r_j)

    Groups of one (no other sample) and groups whose rewards are all equal get exactly 0. Same
    ``group_ids``, dtype and validation rules as :func:`grpo`.
    """
    r, index = _checked_rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone()
    stats = _group_stats(r, index)
    n = stats.counts[index]
    adv = (r - stats.means[index]) * n / (n - 1).clamp(min=1)
    return torch.where(stats.degenerate[index], torch.zeros_like(adv), adv)


def _check_token_tensors(**tensors: torch.Tensor) -> None:
    names = list(tensors)
    first = tensors[names[0]]
    if first.dim() != 2:
        raise ValueError(f"{names[0]}: expected shape [N, T] (2-D), got {tuple(first.shape)}")
    for name in names[1:]:
        if tensors[name].shape != first.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(first.shape)} (same as {names[0]}), "
                f"got {tuple(tensors[name].shape)}"
            )


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1]; got {value}")


def whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``values`` over the masked positions of the whole batch: ``(x - mean) / (std + eps)``
    with the population std (divide by the number of masked positions); ``shift_mean=False`` keeps the
    mean (``x / (std + eps)``). Masked-out positions are 0 in the result and never read (NaN there
    does not leak). With fewer than 2 masked positions the values are only centred; when all masked
    values are equal the result is exactly 0."""
    if mask.shape != values.shape:
        raise ValueError(
            f"mask: expected shape {tuple(values.shape)} (same as values), got {tuple(mask.shape)}"
        )
    valid = mask != 0
    x = torch.where(valid, values, torch.zeros_like(values))
    count = valid.sum()
    if int(count) == 0:
        return x
    mean = x.sum() / count
    centered = torch.where(valid, x - mean, torch.zeros_like(x))
    if int(count) < 2:
        return centered if shift_mean else x
    var = centered.square().sum() / count
    if float(var) == 0.0:
        return torch.zeros_like(x)
    out = (centered if shift_mean else x) / (torch.sqrt(var) + eps)
    return torch.where(valid, out, torch.zeros_like(out))


def discounted_returns(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    turn_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reward-to-go ``[N, T]`` over the masked (model-written) positions; 0 elsewhere.

    Without ``turn_ids`` the discount is per token: ``G_t = r_t + gamma * G_t'`` with ``t'`` the next
    masked position of the row (0 after the last). With ``turn_ids`` (the turn index of each masked
    token) the discount is across turns: for a token of turn ``k``,
    ``G_t = (sum of r over the masked tokens of turn k from t on) + sum_{j > k} gamma^(j - k) R_j``
    where ``R_j`` is the total reward of turn ``j``. With ``gamma = 1`` both are the plain
    reward-to-go. Rewards at masked-out positions are ignored."""
    _check_token_tensors(token_rewards=token_rewards, mask=mask)
    _check_unit("gamma", gamma)
    if turn_ids is not None:
        _check_token_tensors(token_rewards=token_rewards, turn_ids=turn_ids)
    valid = mask != 0
    dtype = _float_dtype(token_rewards)
    r = torch.where(valid, token_rewards, torch.zeros_like(token_rewards)).detach().to(dtype)
    rows, keep = r.tolist(), valid.tolist()
    turns = turn_ids.tolist() if turn_ids is not None else None
    out = [[0.0] * len(row) for row in rows]
    for i, row in enumerate(rows):  # python floats: ~50x faster than indexing tensors element-wise
        running = 0.0
        next_turn: int | None = None
        for t in range(len(row) - 1, -1, -1):
            if not keep[i][t]:
                continue
            if turns is None:
                running = row[t] + gamma * running
            else:
                turn = int(turns[i][t])
                if next_turn is not None and turn != next_turn:
                    running *= gamma ** (next_turn - turn)
                running = row[t] + running
                next_turn = turn
            out[i][t] = running
    return torch.tensor(out, dtype=dtype, device=r.device).reshape(r.shape)


def turn_baseline(
    returns: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    group_ids: Sequence[Hashable] | torch.Tensor,
) -> torch.Tensor:
    """A per-turn group baseline ``[N, T]``: for a token of turn ``k`` of sequence ``i``, the mean over
    ``i``'s group of the return from turn ``k`` on, ``mean_{j in g(i)} G_j(k)``, where ``G_j(k)`` is
    the return at the first masked token of ``j``'s turn ``k`` (0 when ``j`` has no turn ``k``: its
    episode is over and earns nothing more). A time-dependent baseline: apart from the episode's own
    share of the mean (as in GRPO's group mean) it depends on the turn index, not on the turn's
    action, and a turn is compared with the same turn of its siblings — a group whose episodes all
    earn the same from turn ``k`` on gets exactly 0 there. Masked-out positions are 0."""
    _check_token_tensors(returns=returns, mask=mask, turn_ids=turn_ids)
    valid = mask != 0
    if not bool(valid.any()):
        return torch.zeros_like(returns)
    turns = torch.where(valid, turn_ids, torch.zeros_like(turn_ids)).long()
    firsts = torch.zeros((returns.shape[0], int(turns.max()) + 1), dtype=returns.dtype, device=returns.device)
    keep, at = valid.tolist(), turns.tolist()
    for i, row in enumerate(returns.detach().tolist()):  # G_i(k): the return at turn k's first token
        seen: set[int] = set()
        for t, value in enumerate(row):
            if keep[i][t] and at[i][t] not in seen:
                seen.add(at[i][t])
                firsts[i, at[i][t]] = value
    index = _group_index(group_ids, returns.shape[0], returns.device)
    means = torch.stack([_group_stats(col, index).means[index] for col in firsts.T], dim=1)  # [N, K]
    return torch.where(valid, means.gather(1, turns), torch.zeros_like(returns))


def reinforce_pp(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    group_ids: Sequence[Hashable] | torch.Tensor | None = None,
    turn_ids: torch.Tensor | None = None,
    eps: float = 1e-8,
    baseline: Literal["episode", "turn"] = "episode",
) -> torch.Tensor:
    """REINFORCE++ advantages ``[N, T]`` (Hu et al. 2025, OpenRLHF).

    ``returns = discounted_returns(token_rewards, mask, gamma, turn_ids)``; with ``group_ids``
    (REINFORCE++-baseline) every masked return of sequence ``i`` is reduced by a group baseline:
    with ``baseline='episode'`` the mean, over its group, of the sequences' total rewards
    ``S_j = sum_t token_rewards[j, t] * mask[j, t]``, then the result is whitened over all masked
    tokens of the batch (:func:`whiten`); with ``baseline='turn'`` (needs ``turn_ids``) the group's
    mean return from the token's turn on (:func:`turn_baseline`), then only scaled by the batch std
    (it is centred per turn already, and a turn with no signal keeps advantage 0). Masked-out
    positions are 0.
    """
    if baseline not in ("episode", "turn"):
        raise ValueError(f"baseline: expected 'episode' or 'turn', got {baseline!r}")
    returns = discounted_returns(token_rewards, mask, gamma, turn_ids)
    if group_ids is not None and baseline == "turn":
        if turn_ids is None:
            raise ValueError("baseline='turn' needs turn_ids (the turn index of each masked token)")
        return whiten(returns - turn_baseline(returns, mask, turn_ids, group_ids), mask, False, eps)
    if group_ids is not None:
        valid = mask != 0
        totals = (
            torch.where(valid, token_rewards, torch.zeros_like(token_rewards)).sum(dim=1).to(returns.dtype)
        )
        index = _group_index(group_ids, totals.shape[0], totals.device)
        baseline_values = _group_stats(totals, index).means[index] if totals.shape[0] else totals
        returns = torch.where(valid, returns - baseline_values[:, None], torch.zeros_like(returns))
    return whiten(returns, mask, eps=eps)


def adca(
    step_labels: Sequence[Sequence[bool | None]],
    outcome: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable] | torch.Tensor,
    alpha: float = 0.1,
    step_reward: float = 0.2,
    prm_steps: int | None = None,
    eps: float = 1e-6,
) -> list[torch.Tensor]:
    """ADCA-GRPO per-step advantages (AgentEvolver's self-attributing): one ``[T_i]`` tensor per
    trajectory ``i`` of ``T_i`` steps.

    ``step_labels[i][t]`` is the judge's verdict on step ``t`` (True: GOOD, False: BAD; None: not
    attributed). Step rewards are ``+step_reward`` (GOOD) and ``-step_reward`` (BAD) for the first
    ``prm_steps`` steps (all when None); later or unlabelled steps carry no attribution reward and do
    not enter the statistics. Within each group the attribution rewards are z-scored with every
    trajectory weighted equally, whatever its length::

        mu_g    = mean over trajectories i of g of (mean over i's attributed steps of r_it)
        var_g   = mean over i of (mean over i's attributed steps of (r_it - mu_g)^2)
        zattr_it = (r_it - mu_g) / (sqrt(var_g) + eps)        (0 when var_g is 0)

    The outcomes are z-scored within the group separately (mean and population std over the group's
    trajectories; 0 for a group of one or of equal outcomes). The fused reward of step t is
    ``alpha * zattr_it`` plus, on the last step, the outcome's z-score; the advantage of step ``t``
    is the undiscounted sum of the fused rewards of steps ``t..T_i-1``. Broadcast each step's
    advantage to that step's tokens (:func:`broadcast_steps`).
    """
    n = len(step_labels)
    out_r = torch.as_tensor(outcome, dtype=torch.float64).flatten()
    if out_r.shape[0] != n:
        raise ValueError(f"outcome: expected {n} values (one per trajectory), got {out_r.shape[0]}")
    if not bool(torch.isfinite(out_r).all()):
        raise ValueError("outcome contains non-finite values")
    if prm_steps is not None and prm_steps < 0:
        raise ValueError(f"prm_steps must be >= 0 (or None), got {prm_steps}")
    index = _group_index(group_ids, n, torch.device("cpu")).tolist()
    attr: list[list[float | None]] = [
        [
            None
            if label is None or (prm_steps is not None and t >= prm_steps)
            else (step_reward if label else -step_reward)
            for t, label in enumerate(labels)
        ]
        for labels in step_labels
    ]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    result: list[torch.Tensor] = []
    z_attr: dict[int, list[float]] = {}
    z_out: dict[int, float] = {}
    for members in groups.values():
        rated = [i for i in members if any(r is not None for r in attr[i])]
        per_traj = [[r for r in attr[i] if r is not None] for i in rated]
        mu = sum(sum(rs) / len(rs) for rs in per_traj) / len(rated) if rated else 0.0
        var = sum(sum((r - mu) ** 2 for r in rs) / len(rs) for rs in per_traj) / len(rated) if rated else 0.0
        sd = var**0.5
        for i in members:
            z_attr[i] = [0.0 if r is None or var == 0 else (r - mu) / (sd + eps) for r in attr[i]]
        outs = [float(out_r[i]) for i in members]
        o_mu = sum(outs) / len(outs)
        o_sd = (sum((o - o_mu) ** 2 for o in outs) / len(outs)) ** 0.5
        for i, o in zip(members, outs, strict=True):
            z_out[i] = 0.0 if len(members) < 2 or o_sd == 0 else (o - o_mu) / (o_sd + eps)
    for i in range(n):
        fused = [alpha * z for z in z_attr[i]]
        if fused:
            fused[-1] += z_out[i]
        running, adv = 0.0, [0.0] * len(fused)
        for t in range(len(fused) - 1, -1, -1):
            running += fused[t]
            adv[t] = running
        result.append(torch.tensor(adv, dtype=torch.float32))
    return result


def broadcast_steps(step_advantages: torch.Tensor, token_steps: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``[T]`` of one trajectory: the advantage of the step each token belongs
    to (``token_steps[j]`` is that step's index, or -1 for tokens outside any step, which get 0)."""
    if token_steps.dim() != 1:
        raise ValueError(f"token_steps: expected shape [T] (1-D), got {tuple(token_steps.shape)}")
    if token_steps.numel() and int(token_steps.max()) >= step_advantages.shape[0]:
        raise ValueError(
            f"token_steps names step {int(token_steps.max())}, but there are {step_advantages.shape[0]} steps"
        )
    padded = torch.cat([step_advantages.to(torch.float32), torch.zeros(1)])
    return padded[torch.where(token_steps < 0, torch.full_like(token_steps, -1), token_steps)]
