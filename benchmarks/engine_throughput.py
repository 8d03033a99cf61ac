"""Throughput of HFEngine versus a plain static-batch ``model.generate`` on the same requests, and
of the engine's fast path (``engine.dtype: fast``: the int8 sampling copy on a CPU with int8 dot
products, float16 weights on one with AVX2 only; printed as ``fast_dtype``; decoding with the
written-out step of ``horizonrl.engine.decode_step``) versus the fastest exact engine (bfloat16
where the CPU multiplies it natively, else float32: the engine's default before the fast path)
decoding through the model's ``forward`` as it did before the written-out step, and with that step.

All decode the same prompts greedily with the same ``max_new_tokens``: short chat questions (~42
tokens), or with ``--prompts calc`` the demo's own first turns (a calc task under the system prompt
with the tool schemas, ~420 tokens; ``configs/calc.yaml``'s 64 new tokens). An engine receives
all requests concurrently (``asyncio.gather``) and batches them itself; ``generate`` gets the same
prompts as left-padded static batches of the same size. Useful tokens are counted up to and
including EOS for each. Prints ``name=value`` lines: ``speedup`` (engine / generate),
``step_speedup`` (the exact dtype: written-out step / ``forward``), ``fast_speedup`` (the fast copy
with the step / the exact dtype through ``forward``), ``fast_speedup_same_step`` (the fast copy /
the exact dtype, both with the step) and ``fast_cache_speedup`` (the fast copy with its KV cache as
the engine keeps it, bfloat16 where oneDNN multiplies bfloat16 / the same with a float32 cache; 1.0
without a run where the engine keeps it in float32 anyway) last.

    python benchmarks/engine_throughput.py [--quick] [--model smollm2-135m] [--prompts calc]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from horizonrl.engine.base import SamplingParams
from horizonrl.engine.config import EngineConfig
from horizonrl.engine.factory import engine_from_config
from horizonrl.engine.hf import HFEngine
from horizonrl.hardware import native_bfloat16, resolve_sampler_dtype
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_base

QUESTIONS = [
    "What is 2 + 2? Answer with just the number.",
    "Write a short poem about the sea.",
    "Name the capital of Japan.",
    "Explain how a refrigerator works in a few sentences.",
    "List five fruits that are red.",
    "What is the boiling point of water in Celsius?",
    "Describe your ideal weekend in detail.",
    "Translate 'good morning' into French.",
    "Give three tips for writing clean Python code, with a short explanation for each.",
    "Is the sun a star? Answer yes or no.",
    "Tell me a story about a robot who learns to paint.",
    "What does CPU stand for?",
    "Summarize the plot of Romeo and Juliet.",
    "How many legs does a spider have?",
    "Why is the sky blue? Explain it to a child.",
    "Write a haiku about autumn leaves.",
]


def build_prompts(tokenizer, n: int) -> list[list[int]]:
    """Chat-formatted prompts of varied length (some with a system message)."""
    prompts = []
    for i in range(n):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        if i % 3 == 0:
            messages.insert(
                0, {"role": "system", "content": "You are a concise, helpful assistant. " * (1 + i % 4)}
            )
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text))
    return prompts


def calc_prompts(tokenizer, engine: HFEngine, n: int) -> list[list[int]]:
    """The demo's first-turn prompts: ``n`` calc training tasks as the agent renders them."""
    from horizonrl.agent.job import RolloutJob
    from horizonrl.agent.loop import Agent, Episode
    from horizonrl.config import load_config
    from horizonrl.envs.factory import env_factory, make_tasks

    cfg = load_config("configs/calc.yaml", [])
    agent = Agent(tokenizer, engine, cfg.sampling, cfg.agent, engine.max_context)
    make_env = env_factory(cfg.env)
    prompts = []
    for i, task in enumerate(make_tasks(cfg.env, "train", n, 0)):
        episode = Episode(RolloutJob(task, f"t{i}", f"g{i}", None, None))
        asyncio.run(agent.start(episode, make_env))
        prompts.append(episode.prompt_ids)
        asyncio.run(agent.close(episode))
    return prompts


