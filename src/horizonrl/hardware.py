"""What this machine computes fast: the ``auto`` precision of models, samplers and autocast.

bfloat16 halves the memory traffic of a forward pass, which is what bounds decoding and the LoRA
update on a CPU, but only where the processor computes it natively: a GPU with bfloat16 support,
or a CPU with AVX512-BF16 or AMX. Elsewhere oneDNN converts every bfloat16 operand and float32 is
faster (measured with ``benchmarks/cpu_dtype.py``, oneDNN capped to AVX512_CORE on an AMX CPU:
a SmolLM2-135M decode step 205 ms in bfloat16 against 134 ms in float32, a 512-token LoRA
forward+backward 4.9 s against 1.5 s; natively 72 ms and 0.93 s in bfloat16).
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


def cpu_flags() -> set[str]:
    """The processor's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@functools.cache
def native_bfloat16() -> bool:
    """Whether bfloat16 matmuls run natively here: a CUDA GPU that supports them, or a CPU with
    AVX512-BF16 or AMX that oneDNN is allowed to use (``ONEDNN_MAX_CPU_ISA``)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in _BF16_ISAS:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def resolve_dtype(name: str) -> str:
    """``"auto"`` -> ``"bfloat16"`` where this machine computes it natively, else ``"float32"``;
    any other name is returned as it is."""
    if name != "auto":
        return name
    return "bfloat16" if native_bfloat16() else "float32"
