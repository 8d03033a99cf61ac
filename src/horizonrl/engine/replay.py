"""Rebuilding the masks a trajectory's constrained turns were sampled under, for the trainer.

The record names each constrained turn's span and constraint (:class:`horizonrl.types.ConstrainedSpan`);
replaying a fresh matcher of that constraint over the span's tokens yields exactly the sequence of
masks the engine sampled under (a matcher is deterministic in the tokens it consumed). It lives
beside the engine's masks so that every trainer — the driver's and a data-parallel rank's — builds
it from the engine layer (:mod:`horizonrl.train.constrained` applies the masks to the logits).
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
