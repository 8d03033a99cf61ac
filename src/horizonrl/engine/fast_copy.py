"""The fast sampling copy (``engine.dtype: int8``, ``float16`` or ``fast``): the engine decodes with
packed low-precision linear layers, the trainer stays exact.

``fast`` picks by the CPU (:func:`horizonrl.hardware.resolve_sampler_dtype`): int8 where it has int8
dot products (VNNI, AMX), else float16 weights. ``int8`` on a CPU without them is refused (PyTorch's
int8 matmul measured 14x slower than float32 there). Float16 weights (:class:`PackedGroup` with
``kind="float16"``) go through fbgemm's half-precision GEMM (``torch.ops.quantized``): float32
inputs and arithmetic, weights stored and read in float16; measured on an AVX2-only AMD EPYC, 16
rows, a step's matmuls 35.4 against 79.1 ms in float32, a relative error of 2e-4 (no smoothing, no
input quantization). The rest of this doc is the int8 kind.

Every linear layer of the engine's own copy of the model (the attention and MLP projections and the
output head, untied from the embedding) multiplies int8 by int8 into int32 (``torch._int_mm``: the
CPU's VNNI kernels, 4-5x a float32 matmul at decode shapes here): its weight with one scale per
output channel, its input with one scale per row, quantized on the fly. Because every row carries
its own scale and integer sums are exact, a row's logits do not depend on what else is in its batch
(per-request seeds stay reproducible). The embedding, norms and attention stay float32; the KV cache
is kept in bfloat16 where the CPU multiplies it through oneDNN (:func:`kv_cache_dtype`), else float32.

Activations of these models have outlier channels that one scale per row cannot hold (the first
try, PyTorch's dynamic quantization with one scale per batch: KL 1.18 nats per token to float32 on
held-out text). SmoothQuant (Xiao et al., 2023) moves the difficulty into the weights: each input
channel ``j`` of a norm-fed group of layers is divided by ``s_j = max|x_j|^a / max|W_j|^(1-a)``
(``a`` = 0.5) inside the norm's weight and multiplied into the layers' weight columns, which leaves
the float function unchanged; the MLP's down projection is smoothed through the rows of the up
projection. The activation maxima come from one forward pass over :data:`CALIBRATION` when the copy
is made. Measured on held-out text (README and source): KL 0.019 nats per token to float32 (bfloat16:
0.0013), which ``sampler_kl`` logs and ``train.tis_cap`` corrects.

A weight update (``HFEngine.update_weights``) applies the same smoothing to the policy's weights (a
LoRA policy merged weight by weight) and requantizes every layer. Supported: Llama-style decoders
(each layer's ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``,
``mlp.{gate,up,down}_proj``, and ``model.norm``; SmolLM2, Llama, Qwen2, Mistral). Refused in one
line: another architecture, a model on a GPU, int8 on a PyTorch without int8 matmuls or a CPU
without int8 dot products, float16 without fbgemm, per-row LoRA adapters.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from horizonrl.engine.weights import check_fits, plain_weights, sampler_model, write_weight
from horizonrl.errors import ConfigError
from horizonrl.hardware import cpu_bfloat16_matmuls, cpu_float16_weight_matmuls, cpu_int8_dot_products

#: the kinds of fast copy (``engine.dtype``)
FAST_KINDS = ("int8", "float16")
#: what to use instead, named in every refusal
EXACT = "use engine.dtype bfloat16 or float32"
ALPHA = 0.5
#: weights are quantized this many rows at a time (float32 temporaries of ~10 MB, not ~0.45 GB for
#: SmolLM2's 49,152-row head)
QUANTIZE_ROWS = 4096
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


def int8_matmul(rows: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``rows`` ``[n, in]`` times int8 weights ``qweight`` ``[out, in]`` with one scale per output
    channel: each row quantized to int8 with its own scale, one int8 matmul, rescaled to float32."""
    rows = rows.float()
    # max |x| per row: 5-10x linalg.vector_norm(inf) here
    scale = rows.abs().amax(1, keepdim=True).clamp_(min=1e-8).mul_(1 / 127)
    q = torch.div(rows, scale).round_().to(torch.int8)
    # (an int32 x float32 product skips the float() but runs 1.9x slower at prefill shapes)
    return torch._int_mm(q, qweight.t()).float().mul_(scale).mul_(w_scale)


