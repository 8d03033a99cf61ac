"""Multi-turn agent rollouts with and without the engine's conversation KV cache, side by side.

The workload is held-out calc episodes through the real agent loop and the engine (the embedded
SmolLM2 by default, or ``--checkpoint`` of a training run), greedy, the same tasks twice in one
process: once with ``prefix_cache_mib=0`` (every turn prefills the whole conversation, minus the
prefix the batch shares) and once with the cache (each turn prefills only its new tokens). The
base model rarely writes a valid tool call, so by default the agent allows several malformed
turns: every episode still runs several turns, each extending the previous prompt. Prints
``name=value`` lines, the headline ``speedup`` last.

    python benchmarks/agent_rollout.py [--quick] [--checkpoint runs/calc/sft_adapter]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.config import EngineConfig
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.weights import sampler_model
from horizonrl.envs.factory import env_factory, make_tasks
from horizonrl.models import context_length, load_model
from horizonrl.rollout.runner import run_rollouts


def run(cfg, model, tokenizer, tasks, cache_mib: float) -> tuple[float, list, dict]:
    max_context = context_length(model, cfg.model)
    engine = HFEngine(
        model,
        tokenizer,
        max_batch_size=cfg.engine.max_batch_size,
        seed=0,
        max_context=max_context,
        prefix_cache_mib=cache_mib,
    )
    agent = Agent(tokenizer, engine, cfg.sampling, cfg.agent, max_context)
    greedy = cfg.sampling.model_copy(update={"temperature": 0.0})
    start = time.perf_counter()
    trajs = asyncio.run(
        run_rollouts(agent, env_factory(cfg.env), tasks, 1, cfg.engine.max_batch_size, sampling=greedy)
    )
    return time.perf_counter() - start, trajs, engine.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 episodes instead of 64")
    parser.add_argument("--checkpoint", default=None, help="adapter or model directory of a training run")
    parser.add_argument("--config", default="configs/calc.yaml")
    args = parser.parse_args()
    overrides = ["engine.max_batch_size=16" if args.quick else "engine.max_batch_size=32"]
    if args.checkpoint is None:
        overrides += ["agent.max_malformed=3", "agent.max_turns=4"]
    cfg = load_config(args.config, overrides)
    policy, tokenizer = load_model(cfg.model, checkpoint=args.checkpoint)
    if hasattr(policy, "merge_and_unload"):
        policy = policy.merge_and_unload()
    model = sampler_model(policy, cfg.engine.dtype)
    tasks = make_tasks(cfg.env, cfg.eval.split, 16 if args.quick else 64, cfg.eval.seed)

    wall_off, trajs_off, stats_off = run(cfg, model, tokenizer, tasks, 0)
    cache_mib = cfg.engine.prefix_cache_mib or EngineConfig().prefix_cache_mib  # on even if 0
    wall_on, trajs_on, stats_on = run(cfg, model, tokenizer, tasks, cache_mib)
    pairs = zip(trajs_off, trajs_on, strict=True)
    same = sum(a.finish == b.finish and a.num_turns == b.num_turns for a, b in pairs)
    turns = sum(t.num_turns for t in trajs_on) / len(trajs_on)
    print(f"episodes={len(tasks)}")
    print(f"mean_turns={turns:.2f}")
    print(f"prompt_tokens={int(stats_on['prompt_tokens'])}")
    print(f"conversation_reused_tokens={int(stats_on['conversation_reused_tokens'])}")
    print(f"wall_s_cache_off={wall_off:.1f}")
    print(f"wall_s_cache_on={wall_on:.1f}")
    print(f"generated_tokens_off={int(stats_off['generated_tokens'])}")
    print(f"generated_tokens_on={int(stats_on['generated_tokens'])}")
    print(f"same_finish_and_turns={same}/{len(tasks)}")
    print(f"peak_rss_gib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")
    print(f"speedup={wall_off / wall_on:.3f}")


if __name__ == "__main__":
    main()
