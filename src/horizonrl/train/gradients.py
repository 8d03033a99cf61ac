"""Forward and backward over many trajectories in micro-batches, the gradients accumulated.

Shared by RL and SFT. The caller supplies the loss of one micro-batch as a function of its token
logprobs; :func:`accumulate_gradients` packs trajectories into micro-batches of at most
``max_tokens`` padded tokens, runs forward and backward for each (the loss is pre-scaled so the
accumulated gradient equals the gradient of the whole batch's loss), and refuses a non-finite
logprob or loss, naming the trajectories at fault. The optimizer step that follows is
:func:`horizonrl.optim.optimizer_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from horizonrl.errors import TrainingError
from horizonrl.train.batching import Advantage, TokenBatch, collate, micro_batches
from horizonrl.train.logprobs import policy_forward, shared_prompt_prefix
from horizonrl.types import Trajectory

#: loss_fn(logprobs [n, L-1], entropy or None, batch) -> (scalar loss over this micro-batch, stats);
#: with a value head it is also given ``values=`` [n, L-1], with ``gather`` ``logprobs_at=`` [n, L-1, k].
LossFn = Callable[[torch.Tensor, torch.Tensor | None, TokenBatch], tuple[torch.Tensor, dict[str, float]]]


def nll_loss(total_tokens: int, coef: float = 1.0, stat: str = "nll") -> LossFn:
    """The supervised loss_fn (SFT, and RL's demonstration term): ``coef`` times the NLL of the
    tokens with ``loss_mask == 1``, summed per micro-batch over the ``total_tokens`` of the whole
    batch (so the accumulated gradient is the whole batch's mean NLL); ``stat`` names its mean NLL."""

    def loss_fn(
        logp: torch.Tensor, entropy: torch.Tensor | None, batch: TokenBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask.to(logp.device)
        nll = -(logp * mask).sum() / max(total_tokens, 1)
        mean_nll = float(-(logp.detach() * mask).sum() / mask.sum().clamp(min=1))
        return coef * nll, {stat: mean_nll}

    return loss_fn


def _non_finite_rows(values: torch.Tensor, batch: TokenBatch) -> list[str]:
    bad = (~torch.isfinite(values)).any(dim=-1)
    return [batch.ids[i] for i in torch.nonzero(bad).flatten().tolist()]


def accumulate_gradients(
    model: Any,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Advantage] | None,
    loss_fn: LossFn,
    pad_id: int,
    max_tokens: int,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    with_entropy: bool = False,
    *,
    entropy_grad: bool = False,
    value_head: Any = None,
    extras: dict[str, Sequence[Any]] | None = None,
    gather: str | None = None,
    replay: Any = None,
) -> dict[str, float]:
    """Forward and backward over ``trajectories`` in micro-batches; gradients accumulate in ``.grad``.

    ``loss_fn`` returns each micro-batch's loss already weighted by its share of the whole batch.
    A prompt prefix shared by every trajectory is computed once for all micro-batches (forward and
    backward, see :class:`~horizonrl.train.logprobs.SharedPrefix`); ``max_tokens`` budgets each
    micro-batch's padded tokens with the prefix counted once: rows x (longest - shared) + shared.
    ``entropy_grad`` keeps the entropy in the graph (an entropy bonus); ``value_head`` runs a critic on
    the same forward pass; ``extras`` are per-response-token inputs of the loss (see ``collate``);
    ``gather`` names an extra of token ids [n, L-1, k] whose logprobs the loss also needs (given as
    ``logprobs_at``, with the gradient); ``replay`` rebuilds constrained turns' masks
    (:mod:`horizonrl.train.constrained`). Returns summed losses and token-weighted means of the stats."""
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    prefix = shared_prompt_prefix(model, trajectories, max_tokens, autocast_dtype)
    shared = prefix.length if prefix is not None else 0
    totals: dict[str, float] = {"loss": 0.0}
    weights = 0.0
    for rows in micro_batches([n - shared for n in lengths], max_tokens - shared):
        batch = collate(
            [trajectories[i] for i in rows],
            pad_id,
            [advantages[i] for i in rows] if advantages else None,
            {name: [values[i] for i in rows] for name, values in (extras or {}).items()},
            replay=replay,
        )
        mode = "grad" if entropy_grad else "detached" if with_entropy else "none"
        ids = batch.extras[gather] if gather is not None else None
        out = policy_forward(
            model, batch, temperature, autocast_dtype, mode, value_head, prefix, gather_ids=ids
        )
        bad = _non_finite_rows(out.logprobs.detach(), batch)
        if bad:
            raise TrainingError(
                f"non-finite logprobs for trajectories {bad[:5]}: the weights may have diverged"
            )
        more: dict[str, torch.Tensor | None] = {}
        if value_head is not None:
            more["values"] = out.values
        if gather is not None:
            more["logprobs_at"] = out.gathered
        loss, stats = loss_fn(out.logprobs, out.entropy, batch, **more)
        if not torch.isfinite(loss):
            raise TrainingError(
                f"non-finite loss ({loss.item()}) in the micro-batch of trajectories {batch.ids[:8]}"
            )
        loss.backward()
        if prefix is not None:
            prefix.collect()
        totals["loss"] += float(loss.detach())
        share = float(batch.num_loss_tokens)
        weights += share
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value * share
    if prefix is not None:
        prefix.backward()
    for key in list(totals):
        if key != "loss" and weights:
            totals[key] /= weights
    return totals
