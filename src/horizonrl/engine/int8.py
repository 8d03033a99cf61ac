"""The int8 sampling copy (``engine.dtype: int8``): the engine decodes with int8 matmuls, the trainer
stays exact.

Every linear layer of the engine's own copy of the model (the attention and MLP projections and the
output head, untied from the embedding) multiplies int8 by int8 into int32 (``torch._int_mm``: the
CPU's VNNI kernels, 4-5x a float32 matmul at decode shapes here): its weight with one scale per
output channel, its input with one scale per row, quantized on the fly. Because every row carries
its own scale and integer sums are exact, a row's logits do not depend on what else is in its batch
(per-request seeds stay reproducible). The embedding, norms and attention stay float32.

Activations of these models have outlier channels that one scale per row cannot hold (the first
try, PyTorch's dynamic quantization with one scale per batch: KL 1.18 nats per token to float32 on
held-out text). SmoothQuant (Xiao et al., 2023) moves the difficulty into the weights: each input
channel ``j`` of a norm-fed group of layers is divided by ``s_j = max|x_j|^a / max|W_j|^(1-a)``
(``a`` = 0.5) inside the norm's weight and multiplied into the layers' weight columns, which leaves
the float function unchanged; the MLP's down projection is smoothed through the rows of the up
projection. The activation maxima come from one forward pass over :data:`CALIBRATION` when the copy
is made. Measured on held-out text (README and source): KL 0.017 nats per token to float32 (bfloat16:
0.0013), which ``sampler_kl`` logs and ``train.tis_cap`` corrects.

A weight update (``HFEngine.update_weights``) applies the same smoothing to the policy's weights (a
LoRA policy merged weight by weight) and requantizes every layer. Supported: Llama-style decoders
(each layer's ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``,
``mlp.{gate,up,down}_proj``, and ``model.norm``; SmolLM2, Llama, Qwen2, Mistral). Refused in one
line: another architecture, a model on a GPU, a PyTorch without int8 matmuls, per-row LoRA adapters.
"""

from __future__ import annotations

from typing import Any

import torch

from horizonrl.engine.weights import plain_weights, sampler_model
from horizonrl.errors import ConfigError

#: what to use instead, named in every refusal
EXACT = "use engine.dtype bfloat16 or float32"
ALPHA = 0.5
#: calibration text: prose, code, a tool call and arithmetic, as agents here read and write them
CALIBRATION = (
    "You are a helpful assistant that solves tasks step by step and calls tools when needed.\n"
    "User: A train leaves at 9:40 and arrives at 13:05. How long is the trip in minutes?\n"
    'Assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "(13*60+5)-(9*60+40)"}}'
    "</tool_call>\nTool: 205\nAssistant: The trip takes 205 minutes.\n"
    "def has_close_elements(numbers: list[float], threshold: float) -> bool:\n"
    '    """Check if any two numbers are closer to each other than the threshold."""\n'
    "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1 :]:\n"
    "            if abs(a - b) < threshold:\n                return True\n    return False\n"
    "The committee reviewed the proposal on Tuesday and asked for a revised budget, a clearer "
    "timeline and letters of support from two partner institutions before the March deadline.\n"
    "$ ls -la /workspace && python -m pytest -q tests/test_solution.py\n3 passed in 0.12s\n"
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89; 3.14159 * 2 = 6.28318; 1e-3 + 0.5 = 0.501\n"
)


class Int8Linear(torch.nn.Module):
    """A linear layer as int8 weight columns times per-row int8 inputs (see the module doc); its
    ``col_scale`` (the smoothing of its inputs) and ``row_scale`` (of its outputs, the up
    projection's) are applied to every weight it is given."""

    def __init__(self, out_features: int, in_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = torch.nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        self.register_buffer("qweight_t", torch.zeros(in_features, out_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features))
        self.register_buffer("col_scale", torch.ones(in_features))
        self.register_buffer("row_scale", torch.ones(out_features))

    @torch.no_grad()
    def set_weight(self, weight: torch.Tensor) -> None:
        """Quantize ``weight`` ``[out, in]`` (unsmoothed: the layer applies its scales)."""
        w = weight.float() * self.col_scale / self.row_scale[:, None]
        scale = w.abs().amax(1).clamp(min=1e-8) / 127
        self.qweight_t = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).t()
        self.w_scale = scale

    @torch.no_grad()
    def set_bias(self, bias: torch.Tensor) -> None:
        assert self.bias is not None
        self.bias.copy_(bias.float() / self.row_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()
        scale = rows.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
        q = torch.round(rows / scale).to(torch.int8)
        out = torch._int_mm(q, self.qweight_t).float() * scale * self.w_scale
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)


def int8_unavailable() -> str | None:
    """Why this PyTorch cannot run the int8 sampling copy (None: it can)."""
    try:
        a = torch.ones(2, 8, dtype=torch.int8)
        torch._int_mm(a, a.t())
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"this PyTorch has no CPU int8 matmul (torch._int_mm: {type(exc).__name__})"
    return None


def is_int8(model: Any) -> bool:
    return bool(getattr(model, "_horizonrl_int8", False))