def useful(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """Tokens up to and including the first EOS."""
    for k, tok in enumerate(tokens):
        if tok in eos_ids:
            return tokens[: k + 1]
    return tokens


def run_engine(engine: HFEngine, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)

    async def main() -> list[list[int]]:
        completions = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return [c.token_ids for c in completions]

    return asyncio.run(main())


def run_generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    pad_id: int,
    eos_ids: frozenset[int],
) -> list[list[int]]:
    outputs: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=sorted(eos_ids),
            )
        outputs.extend(useful(row[width:].tolist(), eos_ids) for row in out)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model path or alias")
    parser.add_argument("--quick", action="store_true", help="fewer new tokens (< 60 s)")
    parser.add_argument("--n", type=int, default=16, help="number of prompts")
    parser.add_argument(
        "--prompts",
        choices=["chat", "calc"],
        default="chat",
        help="short chat questions or the demo's calc turns",
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128, calc: 64 (quick: 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each; the best counts")
    parser.add_argument("--batch-size", type=int, default=None, help="default: all prompts, at most 32")
    args = parser.parse_args()
    max_new = args.max_new_tokens or (32 if args.quick else 64 if args.prompts == "calc" else 128)
    batch = args.batch_size or min(args.n, 32)

    config = ModelConfig(path=args.model)
    loaded = load_base(config)
    model, tokenizer = loaded.base.eval(), loaded.tokenizer
    # the fastest exact decoder (a float32 trainer's own dtype decodes 1.1x slower in bfloat16's place)
    exact = "bfloat16" if native_bfloat16() else "float32"
    engine = engine_from_config(model, tokenizer, EngineConfig(max_batch_size=batch, dtype=exact), config, 0)
    fast = engine_from_config(model, tokenizer, EngineConfig(max_batch_size=batch, dtype="fast"), config, 0)
    forward = engine_from_config(model, tokenizer, EngineConfig(max_batch_size=batch, dtype=exact), config, 0)
    forward.decoder.written_decode_step = False  # the engine before the written-out step
    # the fast copy with its KV cache in float32, where the engine keeps it in bfloat16
    fast_f32 = None
    if fast.decoder.kv_dtype is not None:
        fast_f32 = engine_from_config(
            model, tokenizer, EngineConfig(max_batch_size=batch, dtype="fast"), config, 0
        )
        fast_f32.decoder.kv_dtype = None
    model = engine.model  # generate() runs the engine's own weights: the same arithmetic
    eos_ids, pad_id = engine.eos_token_ids, engine.pad_token_id
    prompts = (
        calc_prompts(tokenizer, engine, args.n)
        if args.prompts == "calc"
        else build_prompts(tokenizer, args.n)
    )

    run_engine(engine, prompts, 8)  # warm-up
    run_engine(fast, prompts, 8)
    run_engine(forward, prompts, 8)
    if fast_f32 is not None:
        run_engine(fast_f32, prompts, 8)
    run_generate(model, prompts, 8, batch, pad_id, eos_ids)

    # Alternate them a few times and keep each one's best run: this machine's timings are noisy.
    engine_s = generate_s = fast_s = forward_s = fast_f32_s = float("inf")
    for _ in range(args.repeats):
        batches_before = engine.stats["batches"]
        start = time.perf_counter()
        engine_out = [useful(t, eos_ids) for t in run_engine(engine, prompts, max_new)]
        engine_s = min(engine_s, time.perf_counter() - start)
        engine_batches = engine.stats["batches"] - batches_before
        start = time.perf_counter()
        fast_out = [useful(t, eos_ids) for t in run_engine(fast, prompts, max_new)]
        fast_s = min(fast_s, time.perf_counter() - start)
        start = time.perf_counter()
        forward_out = [useful(t, eos_ids) for t in run_engine(forward, prompts, max_new)]
        forward_s = min(forward_s, time.perf_counter() - start)
        if fast_f32 is not None:
            start = time.perf_counter()
            fast_f32_out = [useful(t, eos_ids) for t in run_engine(fast_f32, prompts, max_new)]
            fast_f32_s = min(fast_f32_s, time.perf_counter() - start)
        start = time.perf_counter()
        gen_out = run_generate(model, prompts, max_new, batch, pad_id, eos_ids)
        generate_s = min(generate_s, time.perf_counter() - start)

    engine_tokens = sum(map(len, engine_out))
    generate_tokens = sum(map(len, gen_out))
    engine_tps = engine_tokens / engine_s
    generate_tps = generate_tokens / generate_s
    print(f"model={args.model}")
    print(f"prompts={args.n} ({args.prompts})")
    print(f"prompt_tokens_mean={sum(map(len, prompts)) / len(prompts):.1f}")
    print(f"max_new_tokens={max_new}")
    print(f"batch_size={batch}")
    print(f"torch_threads={torch.get_num_threads()}")
    print(f"repeats={args.repeats}")
    print(f"engine_batches={engine_batches}")
    print(f"identical_completions={sum(a == b for a, b in zip(engine_out, gen_out, strict=True))}/{args.n}")
    print(f"engine_tokens={engine_tokens}")
    print(f"generate_tokens={generate_tokens}")
    print(f"engine_s={engine_s:.3f}")
    print(f"generate_s={generate_s:.3f}")
    print(f"engine_tokens_per_s={engine_tps:.1f}")
    print(f"generate_tokens_per_s={generate_tps:.1f}")
    fast_tokens = sum(map(len, fast_out))
    fast_tps = fast_tokens / fast_s
    print(f"engine_dtype={exact}")
    print(f"fast_dtype={resolve_sampler_dtype('fast')}")
    print(f"fast_tokens={fast_tokens}")
    print(f"fast_s={fast_s:.3f}")
    print(f"fast_tokens_per_s={fast_tps:.1f}")
    same = sum(a == b for a, b in zip(fast_out, engine_out, strict=True))
    print(f"fast_identical_completions={same}/{args.n}")
    forward_tps = sum(map(len, forward_out)) / forward_s
    print(f"forward_tokens_per_s={forward_tps:.1f}")
    same_as_forward = sum(a == b for a, b in zip(forward_out, engine_out, strict=True))
    print(f"forward_identical_completions={same_as_forward}/{args.n}")
    fast_f32_tps = sum(map(len, fast_f32_out)) / fast_f32_s if fast_f32 is not None else fast_tps
    print(f"fast_kv_dtype={str(fast.decoder.kv_dtype or torch.float32).removeprefix('torch.')}")
    print(f"fast_float32_cache_tokens_per_s={fast_f32_tps:.1f}")
    print(f"speedup={engine_tps / generate_tps:.3f}")
    print(f"step_speedup={engine_tps / forward_tps:.3f}")
    print(f"fast_speedup={fast_tps / forward_tps:.3f}")
    print(f"fast_speedup_same_step={fast_tps / engine_tps:.3f}")
    print(f"fast_cache_speedup={fast_tps / fast_f32_tps:.3f}")


if __name__ == "__main__":
    main()