class PackedGroup:
    """The packed weights of layers that read the same input (q, k and v; gate and up; or one layer
    alone): one matmul for all of them (and, for int8, one quantization of the input) per step. Each
    member (:class:`PackedLinear`) owns a block of output rows. ``kind``: ``"int8"`` (int8 weights, one
    scale per output channel) or ``"float16"`` (fbgemm-packed float16 weights, packed again once
    every member's rows are set)."""

    def __init__(self, in_features: int, sizes: list[int], kind: str = "int8") -> None:
        self.kind, self.in_features = kind, in_features
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        rows = self.starts[-1] if kind == "int8" else 0  # float16: the packed weights alone
        self.qweight = torch.zeros(rows, in_features, dtype=torch.int8)
        self.w_scale = torch.ones(rows)
        self.col_scale = torch.ones(in_features)  # the smoothing of the group's input
        self.packed: Any = None  # float16: fbgemm's packed weights
        self._unpacked: dict[int, torch.Tensor] = {}  # float16: members' rows set since the last pack
        self._input: torch.Tensor | None = None  # the input last multiplied, and what is still owed
        self._output: torch.Tensor | None = None
        self._owed: set[int] = set()

    def output(self, x: torch.Tensor, member: int) -> torch.Tensor:
        """Member ``member``'s output rows for ``x`` (the whole group computed once
        per input, in as few operators as it takes: on a CPU each costs microseconds of dispatch)."""
        if self._input is not x or member not in self._owed:
            self._output = self.matmul(x.reshape(-1, x.shape[-1]))
            self._input, self._owed = x, set(range(len(self.starts) - 1))
        assert self._output is not None
        out = self._output[:, self.starts[member] : self.starts[member + 1]]
        self._owed.discard(member)
        if not self._owed:  # every member served: hold no activations between steps
            self._input = self._output = None
        return out

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """The whole group's output ``[n, out]`` for input ``rows`` ``[n, in]``."""
        if self.kind == "float16":
            return torch.ops.quantized.linear_dynamic_fp16(rows.float(), self.packed)
        return int8_matmul(rows, self.qweight, self.w_scale)

    def set_float16_rows(self, member: int, weight: torch.Tensor) -> None:
        """Member ``member``'s float weight ``[out, in]``; the group is packed again once all are set."""
        self._unpacked[member] = weight.to(torch.float16)
        if len(self._unpacked) == len(self.starts) - 1:
            whole = torch.cat([self._unpacked[m] for m in range(len(self.starts) - 1)]).float()
            self._unpacked = {}
            self.packed = torch.ops.quantized.linear_prepack_fp16(whole, None)


class PackedLinear(torch.nn.Module):
    """One linear layer of a :class:`PackedGroup` (see the module doc); ``row_scale`` divides its
    output rows' weights (the up projection's: the down projection's smoothing)."""

    def __init__(self, group: PackedGroup, member: int, bias: bool = False) -> None:
        super().__init__()
        self.group, self.member = group, member
        self.in_features = group.in_features
        self.out_features = group.starts[member + 1] - group.starts[member]
        self.row_scale = torch.ones(self.out_features)
        self.bias_value = torch.zeros(self.out_features) if bias else None

    @torch.no_grad()
    def set_weight(self, weight: torch.Tensor) -> None:
        """Quantize ``weight`` ``[out, in]`` (unsmoothed: the layer applies its scales)."""
        g, lo = self.group, self.group.starts[self.member]
        if g.kind == "float16":
            g.set_float16_rows(self.member, weight.float() / self.row_scale[:, None])
            return
        for start in range(0, self.out_features, QUANTIZE_ROWS):  # temporaries of one block at a time
            rows = slice(start, min(start + QUANTIZE_ROWS, self.out_features))
            w = weight[rows].float() * g.col_scale / self.row_scale[rows, None]
            scale = w.abs().amax(1).clamp(min=1e-8) / 127
            out = slice(lo + rows.start, lo + rows.stop)
            g.qweight[out] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            g.w_scale[out] = scale

    @torch.no_grad()
    def set_bias(self, bias: torch.Tensor) -> None:
        assert self.bias_value is not None
        self.bias_value = bias.float() / self.row_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.output(x, self.member)
        if self.bias_value is not None:
            out = out + self.bias_value
        return out.reshape(*x.shape[:-1], self.out_features)


