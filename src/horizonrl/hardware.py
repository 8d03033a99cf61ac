"""What this machine computes fast: the ``auto`` precision of models, samplers and autocast.

bfloat16 halves the memory traffic of a forward pass, which is what bounds decoding and the LoRA
update on a CPU, but only where the processor computes it natively: a GPU with bfloat16 support,
or a CPU with AVX512-BF16 or AMX. Elsewhere oneDNN converts every bfloat16 operand and float32 is
faster (measured with ``benchmarks/cpu_dtype.py``, oneDNN capped to AVX512_CORE on an AMX CPU:
a SmolLM2-135M decode step 205 ms in bfloat16 against 134 ms in float32, a 512-token LoRA
forward+backward 4.9 s against 1.5 s; natively 72 ms and 0.93 s in bfloat16).

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
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in _BF16_ISAS:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def resolve_dtype(name: str, device: str = "auto") -> str:
    """``"auto"`` -> ``"bfloat16"`` where ``device`` computes it natively, else ``"float32"``;
    any other name is returned as it is."""
    if name != "auto":
        return name
    return "bfloat16" if native_bfloat16(device) else "float32"
