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
from dataclasses import dataclass
from typing import Any, Literal

import torch

from horizonrl.train.batching import TokenBatch

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


def _mergeable(model: Any) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _hidden_with_shared_prefix(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, shared: int
) -> torch.Tensor:
    """Decoder hidden states of positions ``shared..L-1``, the first ``shared`` tokens (the same in
    every row) run once for one row; the rows attend to its keys and values, and their gradients
    flow back into it, so the result and its gradients equal the full computation."""
    from transformers.cache_utils import DynamicCache

    decoder = model.get_decoder()
    rows, length = input_ids.shape
    prefix = decoder(input_ids=input_ids[:1, :shared], use_cache=True).past_key_values
    expanded = DynamicCache(
        ddp_cache_data=[
            (keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1)) for keys, values, *_ in prefix
        ],
        config=model.config,
    )
    positions = torch.arange(shared, length, device=input_ids.device).expand(rows, -1)
    return decoder(
        input_ids=input_ids[:, shared:],
        attention_mask=attention,
        position_ids=positions,
        past_key_values=expanded,
        use_cache=True,
    ).last_hidden_state


def shares_prefix(model: Any) -> bool:
    """Whether ``token_logprobs`` computes a prompt prefix shared by all rows once for ``model``."""
    return _linear_head(model) and _mergeable(model)


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
    zero where ``loss_mask`` is 0. ``entropy`` and ``values`` are None unless asked for."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def _scatter(mask: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(mask, selected)


def policy_forward(
    model: Any,
    batch: TokenBatch,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    entropy: Literal["none", "detached", "grad"] = "none",
    value_head: Any = None,
) -> PolicyOutput:
    """Log-probabilities of ``batch.targets`` under ``model`` (logits divided by ``temperature``, the
    sampling temperature; 0 or 1 means none, so the result compares with the sampler's logprobs).

    ``entropy``: the policy's entropy per loss position, detached ("detached") or carrying the
    gradient for an entropy bonus ("grad"). ``value_head``: a module mapping the decoder's last hidden
    state ``[M, H]`` to values ``[M, 1]``, applied at the same positions (the state before each model
    token), so a critic shares this forward pass."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    attention = batch.attention_mask.to(device)
    mask = batch.loss_mask.to(device) > 0
    targets = batch.targets.to(device)[mask]
    scale = 1.0 / temperature if temperature and temperature > 0 else 1.0
    with autocast(autocast_dtype, device):
        if _linear_head(model):
            shared = shared_prefix_len(batch) if _mergeable(model) else 0  # linear head checked above
            if shared >= MIN_SHARED_PREFIX:
                hidden = _hidden_with_shared_prefix(model, input_ids, attention, shared)
                selected = hidden[:, :-1][mask[:, shared:]]
            else:
                hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
                selected = hidden[:, :-1][mask]
            logits = model.get_output_embeddings()(selected)
        else:
            out = model(
                input_ids=input_ids, attention_mask=attention, output_hidden_states=value_head is not None
            )
            logits = out.logits[:, :-1][mask]
            selected = out.hidden_states[-1][:, :-1][mask] if value_head is not None else None
    logp_all = torch.log_softmax(logits.float() * scale, dim=-1)
    chosen = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    result = PolicyOutput(_scatter(mask, chosen))
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            result.entropy = _scatter(mask, -(logp_all.exp() * logp_all).sum(-1))
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
