"""KL to the starting policy (``train.kl_coef > 0``): in the reward or as a loss term.

The reference is the policy with its LoRA adapter switched off, so no second model is held (a
policy without LoRA is refused); its logprobs come from one no-grad pass per step, before the update
(:func:`horizonrl.train.logprobs.reference_outputs`, or the pass of a KL in the reward), and reach the
loss as each batch's ``ref_logprobs``. The estimator is ``train.kl_kind``: k1, k2, k3 estimate
KL(policy || reference) from the sampled tokens (:func:`horizonrl.algos.kl.estimate`); ``forward_topk``
is KL(reference || policy) over the reference's ``train.kl_topk`` most likely tokens at each position
and the rest as one (:func:`horizonrl.algos.kl.forward_topk`): the pass also records those tokens
(``ref_top_ids``, ``ref_top_logprobs``) and the loss's forward gathers the policy's logprobs of
them. Where the penalty goes is ``train.kl_in``:

- ``loss``: :meth:`KLPenalty.loss_term` of each micro-batch, times ``kl_coef``, is added to its loss;
- ``reward`` (token-level estimators, not ``forward_topk``): :meth:`KLPenalty.reward_penalty`,
  ``kl_coef`` times the per-token KL of the no-grad pass before the update, is subtracted from each
  model token's reward before the advantages.

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
    top_k: int = 32  # tokens per position of the forward_topk KL

    @classmethod
    def from_config(cls, cfg: TrainConfig, model: Any) -> KLPenalty | None:
        """The penalty ``cfg`` asks for, or None when ``kl_coef`` is 0."""
        if not cfg.kl_coef > 0:
            return None
        if not hasattr(model, "disable_adapter"):
            raise TrainingError(
                "train.kl_coef > 0 needs a LoRA policy (the reference is the adapter switched off)"
            )
        return cls(cfg.kl_coef, cfg.kl_kind, str(cfg.kl_in), cfg.kl_topk)

    @property
    def reference_top_k(self) -> int:
        """How many of the reference's most likely tokens per position the step's pass records (0:
        only the sampled tokens' logprobs)."""
        return self.top_k if self.kind == "forward_topk" else 0

    @property
    def gather(self) -> str | None:
        """The batch extra of token ids whose policy logprobs the loss term needs, if any."""
        return "ref_top_ids" if self.kind == "forward_topk" else None

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
        self,
        logp: torch.Tensor,
        batch: TokenBatch,
        mask: torch.Tensor,
        reduction: losses.Reduction,
        logprobs_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The KL of a micro-batch, reduced like the loss (unweighted): ``logp`` (or, for
        ``forward_topk``, ``logprobs_at``: the policy's logprobs of the reference's top tokens)
        carries the gradient; the reference's rows are the batch's (computed once per step, before
        the update)."""
        if self.kind == "forward_topk":
            if "ref_top_logprobs" not in batch.extras or logprobs_at is None:
                raise TrainingError(
                    "the forward_topk KL term needs the batch's ref_top_logprobs and the policy's "
                    "logprobs of ref_top_ids (the step's reference pass)"
                )
            ref_top = batch.extras["ref_top_logprobs"].to(logprobs_at.device)
            return losses.reduce_loss(kl_fns.forward_topk(ref_top, logprobs_at), mask, reduction)
        if "ref_logprobs" not in batch.extras:
            raise TrainingError("the KL term needs the batch's ref_logprobs (the step's reference pass)")
        ref = batch.extras["ref_logprobs"].to(logp.device)
        return losses.reduce_loss(kl_fns.estimate(logp, ref, self.kind), mask, reduction)
