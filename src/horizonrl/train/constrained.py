"""The trainer's side of constrained decoding: the masks a constrained turn was sampled under,
rebuilt by replaying its constraint over the sampled tokens.

A constrained token was sampled from the policy's distribution renormalised over the tokens the
constraint allowed at that point (the engine sets the others' logits to ``-inf``), and its recorded
logprob is under that masked distribution. For the importance ratio of an RL update to compare like
with like, the trainer computes the same quantity: it masks its own logits at those positions with the
same masks before the softmax. The masks are not stored in the record (49k bits per token); the
record names each constrained turn's span and constraint (:class:`horizonrl.types.ConstrainedSpan`),
and :class:`ConstraintReplay` replays a fresh matcher over the span's tokens, which yields exactly the
sequence of masks the sampler saw (the matcher is deterministic in the tokens it consumed).

A token the constraint forced (the only one allowed) has logprob 0 under the mask for every policy:
its ratio is 1 and its gradient 0, so it enters the loss as a constant — it carries no choice of the
policy's to reinforce or discourage (docs/algorithms.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.engine.constraints import Constraint, ConstraintCompiler, replay_masks
from horizonrl.tokens import eos_token_ids
from horizonrl.types import Trajectory

#: a batch's constrained positions: flat indices into its [N, L-1] grid, and the allowed tokens [K, V]
ConstrainedPositions = tuple[torch.Tensor, torch.Tensor]


class ConstraintReplay:
    """Rebuilds the sampling masks of trajectories' constrained turns (see the module doc), for a
    policy with ``tokenizer`` and ``model``'s vocabulary and end-of-sequence ids (the engine's)."""

    def __init__(self, tokenizer: Any, model: Any, cache_size: int = 256) -> None:
        self.vocab_size = int(model.config.vocab_size)
        eos = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        self.compiler = ConstraintCompiler(tokenizer, self.vocab_size, eos)
        self._cache: OrderedDict[tuple[str, int], tuple[list[int], torch.Tensor]] = OrderedDict()
        self.cache_size = cache_size

    def positions(self, traj: Trajectory) -> tuple[list[int], torch.Tensor] | None:
        """The response positions of ``traj``'s constrained tokens and the tokens allowed at each
        ([K, vocab] bool); None when it has none."""
        if not traj.constrained:
            return None
        key = (traj.id, len(traj.response_ids))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        constraints = [Constraint.model_validate(c) for c in traj.constraints or []]
        positions: list[int] = []
        masks: list[torch.Tensor] = []
        for span in traj.constrained:
            matcher = self.compiler.matcher(constraints[span.constraint])
            masks.append(replay_masks(matcher, traj.response_ids[span.start : span.end], self.vocab_size))
            positions.extend(range(span.start, span.end))
        found = (positions, torch.cat(masks))
        self._cache[key] = found
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return found

    def for_batch(self, trajectories: Sequence[Trajectory], width: int) -> ConstrainedPositions | None:
        """The constrained positions of a batch of ``trajectories`` laid out as
        :func:`horizonrl.train.batching.collate` lays them out ([N, width] prediction grid, response
        token ``j`` of row ``i`` predicted at ``i * width + len(prompt) - 1 + j``)."""
        index: list[int] = []
        allowed: list[torch.Tensor] = []
        for i, traj in enumerate(trajectories):
            found = self.positions(traj)
            if found is None:
                continue
            offset = i * width + len(traj.prompt_ids) - 1
            index.extend(offset + j for j in found[0])
            allowed.append(found[1])
        if not index:
            return None
        return torch.tensor(index, dtype=torch.long), torch.cat(allowed)


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