def _llama_layers(model: Any) -> list[Any]:
    """The decoder layers of a Llama-style model; ConfigError naming the architecture otherwise."""
    inner = getattr(model, "model", None)
    layers = list(getattr(inner, "layers", []) or [])
    parts = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "mlp.down_proj")

    def has(layer: Any, dotted: str) -> bool:
        for name in dotted.split("."):
            layer = getattr(layer, name, None)
        return layer is not None

    if (
        not layers
        or getattr(inner, "norm", None) is None
        or not all(has(ly, p) for ly in layers for p in parts)
    ):
        arch = type(model).__name__
        raise ConfigError(
            f"engine.dtype int8 supports Llama-style decoders (SmolLM2, Llama, Qwen2, Mistral), not {arch}; "
            f"{EXACT}"
        )
    return layers


def _input_maxima(model: Any, tokenizer: Any, layers: list[Any]) -> dict[Any, torch.Tensor]:
    """Per smoothed layer group (keyed by its first layer): the max |activation| of each input channel
    over :data:`CALIBRATION`."""
    firsts = [m for ly in layers for m in (ly.self_attn.q_proj, ly.mlp.gate_proj, ly.mlp.down_proj)]
    firsts.append(model.get_output_embeddings())
    maxima: dict[Any, torch.Tensor] = {}

    def record(module: Any, args: tuple[Any, ...]) -> None:
        seen = args[0].detach().float().reshape(-1, args[0].shape[-1]).abs().amax(0)
        maxima[module] = torch.maximum(maxima[module], seen) if module in maxima else seen

    hooks = [m.register_forward_pre_hook(record) for m in firsts]
    try:
        with torch.no_grad():
            model(torch.tensor([tokenizer.encode(CALIBRATION)]))
    finally:
        for h in hooks:
            h.remove()
    return maxima


def _smoothing(amax: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    wmax = torch.stack([w.detach().float().abs().amax(0) for w in weights]).amax(0)
    return (amax.clamp(min=1e-5) ** ALPHA / wmax.clamp(min=1e-5) ** (1 - ALPHA)).clamp(min=1e-5)


def int8_sampler_model(model: Any, tokenizer: Any) -> Any:
    """The engine's own int8 copy of a plain ``model`` (see the module doc); ``model`` is unchanged."""
    reason = int8_unavailable()
    if reason is not None:
        raise ConfigError(f"engine.dtype int8: {reason}; {EXACT}")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"engine.dtype int8 runs on the CPU's int8 kernels, not on {device}; {EXACT}")
    copy = sampler_model(model, "float32")
    layers = _llama_layers(copy)
    maxima = _input_maxima(copy, tokenizer, layers)
    head = copy.get_output_embeddings()
    names = {m: n for n, m in copy.named_modules()}
    norm_scales: dict[str, torch.Tensor] = {}  # a norm's weight is divided by the smoothing of its group
    col_scales: dict[str, torch.Tensor] = {}  # a layer's weight columns are multiplied by it
    row_scales: dict[str, torch.Tensor] = {}  # the up projection's rows: divided by the down's smoothing

    def smooth(norm: Any, fed: list[Any], amax: torch.Tensor) -> None:
        scale = _smoothing(amax, [m.weight for m in fed])
        norm_scales[f"{names[norm]}.weight"] = scale
        col_scales.update({names[m]: scale for m in fed})

    for ly in layers:
        attn, mlp = ly.self_attn, ly.mlp
        smooth(ly.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], maxima[attn.q_proj])
        smooth(ly.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], maxima[mlp.gate_proj])
        down = _smoothing(maxima[mlp.down_proj], [mlp.down_proj.weight])
        col_scales[names[mlp.down_proj]], row_scales[names[mlp.up_proj]] = down, down
    smooth(copy.model.norm, [head], maxima[head])
    weights = plain_weights(copy)  # the float weights, before any layer is swapped
    for parent in list(copy.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                name = names[child]
                int8 = Int8Linear(child.out_features, child.in_features, child.bias is not None)
                if name in col_scales:
                    int8.col_scale.copy_(col_scales[name])
                if name in row_scales:
                    int8.row_scale.copy_(row_scales[name])
                setattr(parent, child_name, int8)
    copy._horizonrl_norm_scales = norm_scales
    if copy.config.tie_word_embeddings:
        copy.config.tie_word_embeddings = False  # the head is its own int8 layer now
    copy._horizonrl_int8 = True
    _load(copy, weights)
    return copy.eval()


def copy_into_int8(policy: Any, model: Any) -> None:
    """Copy ``policy``'s weights into the int8 ``model``, smoothed and requantized as when it was made;
    ValueError naming the misfits when the two do not have the same weights."""
    _load(model, plain_weights(policy))


def _load(model: Any, weights: dict[str, Any]) -> None:
    int8 = {n: m for n, m in model.named_modules() if isinstance(m, Int8Linear)}
    targets: dict[str, Any] = {f"{n}.weight": m for n, m in int8.items()}
    targets.update({f"{n}.bias": m for n, m in int8.items() if m.bias is not None})
    layers = tuple(f"{n}." for n in int8)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(layers)}
    targets.update(state)
    missing = sorted(set(targets) - set(weights))
    unexpected = sorted(set(weights) - set(targets))
    if missing or unexpected:
        raise ValueError(
            "update_weights: the policy's weights do not fit the engine's int8 model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    norms: dict[str, torch.Tensor] = model._horizonrl_norm_scales
    with torch.no_grad():
        for key, target in targets.items():
            value = weights[key].make()
            if isinstance(target, Int8Linear):
                target.set_weight(value) if key.endswith(".weight") else target.set_bias(value)
            elif key in norms:
                target.copy_(value.float() / norms[key])
            else:
                target.copy_(value)
