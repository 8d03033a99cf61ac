"""The engine's decode step for Llama-style decoders, written out as tensor operations.

A decode step through a transformers model's ``forward`` spends more time in Python than in
arithmetic on a CPU: module calls, the cache object's bookkeeping, the rotary embedding rebuilt per
layer, masks and output objects, three projections where one would do. Measured on this machine
for SmolLM2-135M (``benchmarks/engine_throughput.py``, 16 prompts): the engine decodes 1.09-1.10x
faster in bfloat16 and 1.11x faster with the int8 copy than through ``forward``.
:class:`LlamaDecodeStep` is that step: per layer the pre-norm attention (one projection for q, k and
v in the fast copy, the rotary embedding computed once per step for all layers, the new column
written into the KV cache's :class:`horizonrl.engine.kvcache.GrowingLayer` buffer, grouped-query
attention with two batched matmuls under the mask) and the gated MLP; then the final norm and the
head.

It holds the model's own weight tensors (the engine builds one per batch it decodes; weight updates
wait for the batch and copy in place) and computes what ``forward`` computes, in the same order and
dtype (tested: the same tokens and logprobs from the engine either way, for float32 and the int8
copy). Models it does not cover (:func:`unsupported` says why) decode through ``forward``: a PEFT
model (per-row LoRA adapters), an architecture other than Llama, Qwen2 and Mistral, sliding-window
attention, QK norms.
Prefill (many tokens per row) always goes through ``forward``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from horizonrl.engine.attention import one_token_attention
from horizonrl.engine.fast_copy import PackedGroup, PackedLinear

#: model types whose decoder layers are the plain pre-norm Llama layer
LLAMA_TYPES = ("llama", "qwen2", "mistral")


class _Projection:
    """Layers that read one input (q/k/v, gate/up, or one alone): their outputs in one call.

    Members of one :class:`horizonrl.engine.fast_copy.PackedGroup` share one matmul, sliced; other
    layers are applied one by one."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        group = getattr(layers[0], "group", None)
        shared = all(isinstance(m, PackedLinear) and m.group is group for m in layers)
        self.group = group if shared else None
        self.slices = (
            [slice(m.group.starts[m.member], m.group.starts[m.member + 1]) for m in layers] if shared else []
        )

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.group is None:
            return [
                F.linear(x, m.weight, m.bias) if isinstance(m, torch.nn.Linear) else m(x) for m in self.layers
            ]
        out = self.group.matmul(x)
        parts = [out[:, s] for s in self.slices]
        return [
            p if m.bias_value is None else p + m.bias_value for p, m in zip(parts, self.layers, strict=True)
        ]


def _norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """``LlamaRMSNorm`` (float32 inside, the weight applied in the input's dtype)."""
    eps = norm.variance_epsilon
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def unsupported(model: Any) -> str | None:
    """Why :class:`LlamaDecodeStep` cannot run ``model`` (None: it can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if hasattr(model, "get_base_model") or hasattr(model, "peft_config"):
        return "a PEFT model (per-row adapters)"
    if kind not in LLAMA_TYPES:
        return f"model type {kind!r} (covered: {', '.join(LLAMA_TYPES)})"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "layers other than full attention"
    inner = getattr(model, "model", None)
    layers = list(getattr(inner, "layers", []) or [])
    if not layers or getattr(inner, "rotary_emb", None) is None:
        return "no decoder layers with a rotary embedding"
    linear = (torch.nn.Linear, PackedLinear)
    for ly in layers:
        attn, mlp = getattr(ly, "self_attn", None), getattr(ly, "mlp", None)
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(p) in linear for p in parts):
            return "projections other than plain or packed linear layers"
        if hasattr(attn, "q_norm"):
            return "attention with QK norms"
        if not hasattr(attn, "scaling"):
            return "attention without a scaling attribute"
    head = model.get_output_embeddings()
    if type(head) not in linear:
        return "an output head other than a linear layer"
    return None


def _packed_attention_input(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qkv: PackedGroup,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed layer's queries (rotated), keys (rotated) and values for one step: the input norm,
    one matmul for q, k and v, the rotary embedding of q and k at once."""
    rows, dim = x.shape[0], cos.shape[-1]
    out = qkv.matmul(F.rms_norm(x, (x.shape[-1],), norm_weight, eps))
    if qkv_bias is not None:
        out = out + qkv_bias
    rotated = _rotate(out[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim), cos, sin)
    return (
        rotated[:, :heads],
        rotated[:, heads:],
        out[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim),
    )


def _packed_attention_output_and_mlp(
    x: torch.Tensor,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    o: PackedGroup,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up: PackedGroup,
    down: PackedGroup,
) -> torch.Tensor:
    """The rest of a packed layer's step: grouped-query attention over the KV buffer (``bias``: 0 or
    -inf per column), the output projection and residual, the post-attention norm, the gated SiLU MLP
    (gate and up in one matmul) and residual."""
    attended = one_token_attention(q, keys, values, bias, scaling).reshape(x.shape[0], -1)
    x = x + o.matmul(attended)
    gate, up = gate_up.matmul(F.rms_norm(x, (x.shape[-1],), norm_weight, eps)).chunk(2, dim=-1)
    return x + down.matmul(F.silu(gate) * up)


