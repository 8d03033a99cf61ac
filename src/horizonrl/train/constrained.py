"""The trainer's side of constrained decoding: the masks a constrained turn was sampled under,
rebuilt by replaying its constraint over the sampled tokens.

A constrained token was sampled from the policy's distribution renormalised over the tokens the
constraint allowed at that point (the engine sets the others' logits to ``-inf``), and its recorded
logprob is under that masked distribution. For the importance ratio of an RL update to compare like
with like, the trainer computes the same quantity: it masks its own logits at those positions with the
same masks before the softmax. The masks are not stored in the record (49k bits per token); the
record names each constrained turn's span and constraint (:class:`horizonrl.types.ConstrainedSpan`),
and :class:`~horizonrl.engine.replay.ConstraintReplay` replays a fresh matcher over the span's
tokens, which yields exactly the sequence of masks the sampler saw (the matcher is deterministic
in the tokens it consumed).

A token the constraint forced (the only one allowed) has logprob 0 under the mask for every policy:
its ratio is 1 and its gradient 0, so it enters the loss as a constant — it carries no choice of the
policy's to reinforce or discourage (docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.engine.replay import ConstrainedPositions, ConstraintReplay
from horizonrl.types import Trajectory


def unconstrained(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """``trajectories`` without their constrained spans, for likelihood objectives on the text itself
    (SFT's and the demonstrations' NLL, DPO's preference logprobs): those teach the model to write
    the text unaided, so they score it under the unmasked distribution."""
    return [
        t.model_copy(update={"constrained": None, "constraints": None}) if t.constrained else t
        for t in trajectories
    ]


def mask_constrained(
    logits: torch.Tensor, loss_mask: torch.Tensor, constrained: ConstrainedPositions | None
) -> torch.Tensor:
    """``logits`` [M, V] (one row per loss position of a [N, L-1] ``loss_mask``, in row-major order)
    with the tokens each constrained position did not allow set to ``-inf`` (differentiable)."""
    if constrained is None:
        return logits
    flat, allowed = constrained
    flat = flat.to(logits.device)
    row_of = loss_mask.flatten().cumsum(0) - 1  # grid position -> row of ``logits``
    rows = row_of[flat]
    masked = logits[rows].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits.index_put((rows,), masked)


def policy_replay(constrain: str, tokenizer: Any, base: Any) -> ConstraintReplay | None:
    """What rebuilds the masks of the policy's constrained turns for an update (``agent.constrain``
    other than ``none``), or None when its turns are free."""
    return ConstraintReplay(tokenizer, base) if constrain != "none" else None
