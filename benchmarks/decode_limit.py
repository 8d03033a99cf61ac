"""The machine's limit for decoding and where the engine's decode step spends its time.

1. The machine: memory read bandwidth (summing a 1 GiB float32 tensor) and matmul throughput at a
   decode step's shapes (``rows`` x 576 against 576 x 1536, and the 49,152-row output head) in
   float32, bfloat16, int8 (``torch._int_mm``) and float16 weights (fbgemm, where PyTorch has it).
2. The bound: one decode step of SmolLM2-135M for ``rows`` sequences must read every weight once and
   do ~2 x 135M multiply-adds per row; the best step time is the larger of bytes / bandwidth and
   FLOPs / matmul throughput (attention over the cache adds reads of the KV cache: counted too).
3. The engine: the demo's workload (``--rows`` chat prompts of ~``--prompt-tokens`` tokens, greedy,
   ``--new-tokens`` new tokens) decoded by HFEngine in bfloat16 (float32 without native bfloat16) and
   with the fast copy (``engine.dtype: fast``: int8, or float16 weights on a CPU without int8 dot
   products, whose head the profile counts with the projections: fbgemm's packed weight hides its shape),
   under ``torch.profiler``: time per decode step split into the projections, the output head,
   attention, sampling (softmax, log-softmax, argmax/multinomial), elementwise (norms, activations,
   residuals, rotary), KV-cache copies, and what no operator accounts for (Python dispatch, the
   decoder's bookkeeping).

Prints ``name=value`` lines and a table; ``limit_fraction_<dtype>`` is the bound over the measured
step time.

    python benchmarks/decode_limit.py [--rows 16] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import torch
from machine import machine_description

from horizonrl.engine.base import SamplingParams
from horizonrl.engine.config import EngineConfig
from horizonrl.engine.factory import engine_from_config
from horizonrl.hardware import cpu_float16_weight_matmuls, native_bfloat16, resolve_sampler_dtype
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_base


def best_of(fn, repeats: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth_gbs() -> float:
    big = torch.ones(256 * 1024 * 1024)  # 1 GiB of float32
    return big.numel() * 4 / best_of(lambda: big.sum(), 5) / 1e9


def matmul_gops(rows: int, n: int, k: int) -> dict[str, float]:
    x, w = torch.randn(rows, k), torch.randn(n, k)
    xb, wb = x.bfloat16(), w.bfloat16()
    xi = torch.randint(-127, 127, (rows, k), dtype=torch.int8)
    wi = torch.randint(-127, 127, (n, k), dtype=torch.int8).t()
    ops = 2 * rows * n * k / 1e9
    gops = {
        "float32": ops / best_of(lambda: x @ w.T),
        "bfloat16": ops / best_of(lambda: xb @ wb.T),
        "int8": ops / best_of(lambda: torch._int_mm(xi, wi)),
    }
    if cpu_float16_weight_matmuls():
        packed = torch.ops.quantized.linear_prepack_fp16(w, None)
        gops["float16"] = ops / best_of(lambda: torch.ops.quantized.linear_dynamic_fp16(x, packed))
    return gops


CATEGORIES = [  # (category, substrings of the op's name); the head is told apart by its shape
    ("attention", ("attention", "sdpa", "bmm", "baddbmm", "softmax_backward")),
    (
        "sampling",
        ("log_softmax", "softmax", "argmax", "multinomial", "topk", "sort", "exponential", "cumsum"),
    ),
    ("kv-cache copies", ("cat", "copy_", "index_select", "narrow_copy", "clone", "contiguous", "pad")),
    ("projections", ("linear", "addmm", "mm", "matmul", "_int_mm")),
    (
        "elementwise",
        (
            "mul",
            "add",
            "pow",
            "mean",
            "rsqrt",
            "silu",
            "neg",
            "div",
            "sub",
            "round",
            "to",
            "abs",
            "amax",
            "clamp",
        ),
    ),
]


def categorize(name: str, shapes: list) -> str:
    if name in ("aten::mm", "aten::addmm", "aten::linear", "aten::_int_mm", "aten::matmul") and any(
        49152 in s for s in shapes if isinstance(s, list)
    ):
        return "output head"
    base = name.removeprefix("aten::").removeprefix("quantized::")
    for category, keys in CATEGORIES:
        if any(base == k or base.startswith(k + "_") or k in base for k in keys):
            return category
    return "other operators"


def profile_engine(engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, dict[str, float], int]:
    """(wall seconds, seconds per category, decode steps) of decoding ``prompts`` greedily."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)

    async def run() -> list:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    asyncio.run(run())  # warm-up
    # every run prefills from scratch: the KV caches a run keeps would spare the next one its prefill,
    # and the decode steps are the full run less a prefill-only run
    engine.drop_caches()
    from torch.profiler import ProfilerActivity, profile

    steps_before = engine.stats.get("decode_steps", 0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        out = asyncio.run(run())
        wall = time.perf_counter() - start
    steps = int(engine.stats.get("decode_steps", 0) - steps_before) or max(len(c.token_ids) for c in out)
    per: dict[str, float] = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key.startswith(("aten::", "quantized::")) and event.self_cpu_time_total > 0:
            per[categorize(event.key, list(event.input_shapes or []))] += event.self_cpu_time_total / 1e6
    per["Python, dispatch and bookkeeping"] = max(wall - sum(per.values()), 0.0)
    return wall, dict(per), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="sequences decoded together (the demo: 16-32)")
    parser.add_argument("--prompt-tokens", type=int, default=400, help="tokens per prompt (calc: ~400)")
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    print(f"machine={machine_description()}")
    print(f"torch_threads={torch.get_num_threads()}")
    bw = bandwidth_gbs()
    print(f"memory_read_gbs={bw:.1f}")
    mlp = matmul_gops(args.rows, 1536, 576)
    head = matmul_gops(args.rows, 49152, 576)
    for dtype in mlp:
        print(f"matmul_gops_{dtype}_mlp={mlp[dtype]:.0f}")
        print(f"matmul_gops_{dtype}_head={head[dtype]:.0f}")

    config = ModelConfig(path="smollm2-135m")
    loaded = load_base(config)
    model, tok = loaded.base.eval(), loaded.tokenizer
    # the embedding is tied to the head: every weight is read and multiplied once per step
    params = sum(p.numel() for p in model.parameters())
    head_params = model.get_output_embeddings().weight.numel()
    cfg = model.config
    layers, kv_dim = (
        cfg.num_hidden_layers,
        cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads),
    )
    flops = 2 * args.rows * params
    filler = "The calculator adds, subtracts, multiplies and divides numbers given to it. "
    prompt = tok.encode(filler * (args.prompt_tokens // len(tok.encode(filler)) + 1))[: args.prompt_tokens]
    prompts = [prompt[: args.prompt_tokens - (7 * i) % (args.prompt_tokens // 2)] for i in range(args.rows)]
    context = args.prompt_tokens + args.new_tokens // 2
    exact = "bfloat16" if native_bfloat16() else "float32"  # the fastest exact decoder
    print(f"model_params={params}")
    print(f"rows={args.rows}")
    print(f"context_tokens_mean={context}")
    rows_out = []
    fast = resolve_sampler_dtype("fast")
    print(f"fast_dtype={fast}")
    for dtype in (exact, fast):
        wbytes = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[dtype] * params
        engine = engine_from_config(
            model, tok, EngineConfig(max_batch_size=args.rows, dtype=dtype), config, 0
        )
        # the KV cache as the engine keeps it (the fast copy's: bfloat16 where oneDNN multiplies it)
        kept = engine.decoder.kv_dtype or (torch.bfloat16 if dtype == "bfloat16" else torch.float32)
        kv_bytes = 2 * layers * kv_dim * context * args.rows * (torch.finfo(kept).bits // 8)
        gops = (mlp[dtype] * (params - head_params) + head[dtype] * head_params) / params
        bound = max((wbytes + kv_bytes) / (bw * 1e9), flops / (gops * 1e9))
        prefill_wall, prefill, _ = profile_engine(engine, prompts, 1)
        full_wall, full, steps = profile_engine(engine, prompts, args.new_tokens)
        # the decode steps alone: the whole run less a run that only prefills
        wall = full_wall - prefill_wall
        per = {k: max(full.get(k, 0.0) - prefill.get(k, 0.0), 0.0) for k in full}
        step = wall / max(steps - 1, 1)
        print(f"prefill_s_{dtype}={prefill_wall:.2f}")
        print(f"bound_step_ms_{dtype}={bound * 1e3:.1f}")
        print(f"engine_step_ms_{dtype}={step * 1e3:.1f}")
        print(f"engine_tokens_per_s_{dtype}={args.rows * steps / wall:.1f}")
        print(f"limit_fraction_{dtype}={bound / step:.2f}")
        rows_out.append((dtype, wall, per))
        del engine
    names = sorted({k for _, _, per in rows_out for k in per}, key=lambda k: -rows_out[0][2].get(k, 0.0))
    print()
    print("| where the time goes | " + " | ".join(f"{d}: s (share)" for d, _, _ in rows_out) + " |")
    print("|---|" + "---|" * len(rows_out))
    for name in names:
        cells = [f"{per.get(name, 0.0):.2f} ({per.get(name, 0.0) / wall:.0%})" for _, wall, per in rows_out]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "| decode steps in all (prefill excluded) | "
        + " | ".join(f"{wall:.2f}" for _, wall, _ in rows_out)
        + " |"
    )


if __name__ == "__main__":
    main()
