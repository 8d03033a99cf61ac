"""The 'auto' precision: bfloat16 weights and autocast only where this machine trains faster in it
(a GPU, an AMX CPU), a bfloat16 KV cache wherever bfloat16 matmuls are native."""

from __future__ import annotations

import pytest
import torch

from horizonrl import hardware
from horizonrl.config import TrainConfig


@pytest.fixture(autouse=True)
def fresh_cache():
    caches = (
        hardware.native_bfloat16,
        hardware.bfloat16_trains_faster,
        hardware.cpu_bfloat16_matmuls,
        hardware.cpu_int8_dot_products,
        hardware.cpu_float16_weight_matmuls,
    )
    for cached in caches:
        cached.cache_clear()
    yield
    for cached in caches:
        cached.cache_clear()


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


def test_a_cpu_with_amx_gets_bfloat16_weights_and_autocast(cpu):
    cpu({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    assert hardware.native_bfloat16() and hardware.bfloat16_trains_faster()
    assert hardware.resolve_dtype("auto") == "bfloat16"
    assert TrainConfig(autocast="auto").autocast_dtype == torch.bfloat16


def test_avx512_bf16_without_amx_trains_in_float32_and_keeps_caches_in_bfloat16(cpu):
    # measured there (benchmarks/cpu_dtype.py): a bfloat16 update takes 1.67x the float32 one
    cpu({"avx2", "avx512f", "avx512_bf16"})
    assert hardware.native_bfloat16() and not hardware.bfloat16_trains_faster()
    assert hardware.resolve_dtype("auto") == "float32"
    assert TrainConfig(autocast="auto").autocast_dtype is None


def test_a_cpu_without_native_bfloat16_gets_float32(cpu):
    cpu({"avx2", "avx512f"})
    assert not hardware.native_bfloat16() and hardware.resolve_dtype("auto") == "float32"
    assert TrainConfig(autocast="auto").autocast_dtype is None


def test_a_onednn_cap_below_bfloat16_counts_as_no_native_bfloat16(cpu):
    cpu({"avx512_bf16", "amx_bf16"}, isa="AVX512_CORE")
    assert not hardware.native_bfloat16() and hardware.resolve_dtype("auto") == "float32"
    hardware.native_bfloat16.cache_clear()
    hardware.bfloat16_trains_faster.cache_clear()
    cpu({"avx512_bf16", "amx_bf16"}, isa="AVX512_CORE_BF16")  # AVX512-BF16 kept, AMX capped off
    assert hardware.native_bfloat16() and hardware.resolve_dtype("auto") == "float32"
    hardware.native_bfloat16.cache_clear()
    hardware.bfloat16_trains_faster.cache_clear()
    cpu({"avx512_bf16", "amx_bf16"}, isa="avx512_core_amx")
    assert hardware.resolve_dtype("auto") == "bfloat16"


def test_bfloat16_caches_need_onednn_bfloat16_matmuls_native_or_converted_on_avx512(cpu, monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    cpu({"avx2", "avx512f"})  # AVX-512 without bfloat16: oneDNN converts
    assert not hardware.native_bfloat16("cpu") and hardware.cpu_bfloat16_matmuls()
    hardware.cpu_bfloat16_matmuls.cache_clear()
    cpu({"avx2", "avx512f"}, isa="AVX2")  # capped below AVX-512
    assert not hardware.cpu_bfloat16_matmuls()
    hardware.cpu_bfloat16_matmuls.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    cpu({"avx2"})  # AVX2 only: PyTorch's generic kernel, the cache stays float32
    assert not hardware.cpu_bfloat16_matmuls()


def test_explicit_choices_are_kept(cpu):
    cpu(set())
    assert hardware.resolve_dtype("bfloat16") == "bfloat16" and hardware.resolve_dtype("float32") == "float32"
    assert TrainConfig(autocast="bfloat16").autocast_dtype == torch.bfloat16
    assert TrainConfig(autocast="none").autocast_dtype is None


# ---------------------------------------------------------------------------------------------------
# model.device: where the policy runs


def test_auto_device_is_the_gpu_when_pytorch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hardware.resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.resolve_device("auto") == "cpu" and hardware.resolve_device("cpu") == "cpu"


def test_a_gpu_that_is_not_there_is_one_error_naming_what_is_valid(monkeypatch):
    from horizonrl.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ConfigError, match=r"model.device='cuda' but PyTorch sees no CUDA GPU.*valid here: auto, cpu"
    ):
        hardware.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hardware.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError, match=r"has 2 CUDA GPU\(s\); valid: cuda:0 to cuda:1"):
        hardware.resolve_device("cuda:2")


def test_a_device_that_is_no_device_is_refused_when_the_config_loads():
    from pydantic import ValidationError

    from horizonrl.model_config import ModelConfig

    assert ModelConfig(device="cuda:0").device == "cuda:0"
    for bad in ("tpu", "cuda:x", "gpu", ""):
        with pytest.raises(ValidationError, match="valid: auto, cpu, cuda, cuda:N"):
            ModelConfig(device=bad)


def test_bfloat16_auto_follows_the_device_the_model_runs_on(cpu, monkeypatch):
    cpu({"avx2"})  # a CPU without native bfloat16 ...
    assert hardware.resolve_dtype("auto", "cpu") == "float32"
    hardware.bfloat16_trains_faster.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # ... beside a bfloat16 GPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert hardware.resolve_dtype("auto", "cpu") == "float32"
    assert (
        hardware.resolve_dtype("auto", "cuda") == "bfloat16" and hardware.resolve_dtype("auto") == "bfloat16"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a CUDA GPU")
def test_the_cli_refuses_a_gpu_this_machine_lacks_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from horizonrl.cli import app

    out = tmp_path / "eval.jsonl"
    result = CliRunner().invoke(app, ["eval", "configs/calc.yaml", "model.device=cuda", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "model.device='cuda' but PyTorch sees no CUDA GPU" in result.output
    assert not out.exists()


def test_the_fast_sampler_is_int8_with_vnni_and_float16_weights_on_avx2(cpu):
    cpu({"avx2", "avx512f", "avx512_vnni"})
    assert hardware.cpu_int8_dot_products() and hardware.resolve_sampler_dtype("fast") == "int8"
    hardware.cpu_int8_dot_products.cache_clear()
    cpu({"avx2", "avx_vnni"})  # client CPUs' 256-bit VNNI
    assert hardware.resolve_sampler_dtype("fast") == "int8"
    hardware.cpu_int8_dot_products.cache_clear()
    # AVX2 only (an AMD EPYC Zen 3): torch._int_mm measured 14x slower than float32 there
    cpu({"avx2", "fma"})
    assert not hardware.cpu_int8_dot_products()
    expected = "float16" if "fbgemm" in torch.backends.quantized.supported_engines else "auto"
    assert hardware.resolve_sampler_dtype("fast") == expected
    assert hardware.resolve_sampler_dtype("int8") == "int8"  # asked for by name: refused where it is built
    assert hardware.resolve_sampler_dtype("bfloat16") == "bfloat16"
    hardware.cpu_int8_dot_products.cache_clear()
    cpu({"avx2", "avx512_vnni"}, isa="AVX512_CORE")  # oneDNN capped below VNNI
    assert not hardware.cpu_int8_dot_products()
