"""Trajectory records → padded training tensors, split into micro-batches by a token budget.

A trajectory's token sequence is ``prompt_ids + response_ids``. The model predicts token ``t`` from
the tokens before it, so the training targets are the sequence shifted by one; ``loss_mask`` marks
which response tokens the model generated (the only tokens with a loss). Sequences are right-padded;
padded positions carry mask 0 and are never trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from horizonrl.errors import DataError
from horizonrl.types import Trajectory


@dataclass
class TokenBatch:
    """Right-padded tensors for a list of trajectories (``N`` rows, ``L`` = longest sequence).

    ``input_ids``/``attention_mask``: [N, L]. ``targets``/``loss_mask``/``advantages``/
    ``sample_logprobs``: [N, L-1], aligned with the model's predictions (position ``t`` predicts
    ``input_ids[:, t+1]``). ``ids`` names each row's trajectory (for error messages). ``extras``
    holds further per-response-token values by name (old logprobs, old values, returns), [N, L-1],
    or [N, L-1, k] for rows given as tensors (the reference's top-k token ids and logprobs)."""

    ids: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    sample_logprobs: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    #: positions sampled under a constraint and the tokens allowed there (flat indices into the
    #: [N, L-1] grid, [K, V] bool; None: none), see :mod:`horizonrl.train.constrained`
    constrained: Any = None

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


#: One trajectory's advantage: a scalar broadcast to its model tokens, or one value per response token.
Advantage = float | Sequence[float]


def collate(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    advantages: Sequence[Advantage] | None = None,
    extras: dict[str, Sequence[Any]] | None = None,
    replay: Any = None,
) -> TokenBatch:
    """Pad ``trajectories`` into one :class:`TokenBatch`; ``advantages`` (one per trajectory: a scalar
    broadcast to its model tokens, or a list over its response tokens) are zero off the model tokens
    (all zeros when omitted). ``extras[name]`` holds one row over the response tokens per trajectory:
    a list of floats (float32 [N, L-1]) or a tensor [R, k] whose dtype is kept ([N, L-1, k]).
    ``replay`` (a :class:`~horizonrl.train.constrained.ConstraintReplay`) rebuilds the masks of
    constrained turns (``batch.constrained``); without it a constrained trajectory is refused."""
    if not trajectories:
        raise DataError("cannot build a training batch from zero trajectories")
    if advantages is not None and len(advantages) != len(trajectories):
        raise ValueError(f"got {len(advantages)} advantages for {len(trajectories)} trajectories")
    for name, values in (extras or {}).items():
        if len(values) != len(trajectories):
            raise ValueError(f"extras[{name!r}]: got {len(values)} rows for {len(trajectories)} trajectories")
    for traj in trajectories:
        if traj.constrained and replay is None:
            raise DataError(
                f"trajectory {traj.id!r} has turns sampled under a constraint, but this trainer was "
                "given no constraint replay to compute their logprobs under the same masks"
            )
        if not traj.prompt_ids or sum(traj.loss_mask) == 0:
            raise DataError(
                f"trajectory {traj.id!r} has no model tokens to train on "
                f"(prompt {len(traj.prompt_ids)} tokens, {sum(traj.loss_mask)} model tokens)"
            )
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.float32)
    sample_lp = torch.zeros((n, width - 1), dtype=torch.float32)
    adv = torch.zeros((n, width - 1), dtype=torch.float32)
    extra = {name: _extra_tensor(rows, n, width - 1) for name, rows in (extras or {}).items()}
    for i, traj in enumerate(trajectories):
        seq = traj.prompt_ids + traj.response_ids
        p = len(traj.prompt_ids)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        # response token j sits at sequence position p + j, predicted from position p + j - 1
        loss_mask[i, p - 1 : p - 1 + len(traj.response_ids)] = torch.tensor(
            traj.loss_mask, dtype=torch.float32
        )
        sample_lp[i, p - 1 : p - 1 + len(traj.response_ids)] = torch.tensor(
            traj.logprobs, dtype=torch.float32
        )
        span = slice(p - 1, p - 1 + len(traj.response_ids))
        if advantages is not None:
            value = advantages[i]
            if isinstance(value, (int, float)):
                adv[i] = float(value) * loss_mask[i]
            else:
                adv[i, span] = _response_row(traj, value, "advantages")
                adv[i] *= loss_mask[i]
        for name, values in (extras or {}).items():
            extra[name][i, span] = _response_row(traj, values[i], f"extras[{name!r}]")
    return TokenBatch(
        ids=[t.id for t in trajectories],
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:].clone(),
        loss_mask=loss_mask,
        advantages=adv,
        sample_logprobs=sample_lp,
        extras=extra,
        constrained=replay.for_batch(trajectories, width - 1) if replay is not None else None,
    )


def _extra_tensor(rows: Sequence[Any], n: int, width: int) -> torch.Tensor:
    """Zeros for one extra: float32 [n, width] for rows of floats, [n, width, k] of the rows' dtype for
    rows that are tensors [R, k]."""
    first = rows[0] if rows else []
    if isinstance(first, torch.Tensor) and first.dim() == 2:
        return torch.zeros((n, width, first.shape[1]), dtype=first.dtype)
    return torch.zeros((n, width), dtype=torch.float32)


def _response_row(traj: Trajectory, values: Sequence[float] | torch.Tensor, what: str) -> torch.Tensor:
    if len(values) != len(traj.response_ids):
        raise ValueError(
            f"{what} of trajectory {traj.id!r}: {len(values)} values for {len(traj.response_ids)} "
            "response tokens"
        )
    if isinstance(values, torch.Tensor):
        return values
    return torch.tensor(values, dtype=torch.float32)


def turn_ids(loss_mask: Sequence[int]) -> list[int]:
    """The turn index of each response token: model tokens of the k-th run of ``loss_mask`` ones get
    ``k``; environment tokens get -1."""
    out, turn, previous = [], -1, 0
    for bit in loss_mask:
        if bit and not previous:
            turn += 1
        out.append(turn if bit else -1)
        previous = bit
    return out


def turn_ends(loss_mask: Sequence[int]) -> list[int]:
    """Response positions of each turn's last model token, in turn order."""
    return [j for j, bit in enumerate(loss_mask) if bit and (j + 1 == len(loss_mask) or not loss_mask[j + 1])]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group row indices into micro-batches whose padded size (rows x longest) stays within
    ``max_tokens``; rows are sorted by length first so padding stays small. A single row longer
    than the budget forms its own micro-batch."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
