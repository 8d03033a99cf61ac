"""The 'auto' precision: bfloat16 only where this machine computes it natively."""

from __future__ import annotations

import pytest
import torch

from horizonrl import hardware
from horizonrl.config import TrainConfig


@pytest.fixture(autouse=True)
def fresh_cache():
    hardware.native_bfloat16.cache_clear()
    yield
    hardware.native_bfloat16.cache_clear()


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU machine with the given flags (no CUDA)."""

    def make(flags: set[str], isa: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
        if isa is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)

    return make


def test_a_cpu_with_amx_or_avx512_bf16_gets_bfloat16(cpu):
    cpu({"avx2", "avx512f", "amx_bf16"})
    assert hardware.native_bfloat16() and hardware.resolve_dtype("auto") == "bfloat16"
    assert TrainConfig(autocast="auto").autocast_dtype == torch.bfloat16


def test_a_cpu_without_native_bfloat16_gets_float32(cpu):
    cpu({"avx2", "avx512f"})
    assert not hardware.native_bfloat16() and hardware.resolve_dtype("auto") == "float32"
    assert TrainConfig(autocast="auto").autocast_dtype is None


def test_a_onednn_cap_below_bfloat16_counts_as_no_native_bfloat16(cpu):
    cpu({"avx512_bf16", "amx_bf16"}, isa="AVX512_CORE")
    assert hardware.resolve_dtype("auto") == "float32"
    hardware.native_bfloat16.cache_clear()
    cpu({"avx512_bf16", "amx_bf16"}, isa="avx512_core_amx")
    assert hardware.resolve_dtype("auto") == "bfloat16"


def test_explicit_choices_are_kept(cpu):
    cpu(set())
    assert hardware.resolve_dtype("bfloat16") == "bfloat16" and hardware.resolve_dtype("float32") == "float32"
    assert TrainConfig(autocast="bfloat16").autocast_dtype == torch.bfloat16
    assert TrainConfig(autocast="none").autocast_dtype is None
