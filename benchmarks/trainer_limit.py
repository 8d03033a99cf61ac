"""The machine's limit for the trainer and where a training step of the demo spends its time.

The demo's SFT stage (64 oracle demonstrations of the calc env, batches of 8, LoRA rank 16 on every
projection of SmolLM2-135M) and its RL updates run the same forward and backward: the decoder over
each trajectory (the prompt prefix every row shares once per batch), the output head only where the
agent wrote, gradients into the adapters only.

1. The machine: matmul throughput at a training micro-batch's shapes (~280 tokens x 576 against
   576 x 1536, and back), in the trainer's dtype (float32; bfloat16 under autocast where the CPU
   multiplies it natively).
2. The work: the floating-point operations of one SFT step, counted by ``torch.utils.flop_counter``
   over a real step (matmuls, and attention forward and backward, which the counter does not know on
   a CPU: counted here from its shapes, 4 x q x k x dim per head forward, twice that backward).
   The bound of a step is that count over the matmul throughput: what the step would take if every
   operation ran at the rate of the machine's best matmul.
3. The trainer: the same steps timed (``--steps`` batches of the SFT stage's own order, after one
   warm-up step), then one profiled under ``torch.profiler``: time split into the frozen base's
   projections, the LoRA adapters' thin matmuls, the output head, attention, elementwise operators,
   the optimizer, and what no operator accounts for (Python, autograd's bookkeeping).

Prints ``name=value`` lines and a table; ``limit_fraction`` is the bound over the measured step.

    python benchmarks/trainer_limit.py [--steps 3] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from decode_limit import best_of
from machine import machine_description
from torch.utils.flop_counter import FlopCounterMode

from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.factory import apply_memory_settings, engine_from_config
from horizonrl.envs.factory import env_factory
from horizonrl.hardware import native_bfloat16
from horizonrl.models import load_base
from horizonrl.train.logprobs import common_prompt_prefix
from horizonrl.train.sft import gather_demos, sft_steps, train_sft
from horizonrl.trainable import build_policy


def attention_flops(query: list[int], key: list[int], backward: bool) -> int:
    """Multiply-adds x 2 of one attention call: scores and weighted values forward (2 matmuls of
    q x k x dim per head); backward 4 (the gradients of the values, the weights, queries and keys)."""
    rows, heads, q_len, dim = query
    return (8 if backward else 4) * rows * heads * q_len * key[2] * dim


def _shape_flops(backward: bool):
    def count(query, key, *args, out_shape=None, **kwargs) -> int:
        if backward:  # (grad_out, query, key, ...)
            query, key = key, args[0]
        return attention_flops(list(query), list(key), backward)

    return count


def step_flops(run_step) -> tuple[int, dict[str, int]]:
    """(total, per operator) floating-point operations of ``run_step()``."""
    ops = torch.ops.aten
    mapping = {}
    for name, backward in (
        ("_scaled_dot_product_flash_attention_for_cpu", False),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", True),
    ):
        if hasattr(ops, name):
            mapping[getattr(ops, name)] = _shape_flops(backward)
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        run_step()
    per: dict[str, int] = defaultdict(int)
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        name = str(op).removeprefix("aten.").split(".")[0]
        if "attention" in name:
            name = "attention_backward" if name.endswith("backward") else "attention_forward"
        per[name] += int(n)
    return counter.get_total_flops(), dict(per)


def matmul_gflops(tokens: int, dtype: torch.dtype) -> float:
    """The best of a training micro-batch's projection shapes: forward ``tokens x 576 @ 576 x 1536``
    and the input's gradient ``tokens x 1536 @ 1536 x 576``, in ``dtype``."""
    rates = []
    for k, n in ((576, 1536), (1536, 576)):
        x, w = torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        rates.append(2 * tokens * k * n / best_of(lambda x=x, w=w: x @ w) / 1e9)
    return max(rates)


def categorize(name: str, shapes: list, rank: int) -> str:
    """The table's category of one profiled ``aten::`` operator outside the optimizer's step."""
    dims = [d for s in shapes if isinstance(s, list) for d in s]
    base = name.removeprefix("aten::")
    if base in ("mm", "addmm", "bmm", "matmul", "linear"):
        if 49152 in dims:
            return "output head (at the agent's tokens only)"
        if rank in dims:
            return f"LoRA adapters (rank {rank} matmuls)"
        return "frozen projections (q, k, v, o, gate, up, down)"
    if "attention" in base:
        return "attention (forward and backward)"
    if "softmax" in base:
        return "log-softmax of the head"
    if base.startswith(("copy_", "cat", "index", "clone", "fill_", "zero_", "zeros", "empty", "contiguous")):
        return "copies, fills and indexing"
    return "elementwise (norms, rotary, SiLU, residuals, scaling)"


