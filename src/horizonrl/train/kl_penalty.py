"""KL to the starting policy (``train.kl_coef > 0``): in the reward or as a loss term.

The reference is the policy with its LoRA adapter switched off, so no second model is held (a
policy without LoRA is refused); its logprobs come from one no-grad pass per step, before the update
(:func:`horizonrl.train.logprobs.reference_logprobs`, or the pass of a KL in the reward), and reach the
loss as each batch's ``ref_logprobs``. The estimator is ``train.kl_kind`` (k1, k2, k3:
:func:`horizonrl.algos.kl.estimate`); where the penalty goes is ``train.kl_in``:

- ``loss``: :meth:`KLPenalty.loss_term` of each micro-batch, times ``kl_coef``, is added to its loss;
- ``reward`` (token-level estimators): :meth:`KLPenalty.reward_penalty`, ``kl_coef`` times the
  per-token KL of the no-grad pass before the update, is subtracted from each model token's reward
  before the advantages.

Either way every micro-batch reports its KL (metric ``kl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from horizonrl.algos import kl as kl_fns
from horizonrl.algos import losses
from horizonrl.config import TrainConfig
from horizonrl.errors import TrainingError
from horizonrl.train.batching import TokenBatch
from horizonrl.types import Trajectory


@dataclass(frozen=True)
class KLPenalty:
    """KL of the policy to itself with its adapter switched off, weighted by ``coef``."""

    coef: float
    kind: str = "k3"
    kl_in: str = "loss"  # where the penalty goes: "loss" or "reward"

    @classmethod
    def from_config(cls, cfg: TrainConfig, model: Any) -> KLPenalty | None:
        """The penalty ``cfg`` asks for, or None when ``kl_coef`` is 0."""
        if not cfg.kl_coef > 0:
            return None
        if not hasattr(model, "disable_adapter"):
            raise TrainingError(
                "train.kl_coef > 0 needs a LoRA policy (the reference is the adapter switched off)"
            )
        return cls(cfg.kl_coef, cfg.kl_kind, str(cfg.kl_in))

    @property
    def in_reward(self) -> bool:
        return self.kl_in == "reward"

    @property
    def in_loss(self) -> bool:
        return self.kl_in == "loss"

    def reward_penalty(
        self, trajectories: Sequence[Trajectory], old: dict[str, list[list[float]]]
    ) -> list[list[float]]:
        """Per response token of each trajectory, ``coef`` times the KL of the old logprobs to the
        reference logprobs (both from the no-grad pass, ``old``) at its model tokens; zeros for a
        trajectory the pass did not cover."""
        old_logprobs = old.get("old_logprobs", [[] for _ in trajectories])
        penalty = []
        for i, t in enumerate(trajectories):
            if not old_logprobs[i]:
                penalty.append([0.0] * len(t.response_ids))
                continue
            lp, ref = torch.tensor(old_logprobs[i]), torch.tensor(old["ref_logprobs"][i])
            kl_tok = kl_fns.estimate(lp, ref, self.kind) * torch.tensor(t.loss_mask, dtype=torch.float32)
            penalty.append((self.coef * kl_tok).tolist())
        return penalty

    def loss_term(
        self, logp: torch.Tensor, batch: TokenBatch, mask: torch.Tensor, reduction: losses.Reduction
    ) -> torch.Tensor:
        """The KL of a micro-batch, reduced like the loss (unweighted): ``logp`` carries the gradient,
        the reference logprobs are the batch's ``ref_logprobs`` (computed once per step, before the
        update)."""
        if "ref_logprobs" not in batch.extras:
            raise TrainingError("the KL term needs the batch's ref_logprobs (the step's reference pass)")
        ref = batch.extras["ref_logprobs"].to(logp.device)
        return losses.reduce_loss(kl_fns.estimate(logp, ref, self.kind), mask, reduction)