def kernel_unavailable(kind: str) -> str | None:
    """Why this machine cannot run the ``kind`` (``int8`` or ``float16``) copy fast (None: it can)."""
    if kind == "float16":
        if cpu_float16_weight_matmuls():
            return None
        engines = ", ".join(torch.backends.quantized.supported_engines)
        return f"this PyTorch or CPU has no fbgemm half-precision GEMM (x86 with AVX2; here: {engines})"
    try:
        a = torch.ones(2, 8, dtype=torch.int8)
        torch._int_mm(a, a.t())
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"this PyTorch has no CPU int8 matmul (torch._int_mm: {type(exc).__name__})"
    if not cpu_int8_dot_products():
        return (
            "this CPU has no int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX), where PyTorch's "
            "int8 matmul measured 14x slower than float32 (engine.dtype float16 or fast: float16 weights)"
        )
    return None


def is_fast_copy(model: Any) -> bool:
    """Whether ``model`` is the engine's fast copy (int8 or float16 linear layers)."""
    return bool(getattr(model, "_horizonrl_fast_copy", None))


def kv_cache_dtype(model: Any) -> torch.dtype | None:
    """The dtype the engine keeps ``model``'s KV caches in: bfloat16 for the fast copy where the CPU
    multiplies bfloat16 through oneDNN (:func:`horizonrl.hardware.cpu_bfloat16_matmuls`: its keys and
    values are computed in float32; kept in bfloat16 they take half the memory and attention reads
    half the bytes), None (the model's own) otherwise."""
    return torch.bfloat16 if is_fast_copy(model) and cpu_bfloat16_matmuls() else None


def _llama_layers(model: Any, kind: str) -> list[Any]:
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
            f"engine.dtype {kind} supports Llama-style decoders (SmolLM2, Llama, Qwen2, Mistral), "
            f"not {arch}; {EXACT}"
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
    wmax = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0)
    return (amax.clamp(min=1e-5) ** ALPHA / wmax.clamp(min=1e-5) ** (1 - ALPHA)).clamp(min=1e-5)


