"""What this machine computes fast: the ``auto`` precision of models, samplers and autocast.

bfloat16 halves the memory traffic of a forward pass, but it pays only where the processor computes
it natively, and training needs more than decoding does (measured with ``benchmarks/cpu_dtype.py``,
a SmolLM2-135M decode step and a 512-token LoRA forward+backward, bfloat16 time / float32 time):

- AMX (Sapphire Rapids and later): decode 0.56, update 0.61: bfloat16 wins both;
- AVX512-BF16 without AMX (an Intel Xeon of 2 cores): decode 0.91, update 1.67: bfloat16 only
  dot-products natively, and the update's other kernels convert every operand;
- no native bfloat16 (oneDNN capped to AVX512_CORE on the AMX CPU): decode 1.53, update 3.19; AVX2
  only (an AMD EPYC Zen 3): 2.93 and 33.85.

So ``auto`` model weights and autocast (:func:`resolve_dtype`, :func:`bfloat16_trains_faster`) are
bfloat16 on a GPU that supports it or a CPU with AMX, float32 elsewhere; the int8 sampling copy
keeps its KV cache in bfloat16 wherever oneDNN multiplies bfloat16 (:func:`cpu_bfloat16_matmuls`).

The fast sampling copy (``engine.dtype: fast``, :func:`resolve_sampler_dtype`) is int8 where the CPU
has int8 dot-product instructions (:func:`cpu_int8_dot_products`), else float16 weights through
fbgemm's half-precision GEMM where PyTorch has it (:func:`cpu_float16_weight_matmuls`). Measured on
an AMD EPYC with AVX2 only, 16 rows, SmolLM2-135M's projections and head against float32: int8
(``torch._int_mm``) 14x slower, float16 weights 2.2x faster (79.1 against 35.4 ms a step's matmuls).

Models run on the device ``model.device`` names; ``auto`` is the CUDA GPU when PyTorch sees one,
else the CPU.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

# oneDNN instruction-set caps (ONEDNN_MAX_CPU_ISA) that still include native bfloat16
_BF16_ISAS = {
    "ALL",
    "DEFAULT",
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
}


def _onednn_allows(isas: set[str]) -> bool:
    """Whether oneDNN's instruction-set cap (``ONEDNN_MAX_CPU_ISA``; unset: no cap) is one of ``isas``."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return not cap or cap in isas


def _cpuinfo(key: str) -> str | None:
    """The value of the first ``key`` line of Linux's ``/proc/cpuinfo`` (None elsewhere or absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


def cpu_flags() -> set[str]:
    """The processor's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    return set((_cpuinfo("flags") or "").split())


def check_device_name(name: str) -> str:
    """``name`` when it names a device (``auto``, ``cpu``, ``cuda``, ``cuda:N``), else ValueError
    saying what is valid; whether this machine has it is :func:`resolve_device`'s question."""
    kind, colon, index = name.partition(":")
    if name in ("auto", "cpu", "cuda") or (kind == "cuda" and colon and index.isdigit()):
        return name
    raise ValueError(f"{name!r} is not a device; valid: auto, cpu, cuda, cuda:N")