def _in_optimizer(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer."):
            return True
        parent = parent.cpu_parent
    return False


def profile_step(run_step, wall: float, rank: int) -> dict[str, float]:
    """Seconds per category of one ``run_step()``, scaled to ``wall`` (the unprofiled step); what no
    operator accounts for is the rest of it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        run_step()
        profiled_wall = time.perf_counter() - start
    per: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if not event.name.startswith("aten::") or event.self_cpu_time_total <= 0:
            continue
        category = "optimizer (AdamW)" if _in_optimizer(event) else None
        category = category or categorize(event.name, list(event.input_shapes or []), rank)
        per[category] += event.self_cpu_time_total / 1e6
    # the profiler's own cost is spread over the categories by the measured (unprofiled) wall
    per = {k: v * wall / profiled_wall for k, v in per.items()}
    per["Python, autograd and dispatch"] = max(wall - sum(per.values()), 0.0)
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/calc.yaml")
    parser.add_argument("--steps", type=int, default=3, help="SFT steps timed (after one warm-up step)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides")
    args = parser.parse_args()
    print(f"machine={machine_description()}")
    print(f"torch_threads={torch.get_num_threads()}")

    config = load_config(args.config, args.overrides)
    apply_memory_settings(config.engine)
    loaded = load_base(config.model)
    base, tok = loaded.base, loaded.tokenizer
    engine = engine_from_config(base, tok, config.engine, config.model, 0)
    agent = Agent(tok, engine, config.sampling, config.agent, engine.max_context)
    demos = gather_demos(config, agent, env_factory(config.env))
    del agent, engine
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    sft = config.sft
    autocast_dtype = config.train.autocast_dtype
    model = build_policy(base, config.model, init_seed=1).model
    rank = (
        int(getattr(next(iter(model.peft_config.values())), "r", 0)) if hasattr(model, "peft_config") else 0
    )
    trainer_dtype = autocast_dtype or next(base.parameters()).dtype
    batches = [demos[i : i + sft.batch_size] for i in range(0, len(demos), sft.batch_size)]
    if len(batches) < args.steps + 3:  # warm-up, timed, counted, profiled
        parser.error(
            f"--steps {args.steps}: the SFT stage has {len(batches)} batches, so at most {len(batches) - 3}"
        )

    def step(batch) -> None:
        train_sft(model, batch, sft.model_copy(update={"epochs": 1}), pad, autocast_dtype=autocast_dtype)

    lengths = [len(d.prompt_ids) + len(d.response_ids) for d in demos]
    shared_prefix = common_prompt_prefix(demos)
    print(f"demonstrations={len(demos)}")
    print(f"tokens_per_demo_mean={sum(lengths) / len(lengths):.0f}")
    print(f"agent_tokens_per_demo_mean={sum(sum(d.loss_mask) for d in demos) / len(demos):.0f}")
    print(f"shared_prompt_prefix_tokens={shared_prefix}")
    print(f"batch_size={sft.batch_size}")
    print(f"lora_rank={rank}")
    print(f"trainer_dtype={str(trainer_dtype).removeprefix('torch.')}")
    start = time.perf_counter()
    step(batches[0])  # warm-up
    print(f"first_step_s={time.perf_counter() - start:.2f}")
    walls = []
    for batch in batches[1 : 1 + args.steps]:
        start = time.perf_counter()
        step(batch)
        walls.append(time.perf_counter() - start)
    wall = sum(walls) / len(walls)
    flops, per_op = step_flops(lambda: step(batches[1 + args.steps]))
    row_tokens = sum(lengths) // len(lengths) - shared_prefix  # a micro-batch: one row past the prefix
    rate = matmul_gflops(row_tokens, trainer_dtype)
    if trainer_dtype == torch.float32 and native_bfloat16():
        print("note=the trainer runs in float32 here (train.autocast resolved to none)")
    bound = flops / (rate * 1e9)
    print(f"matmul_gflops_{str(trainer_dtype).removeprefix('torch.')}={rate:.0f}")
    print(f"step_tflop={flops / 1e12:.3f}")
    for op, n in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"step_tflop_{op}={n / 1e12:.3f}")
    print(f"step_s={wall:.2f}")
    print(f"step_s_each={[round(w, 2) for w in walls]}")
    print(f"bound_step_s={bound:.2f}")
    print(f"achieved_gflops={flops / wall / 1e9:.0f}")
    print(f"limit_fraction={bound / wall:.2f}")
    steps_in_stage = sft_steps(len(demos), sft)
    print(f"sft_stage_s_projected={wall * steps_in_stage:.0f}")
    print(f"sft_stage_s_at_the_limit={bound * steps_in_stage:.0f}")

    per = profile_step(lambda: step(batches[2 + args.steps]), wall, rank)
    print()
    print("| where a step's time goes | s (share) |")
    print("|---|---|")
    for name, seconds in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {seconds:.2f} ({seconds / wall:.0%}) |")
    print(f"| one SFT step of {sft.batch_size} demonstrations | {wall:.2f} |")


if __name__ == "__main__":
    main()