def fast_sampler_model(model: Any, tokenizer: Any, kind: str = "int8", shared: Collection[int] = ()) -> Any:
    """The engine's own ``kind`` (``int8`` or ``float16``) copy of a plain ``model`` (see the module
    doc); ``model`` is unchanged. Everything but the packed matmuls (the embedding, norms and
    attention) stays float32 (the KV cache: :func:`kv_cache_dtype`), the float32 parameters whose ids
    are in ``shared`` (the frozen embedding) the model's own, not copied:
    measured here, a bfloat16 body decoded 16% slower on short prompts (203 against 242 tokens/s:
    every layer's input and output converted) and 4% faster on 400-token ones."""
    if kind not in FAST_KINDS:
        raise ConfigError(f"the fast sampling copy is int8 or float16, not {kind!r}; {EXACT}")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"engine.dtype {kind} runs on the CPU's packed kernels, not on {device}; {EXACT}")
    reason = kernel_unavailable(kind)
    if reason is not None:
        raise ConfigError(f"engine.dtype {kind}: {reason}; {EXACT}")
    layers = _llama_layers(model, kind)
    # float16 weights need no smoothing: no activation is quantized
    maxima = _input_maxima(model, tokenizer, layers) if kind == "int8" else {}
    head = model.get_output_embeddings()
    names = {m: n for n, m in model.named_modules()}
    norm_scales: dict[str, torch.Tensor] = {}  # a norm's weight is divided by the smoothing of its group
    members: dict[str, tuple[PackedGroup, int]] = {}  # each linear layer (by name): its group and place
    row_scales: dict[str, torch.Tensor] = {}  # the up projection's rows: divided by the down's smoothing

    def group(fed: list[Any], col_scale: torch.Tensor | None) -> None:
        shared = PackedGroup(fed[0].in_features, [m.out_features for m in fed], kind)
        if col_scale is not None:
            shared.col_scale = col_scale.clone()
        members.update({names[m]: (shared, i) for i, m in enumerate(fed)})

    def smoothed(norm: Any, fed: list[Any], amax: torch.Tensor | None) -> None:
        if amax is None:  # float16: grouped, not smoothed
            group(fed, None)
            return
        scale = _smoothing(amax, [m.weight for m in fed])
        norm_scales[f"{names[norm]}.weight"] = scale
        group(fed, scale)

    for ly in layers:
        attn, mlp = ly.self_attn, ly.mlp
        smoothed(ly.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], maxima.get(attn.q_proj))
        smoothed(ly.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], maxima.get(mlp.gate_proj))
        if kind == "int8":
            down = _smoothing(maxima[mlp.down_proj], [mlp.down_proj.weight])
            group([mlp.down_proj], down)
            row_scales[names[mlp.up_proj]] = down
    smoothed(model.model.norm, [head], maxima.get(head))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        if names[m] not in members:  # o_proj, or a layer of a kind not smoothed: alone
            group([m], None)
    # the copy gets the float weights of everything but the linear layers (quantized from the
    # original below, one block at a time): no float32 duplicate of the model is made
    embedding = {id(p) for p in model.get_input_embeddings().parameters()}
    quantized = {id(p) for m in linears for p in m.parameters(recurse=False)} - embedding
    copy = sampler_model(model, "float32", without=quantized, shared=shared)
    for parent_name, parent in list(copy.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                name = f"{parent_name}.{child_name}" if parent_name else child_name
                packed = PackedLinear(*members[name], bias=child.bias is not None)
                if name in row_scales:
                    packed.row_scale = row_scales[name].clone()
                setattr(parent, child_name, packed)
    copy._horizonrl_norm_scales = norm_scales
    if copy.config.tie_word_embeddings:
        copy.config.tie_word_embeddings = False  # the head is its own packed layer now
    copy._horizonrl_fast_copy = kind
    _load(copy, plain_weights(model))
    return copy.eval()


def copy_into_fast_copy(policy: Any, model: Any) -> None:
    """Copy ``policy``'s weights into the fast ``model``, smoothed, quantized or packed as when it was made;
    ValueError naming the misfits when the two do not have the same weights."""
    _load(model, plain_weights(policy))


def _load(model: Any, weights: dict[str, Any]) -> None:
    packed = {n: m for n, m in model.named_modules() if isinstance(m, PackedLinear)}
    targets: dict[str, Any] = {f"{n}.weight": m for n, m in packed.items()}
    targets.update({f"{n}.bias": m for n, m in packed.items() if m.bias_value is not None})
    layers = tuple(f"{n}." for n in packed)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(layers)}
    targets.update(state)
    shapes = {k: v.shape for k, v in state.items()}
    shapes.update({f"{n}.weight": torch.Size((m.out_features, m.in_features)) for n, m in packed.items()})
    shapes.update(
        {f"{n}.bias": torch.Size((m.out_features,)) for n, m in packed.items() if m.bias_value is not None}
    )
    check_fits(shapes, weights, "fast sampling copy")
    norms: dict[str, torch.Tensor] = model._horizonrl_norm_scales
    with torch.no_grad():
        for key, target in targets.items():
            value = weights[key].make()
            if isinstance(target, PackedLinear):
                target.set_weight(value) if key.endswith(".weight") else target.set_bias(value)
            elif key in norms:
                target.copy_(value.float() / norms[key])
            else:
                write_weight(model, key, target, value)