def resolve_device(name: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` where PyTorch sees a CUDA GPU, else ``"cpu"``; ``"cpu"``, ``"cuda"``
    and ``"cuda:N"`` are checked against this machine and returned as they are.

    Raises :class:`~horizonrl.errors.ConfigError` (one line: what was asked, what this machine has)
    for a GPU that is not there."""
    import torch

    from horizonrl.errors import ConfigError

    try:
        check_device_name(name)
    except ValueError as exc:
        raise ConfigError(f"model.device: {exc}") from None
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    index = name.partition(":")[2]
    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU build)"
        raise ConfigError(
            f"model.device={name!r} but PyTorch sees no CUDA GPU here (torch {torch.__version__}, "
            f"CUDA {built}); valid here: auto, cpu"
        )
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigError(
            f"model.device={name!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
            f"valid: cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return name


@functools.cache
def native_bfloat16(device: str = "auto") -> bool:
    """Whether bfloat16 matmuls run natively on ``device`` (``auto``: where models run by
    default, see :func:`resolve_device`): a CUDA GPU that supports them, or a CPU with AVX512-BF16
    or AMX that oneDNN is allowed to use (``ONEDNN_MAX_CPU_ISA``)."""
    import torch

    if resolve_device(device).startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return _onednn_allows(_BF16_ISAS) and bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


# oneDNN instruction-set caps that leave it AVX-512 (bfloat16 matmuls converted there, if not native)
_AVX512_ISAS = _BF16_ISAS | {"AVX512_CORE", "AVX512_CORE_VNNI"}


@functools.cache
def cpu_bfloat16_matmuls() -> bool:
    """Whether this CPU multiplies bfloat16 through oneDNN at all: natively (AVX512-BF16, AMX) or
    by converting on AVX-512 (PyTorch's check, within the ``ONEDNN_MAX_CPU_ISA`` cap). Without it
    (AVX2 only) PyTorch's bfloat16 matmuls take a generic kernel. Measured on the int8 copy's
    attention, AVX-512 without bfloat16 (emulated with the cap), a bfloat16 KV cache against a
    float32 one: the same speed at the demo's ~420-token prompts (0.995x the time), 1.13x the time
    on ~42-token ones."""
    import torch

    if not _onednn_allows(_AVX512_ISAS):
        return False
    return native_bfloat16("cpu") or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# oneDNN instruction-set caps that still include AMX
_AMX_ISAS = {"ALL", "DEFAULT"} | {isa for isa in _BF16_ISAS if "AMX" in isa}


@functools.cache
def bfloat16_trains_faster(device: str = "auto") -> bool:
    """Whether training (a forward and backward pass) runs faster in bfloat16 than in float32 on
    ``device``: a CUDA GPU that supports bfloat16, or a CPU with AMX that oneDNN may use. A CPU
    with AVX512-BF16 alone decodes bfloat16 natively (:func:`native_bfloat16`) but updates 1.67x
    slower in it (see the module's figures)."""
    import torch

    if resolve_device(device).startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return _onednn_allows(_AMX_ISAS) and "amx_bf16" in cpu_flags()


# oneDNN instruction-set caps that still include int8 dot products (VNNI)
_VNNI_ISAS = _AVX512_ISAS - {"AVX512_CORE"} | {"AVX2_VNNI", "AVX2_VNNI_2"}


@functools.cache
def cpu_int8_dot_products() -> bool:
    """Whether this CPU multiplies int8 by int8 in hardware (AVX512-VNNI, AVX-VNNI or AMX, within the
    ``ONEDNN_MAX_CPU_ISA`` cap): where ``torch._int_mm`` is fast. Without them (AVX2 only) PyTorch's
    int8 matmul measured 14x slower than float32 at decode shapes."""
    return _onednn_allows(_VNNI_ISAS) and bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


@functools.cache
def cpu_float16_weight_matmuls() -> bool:
    """Whether PyTorch multiplies float32 inputs by packed float16 weights on this CPU (fbgemm's
    half-precision GEMM, ``torch.ops.quantized.linear_dynamic_fp16``: x86 with AVX2)."""
    import torch

    return "fbgemm" in torch.backends.quantized.supported_engines and "avx2" in cpu_flags()


def resolve_sampler_dtype(name: str, device: str = "auto") -> str:
    """``engine.dtype`` as the engine builds it: ``"fast"`` -> the fastest sampling copy measured for
    this device (a CPU: ``"int8"`` with int8 dot products, else ``"float16"`` where fbgemm runs;
    otherwise, and on a GPU, ``"auto"``: the model's dtype); any other name as it is."""
    if name != "fast":
        return name
    if resolve_device(device) == "cpu":
        if cpu_int8_dot_products():
            return "int8"
        if cpu_float16_weight_matmuls():
            return "float16"
    return "auto"


def resolve_dtype(name: str, device: str = "auto") -> str:
    """``"auto"`` -> ``"bfloat16"`` where ``device`` trains faster in it
    (:func:`bfloat16_trains_faster`), else ``"float32"``; any other name is returned as it is."""
    if name != "auto":
        return name
    return "bfloat16" if bfloat16_trains_faster(device) else "float32"
