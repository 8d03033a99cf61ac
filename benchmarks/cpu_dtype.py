"""What the demo's two hot loops cost on this CPU in bfloat16 and in float32, side by side.

``model.dtype: auto`` keeps SmolLM2-135M's frozen weights in bfloat16 where that trains faster.
Whether it does depends on the processor: with AMX oneDNN runs bfloat16 matmuls natively in
every kernel; with AVX512-BF16 alone it dot-products natively; without either it converts. This
script times, in one process:

- ``decode``: one 32-row decode step of the sampler (KV cache of 256 tokens), as the engine runs it;
- ``update``: one LoRA forward+backward over 512 tokens, as the RL update runs a micro-batch;

for bfloat16 and float32 weights, and prints the processor's bfloat16 flags. To see a machine
without native bfloat16 on one with it, cap oneDNN's instruction set for a run:
``ONEDNN_MAX_CPU_ISA=AVX512_CORE python benchmarks/cpu_dtype.py``.

Prints ``name=value`` lines; last ``bf16_vs_fp32_update`` (bfloat16 time / float32 time).

    python benchmarks/cpu_dtype.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

from horizonrl.hardware import bfloat16_trains_faster, cpu_flags, native_bfloat16
from horizonrl.model_config import LoraSettings, ModelConfig
from horizonrl.models import load_model
from horizonrl.trainable import wrap_lora


def bf16_flags() -> str:
    return ",".join(f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f in cpu_flags()) or "none"


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def time_decode(model, rows: int, past: int) -> float:
    ids = torch.randint(0, 1000, (rows, past))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        step = torch.randint(0, 1000, (rows, 1))

        def one() -> None:
            model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)

        return best_of(one, 5)


def time_update(model, tokens: int, autocast: bool) -> float:
    """bfloat16: the demo's (bfloat16 base, bfloat16 autocast); float32: no bfloat16 anywhere."""
    lora = wrap_lora(model, LoraSettings())
    ids = torch.randint(0, 1000, (tokens // 256, 256))

    def one() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = lora(input_ids=ids, labels=ids).loss
        loss.backward()
        lora.zero_grad(set_to_none=True)

    return best_of(one, 2)


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers renames past_key_values
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny random model")
    args = parser.parse_args()
    path = "tiny-random" if args.quick else "smollm2-135m"
    print(f"cpu_bf16_flags={bf16_flags()}")
    print(f"native_bfloat16={native_bfloat16()} (a KV cache in bfloat16)")
    follows = "what model.dtype=auto and train.autocast=auto follow"
    print(f"bfloat16_trains_faster={bfloat16_trains_faster()} ({follows})")
    print(f"onednn_max_cpu_isa={os.environ.get('ONEDNN_MAX_CPU_ISA', 'default')}")
    print(f"torch_threads={torch.get_num_threads()}")
    results = {}
    for dtype in ("bfloat16", "float32"):
        model, _ = load_model(ModelConfig(path=path, dtype=dtype))
        results[dtype] = (time_decode(model, 32, 256), time_update(model, 512, dtype == "bfloat16"))
        print(f"decode_step_ms_{dtype}={results[dtype][0] * 1000:.1f}")
        print(f"update_512_tokens_s_{dtype}={results[dtype][1]:.2f}")
    print(f"bf16_vs_fp32_decode={results['bfloat16'][0] / results['float32'][0]:.2f}")
    print(f"bf16_vs_fp32_update={results['bfloat16'][1] / results['float32'][1]:.2f}")


if __name__ == "__main__":
    main()