def _packed_layer(ly: Any) -> tuple[Any, ...] | None:
    """A packed layer's groups for the fused functions above: q/k/v one group in that order, gate/up
    one group, a SiLU MLP without bias; None for any other layer."""
    attn, mlp = ly.self_attn, ly.mlp
    qkv, gate_up = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
    parts = [*qkv, attn.o_proj, *gate_up, mlp.down_proj]
    if not all(isinstance(m, PackedLinear) for m in parts):
        return None
    in_order = all(
        [m.group for m in group] == [group[0].group] * len(group)
        and [m.member for m in group] == list(range(len(group)))
        and group[0].group.starts[-1] == sum(m.out_features for m in group)
        for group in (qkv, gate_up)
    )
    biased = [m.bias_value is not None for m in parts]
    if not in_order or any(biased[3:]) or type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
        return None
    qkv_bias = (
        torch.cat([m.bias_value if m.bias_value is not None else torch.zeros(m.out_features) for m in qkv])
        if any(biased[:3])
        else None
    )
    eps_in, eps_post = ly.input_layernorm.variance_epsilon, ly.post_attention_layernorm.variance_epsilon
    group = qkv[0].group
    return (
        (ly.input_layernorm.weight, eps_in, group, qkv_bias),
        (
            float(attn.scaling),
            attn.o_proj.group,
            ly.post_attention_layernorm.weight,
            eps_post,
            gate_up[0].group,
            mlp.down_proj.group,
        ),
    )


class LlamaDecodeStep:
    """One decode step of a Llama-style ``model`` (plain or the fast copy; see the module doc)."""

    def __init__(self, model: Any) -> None:
        config = model.config
        self.embed = model.model.embed_tokens
        self.rotary = model.model.rotary_emb
        self.final_norm = model.model.norm
        self.head = _Projection([model.get_output_embeddings()])
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = model.model.layers[0].self_attn.head_dim
        packed_layers = [_packed_layer(ly) for ly in model.model.layers]
        #: the fast copy's layers, for the fused layer functions (None: each projection on its own)
        self.packed_layers = packed_layers if all(f is not None for f in packed_layers) else None
        #: every other model's layers: norms, projections, activation, attention scaling
        self.layers = []
        for ly in model.model.layers if self.packed_layers is None else []:
            attn, mlp = ly.self_attn, ly.mlp
            self.layers.append(
                (
                    ly.input_layernorm,
                    _Projection([attn.q_proj, attn.k_proj, attn.v_proj]),
                    _Projection([attn.o_proj]),
                    ly.post_attention_layernorm,
                    _Projection([mlp.gate_proj, mlp.up_proj]),
                    _Projection([mlp.down_proj]),
                    mlp.act_fn,
                    float(attn.scaling),
                )
            )

    @torch.no_grad()
    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: Any, mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` for ``tokens`` ``[rows]`` at ``positions`` ``[rows]``, appending
        their keys and values to ``cache`` (a DynamicCache of GrowingLayers with room for one more
        column); ``mask`` ``[rows, 1, 1, capacity]`` (bool) says which buffer columns each row attends
        to, the new one included."""
        x = self.embed(tokens)
        rows, dim = x.shape[0], self.head_dim
        cos, sin = self.rotary(x, positions[:, None])
        cos, sin = cos.view(rows, 1, dim), sin.view(rows, 1, dim)
        bias = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
        if self.packed_layers is not None:
            for (first, rest), layer in zip(self.packed_layers, cache.layers, strict=True):
                q, k, v = _packed_attention_input(x, *first, cos, sin, self.heads, self.kv_heads)
                keys, values = layer.update(k[:, :, None], v[:, :, None])
                x = _packed_attention_output_and_mlp(x, q, keys, values, bias, *rest)
        else:
            x = self._plain_layers(x, cos, sin, cache, bias)
        (logits,) = self.head(_norm(x, self.final_norm))
        return logits

    def _plain_layers(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any, bias: torch.Tensor
    ) -> torch.Tensor:
        rows, dim = x.shape[0], self.head_dim
        for (in_norm, qkv, o_proj, post_norm, gate_up, down, act, scaling), layer in zip(
            self.layers, cache.layers, strict=True
        ):
            q, k, v = qkv(_norm(x, in_norm))
            q = _rotate(q.view(rows, self.heads, dim), cos, sin)
            k = _rotate(k.view(rows, self.kv_heads, dim), cos, sin)
            keys, values = layer.update(k[:, :, None], v.view(rows, self.kv_heads, 1, dim))
            attended = one_token_attention(q, keys, values, bias, scaling)
            (out,) = o_proj(attended.reshape(rows, self.heads * dim))
            x = x + out
            gate, up = gate_up(_norm(x, post_norm))
            (out,) = down(act(gate) * up)
            x = x + out
        return x


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding as transformers' Llama applies it (halves rotated)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def decode_step_for(model: Any) -> LlamaDecodeStep | None:
    """The written-out decode step for ``model``, or None where it decodes through ``forward``."""
    return LlamaDecodeStep(model) if unsupported(model) is None else None
