"""Per-token log-probabilities of a batch under the policy, computed where they are needed only.

A causal LM's logits are ``[rows, length, vocab]``: for SmolLM2 (49,152 tokens) and a batch of
8 x 700 tokens that is over 1 GB in float32 before ``log_softmax`` doubles it. The model tokens of
an agent trajectory are a fraction of its length (the rest is prompt and observations), so the
decoder's hidden states are computed for the whole sequence but the output head and softmax run
only at positions with ``loss_mask == 1``. Models whose head is more than a linear layer (logit
soft-capping or scaling) take the plain full-logits path.

``autocast_dtype=torch.bfloat16`` runs matmuls in bfloat16 with float32 master weights (measured on
this 2-core CPU with AVX512-BF16: LoRA forward+backward 2.3x faster than float32); the softmax is
always float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from horizonrl.engine.kvcache import cache_kwargs, mergeable_cache, returned_cache
from horizonrl.errors import TrainingError
from horizonrl.tokens import common_prefix_len
from horizonrl.train.batching import TokenBatch, collate, micro_batches
from horizonrl.train.constrained import mask_constrained
from horizonrl.types import Trajectory

#: Share the computation of a common prompt prefix across rows when it is at least this long.
MIN_SHARED_PREFIX = 32

_NON_LINEAR_HEAD_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _linear_head(model: Any) -> bool:
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, key, None) for key in _NON_LINEAR_HEAD_KEYS):
        return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def shared_prefix_len(batch: TokenBatch) -> int:
    """Tokens every row of ``batch`` shares at the start, short of the first position with a loss
    (the part whose keys and values can be computed once for all rows)."""
    ids = batch.input_ids
    if ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(dim=0)
    common = int(same.long().cumprod(0).sum())
    has_loss = batch.loss_mask.any(dim=0)
    first_loss = int(has_loss.nonzero()[0]) if has_loss.any() else ids.shape[1] - 1
    return min(common, first_loss)


def _hidden_after_prefix(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, shared: int, past: Any
) -> torch.Tensor:
    """Decoder hidden states of positions ``shared..L-1``, attending to ``past``: the keys and values
    of the first ``shared`` tokens (the same in every row)."""
    rows, length = input_ids.shape
    positions = torch.arange(shared, length, device=input_ids.device).expand(rows, -1)
    return model.get_decoder()(
        input_ids=input_ids[:, shared:],
        attention_mask=attention,
        position_ids=positions,
        **cache_kwargs(model, past),
        use_cache=True,
    ).last_hidden_state


def _expanded_cache(pairs: list[tuple[torch.Tensor, torch.Tensor]], rows: int, config: Any) -> Any:
    from transformers.cache_utils import DynamicCache

    return DynamicCache(
        ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in pairs],
        config=config,
    )


def _hidden_with_shared_prefix(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, shared: int
) -> torch.Tensor:
    """Decoder hidden states of positions ``shared..L-1``, the first ``shared`` tokens (the same in
    every row) run once for one row; the rows attend to its keys and values, and their gradients
    flow back into it, so the result and its gradients equal the full computation."""
    prefix = returned_cache(model.get_decoder()(input_ids=input_ids[:1, :shared], use_cache=True))
    past = _expanded_cache([(k, v) for k, v, *_ in prefix], input_ids.shape[0], model.config)
    return _hidden_after_prefix(model, input_ids, attention, shared, past)


class SharedPrefix:
    """The keys and values of a prompt prefix every trajectory of an update shares (an agent's system
    prompt with its tool schemas), computed once for all the update's micro-batches.

    Micro-batches attend to detached copies of the keys and values; after each backward
    :meth:`collect` adds their gradients to float32 sums, and :meth:`backward` sends the sums through
    the prefix's own graph once. The gradients equal those of computing the prefix in every
    micro-batch, for one forward and one backward of the prefix instead of one per micro-batch
    (measured: a third of an RL update's tokens on the calc env, 340 shared of ~600 per trajectory,
    two trajectories per 1024-token micro-batch). The prefix's graph lives until :meth:`backward`.
    """

    def __init__(self, model: Any, ids: list[int], autocast_dtype: torch.dtype | None = None) -> None:
        device = next(model.parameters()).device
        with autocast(autocast_dtype, device):
            past = model.get_decoder()(input_ids=torch.tensor([ids], device=device), use_cache=True)
        self.ids = list(ids)
        self.length = len(ids)
        self._outputs = [t for k, v, *_ in returned_cache(past) for t in (k, v)]
        self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._outputs]
        self._sums: list[torch.Tensor | None] = [None] * len(self._leaves)

    def cache(self, rows: int, config: Any) -> Any:
        """A cache of the prefix for a micro-batch of ``rows`` rows."""
        pairs = list(zip(self._leaves[0::2], self._leaves[1::2], strict=True))
        return _expanded_cache(pairs, rows, config)

    def collect(self) -> None:
        """Move the gradients a micro-batch's backward left on the keys and values into the sums."""
        for i, leaf in enumerate(self._leaves):
            if leaf.grad is not None:
                grad = leaf.grad.float()
                self._sums[i] = grad if self._sums[i] is None else self._sums[i] + grad
                leaf.grad = None

    def backward(self) -> None:
        """Backpropagate the collected gradients through the prefix (once) and free its graph."""
        self.collect()
        pairs = [(o, g.to(o.dtype)) for o, g in zip(self._outputs, self._sums, strict=True) if g is not None]
        self._outputs, self._leaves, self._sums = [], [], []
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def recomputes_layers(model: Any) -> bool:
    """Whether this forward runs under gradient checkpointing (``model.gradient_checkpointing``, in
    training, with gradients on). Its layers run again in the backward pass, and a layer that
    appends to a KV cache would append twice, so the shared-prefix paths are off then."""
    flag = (
        "is_activation_checkpointing"
        if hasattr(model, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(model, flag, False)) and model.training and torch.is_grad_enabled()


def shares_prefix(model: Any) -> bool:
    """Whether ``token_logprobs`` computes a prompt prefix shared by all rows once for ``model`` (not
    under gradient checkpointing: :func:`recomputes_layers`)."""
    return _linear_head(model) and mergeable_cache(model.config) and not recomputes_layers(model)


def common_prompt_prefix(trajectories: Sequence[Trajectory]) -> int:
    """Length of the prompt prefix every trajectory shares (e.g. the system prompt with tool schemas),
    short of each prompt's last token, whose position predicts the first response token."""
    prompts = [t.prompt_ids for t in trajectories]
    return common_prefix_len(prompts, min((len(p) for p in prompts), default=1) - 1)


def shared_prompt_prefix(
    model: Any, trajectories: Sequence[Trajectory], max_tokens: int, autocast_dtype: torch.dtype | None
) -> SharedPrefix | None:
    """The keys and values of the prompt prefix every trajectory shares, computed once for all
    micro-batches; None when it is shorter than ``MIN_SHARED_PREFIX``, does not leave room in a
    micro-batch of ``max_tokens``, or ``model`` cannot share it."""
    if len(trajectories) < 2 or not shares_prefix(model):
        return None
    shared = common_prompt_prefix(trajectories)
    if shared < MIN_SHARED_PREFIX or shared >= max_tokens:
        return None
    return SharedPrefix(model, trajectories[0].prompt_ids[:shared], autocast_dtype)


def autocast(
    dtype: torch.dtype | None, device: torch.device | str = "cpu"
) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


@dataclass
class PolicyOutput:
    """What one forward pass yields at the loss positions of a batch: float32 ``[N, L-1]`` tensors,
    zero where ``loss_mask`` is 0. ``entropy`` and ``values`` are None unless asked for; so are the
    ``[N, L-1, k]`` tensors ``top_ids``/``top_logprobs`` (the ``k`` most likely next tokens) and
    ``gathered`` (the logprobs of the ids given in ``gather_ids``)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    gathered: torch.Tensor | None = None


def _scatter(mask: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """``selected`` [M, *rest] (one entry per loss position) placed at ``mask``'s positions of a zero
    tensor [N, L-1, *rest]."""
    out = torch.zeros((*mask.shape, *selected.shape[1:]), dtype=selected.dtype, device=mask.device)
    out[mask] = selected
    return out


def policy_forward(
    model: Any,
    batch: TokenBatch,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    entropy: Literal["none", "detached", "grad"] = "none",
    value_head: Any = None,
    prefix: SharedPrefix | None = None,
    top_k: int = 0,
    gather_ids: torch.Tensor | None = None,
) -> PolicyOutput:
    """Log-probabilities of ``batch.targets`` under ``model`` (logits divided by ``temperature``, the
    sampling temperature; 0 or 1 means none, so the result compares with the sampler's logprobs).

    ``entropy``: the policy's entropy per loss position, detached ("detached") or carrying the
    gradient for an entropy bonus ("grad"). ``value_head``: a module mapping the decoder's last hidden
    state ``[M, H]`` to values ``[M, 1]``, applied at the same positions (the state before each model
    token), so a critic shares this forward pass. ``prefix``: the keys and values of the prompt prefix
    every row starts with, computed once for many micro-batches (:class:`SharedPrefix`). ``top_k``:
    also the ``k`` most likely next tokens and their logprobs (detached). ``gather_ids`` [N, L-1, k]:
    also the logprobs of those tokens at each loss position, with the gradient (a KL over the
    reference's most likely tokens)."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    attention = batch.attention_mask.to(device)
    mask = batch.loss_mask.to(device) > 0
    targets = batch.targets.to(device)[mask]
    scale = 1.0 / temperature if temperature and temperature > 0 else 1.0
    with autocast(autocast_dtype, device):
        if prefix is not None:
            past = prefix.cache(input_ids.shape[0], model.config)
            hidden = _hidden_after_prefix(model, input_ids, attention, prefix.length, past)
            selected = hidden[:, :-1][mask[:, prefix.length :]]
            logits = model.get_output_embeddings()(selected)
        elif _linear_head(model):
            shared = shared_prefix_len(batch) if shares_prefix(model) else 0
            if shared >= MIN_SHARED_PREFIX:
                hidden = _hidden_with_shared_prefix(model, input_ids, attention, shared)
                selected = hidden[:, :-1][mask[:, shared:]]
            else:
                decoder = model.get_decoder()
                hidden = decoder(
                    input_ids=input_ids, attention_mask=attention, use_cache=False
                ).last_hidden_state
                selected = hidden[:, :-1][mask]
            logits = model.get_output_embeddings()(selected)
        else:
            out = model(
                input_ids=input_ids,
                attention_mask=attention,
                output_hidden_states=value_head is not None,
                use_cache=False,
            )
            logits = out.logits[:, :-1][mask]
            selected = out.hidden_states[-1][:, :-1][mask] if value_head is not None else None
    logits = mask_constrained(logits, mask, batch.constrained)
    logp_all = torch.log_softmax(logits.float() * scale, dim=-1)
    chosen = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    result = PolicyOutput(_scatter(mask, chosen))
    if top_k > 0:
        top = logp_all.detach().topk(min(top_k, logp_all.shape[-1]), dim=-1)
        result.top_ids, result.top_logprobs = _scatter(mask, top.indices), _scatter(mask, top.values)
    if gather_ids is not None:
        at = gather_ids.to(device)[mask].long()
        result.gathered = _scatter(mask, logp_all.gather(-1, at))
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            # masked tokens: probability 0 times logprob -inf counts 0
            result.entropy = _scatter(mask, -(logp_all.exp() * logp_all.clamp_min(-1e30)).sum(-1))
    if value_head is not None:
        result.values = _scatter(mask, value_head(selected.float()).squeeze(-1))
    return result


def token_logprobs(
    model: Any,
    batch: TokenBatch,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs, entropy)`` of ``batch.targets`` under ``model``: float32 [N, L-1], zero where
    ``loss_mask`` is 0 (see :func:`policy_forward`). ``entropy`` (detached, same shape) is returned
    when ``with_entropy``."""
    out = policy_forward(model, batch, temperature, autocast_dtype, "detached" if with_entropy else "none")
    return out.logprobs, out.entropy


def _response_rows(values: torch.Tensor, batch_trajs: Sequence[Trajectory]) -> list[Any]:
    """Rows of a batch tensor cut back to each trajectory's response positions: a list of floats
    from [n, L-1], a tensor [R, k] from [n, L-1, k]."""
    out: list[Any] = []
    for i, traj in enumerate(batch_trajs):
        p = len(traj.prompt_ids)
        row = values[i, p - 1 : p - 1 + len(traj.response_ids)]
        out.append(row.tolist() if row.dim() == 1 else row.clone())
    return out


@torch.no_grad()
def old_outputs(
    model: Any,
    trajectories: Sequence[Trajectory],
    pad_id: int,
    max_tokens: int,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    value_head: Any = None,
    with_reference: bool = False,
    top_k: int = 0,
    replay: Any = None,
) -> dict[str, list[Any]]:
    """The no-grad pass before an RL update: per-response-token ``old_logprobs`` (and, with
    ``value_head``, the critic's ``old_values``; with ``with_reference``, ``ref_logprobs``; with
    ``top_k``, ``old_top_ids``/``old_top_logprobs``, one [R, k] tensor per trajectory) under the
    policy as it is before the update, in micro-batches of ``max_tokens``. The reference is the
    policy with its LoRA adapter switched off. A prompt prefix every trajectory shares is computed
    once (under each of the two policies). ``replay`` rebuilds constrained turns' masks (see
    :mod:`horizonrl.train.constrained`)."""
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    names = ["old_logprobs"] + (["old_values"] if value_head is not None else [])
    names += ["ref_logprobs"] if with_reference else []
    names += ["old_top_ids", "old_top_logprobs"] if top_k > 0 else []
    rows: dict[str, list[Any]] = {name: [None] * len(trajectories) for name in names}
    was_training = model.training
    model.eval()
    try:
        prefix = shared_prompt_prefix(model, trajectories, max_tokens, autocast_dtype)
        ref_prefix = None
        if with_reference and prefix is not None:
            with model.disable_adapter():
                ref_prefix = shared_prompt_prefix(model, trajectories, max_tokens, autocast_dtype)
        shared = prefix.length if prefix is not None else 0
        for idx in micro_batches([n - shared for n in lengths], max_tokens - shared):
            chosen = [trajectories[i] for i in idx]
            batch = collate(chosen, pad_id, replay=replay)
            out = policy_forward(
                model, batch, temperature, autocast_dtype, value_head=value_head, prefix=prefix, top_k=top_k
            )
            found: dict[str, torch.Tensor] = {"old_logprobs": out.logprobs}
            if value_head is not None:
                found["old_values"] = out.values
            if top_k > 0:
                found["old_top_ids"], found["old_top_logprobs"] = out.top_ids, out.top_logprobs
            if with_reference:
                with model.disable_adapter():
                    found["ref_logprobs"] = policy_forward(
                        model, batch, temperature, autocast_dtype, prefix=ref_prefix
                    ).logprobs
            for name, tensor in found.items():
                bad = (~torch.isfinite(tensor)).flatten(1).any(dim=-1).nonzero().flatten().tolist()
                if bad:
                    raise TrainingError(
                        f"non-finite {name} for trajectories {[batch.ids[i] for i in bad][:5]}: "
                        "the weights may have diverged"
                    )
                for i, row in zip(idx, _response_rows(tensor, chosen), strict=True):
                    rows[name][i] = row
    finally:
        model.train(was_training)
    return {name: [[] if r is None else r for r in values] for name, values in rows.items()}


def reference_outputs(
    model: Any,
    trajectories: Sequence[Trajectory],
    pad_id: int,
    max_tokens: int,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    top_k: int = 0,
    replay: Any = None,
) -> dict[str, list[Any]]:
    """Per-response-token ``ref_logprobs`` of ``trajectories`` under the reference: the policy with its
    LoRA adapter switched off (the RL start); with ``top_k``, also ``ref_top_ids`` and
    ``ref_top_logprobs`` (its ``k`` most likely tokens at each position, one [R, k] tensor per
    trajectory). The reference does not change during a step, so one no-grad pass (its shared
    prompt prefix computed once) serves every mini-batch of the KL term."""
    with model.disable_adapter():
        rows = old_outputs(
            model, trajectories, pad_id, max_tokens, temperature, autocast_dtype, top_k=top_k, replay=replay
        )
    return {name.replace("old_", "ref_", 1): values for name, values in rows.items()}
