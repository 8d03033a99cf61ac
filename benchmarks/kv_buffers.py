"""Multi-turn episodes with the engine's KV buffers reused as rows finish and join, against fresh
buffers at each such event, side by side.

The workload is the demo's held-out eval: calc episodes through the real agent loop and an engine
built as the recipe builds it (``configs/calc.yaml``: the fast sampling copy, the allocator
setting, ``eval.concurrency`` episodes in flight), greedy, policy from ``--checkpoint`` (e.g. a
training run's ``sft_adapter``: episodes of three turns; the base model mostly stops after one).
The same tasks run alternately with ``Decoder.reuse_kv_buffers`` off (finished rows dropped and
joining rows merged by copying the cache into fresh buffers, as the engine did before) and on; each
variant's best wall time counts. Prints ``name=value`` lines, ``speedup`` (fresh / reused) last.

    python benchmarks/kv_buffers.py --checkpoint runs/calc/sft_adapter [--episodes 100] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.factory import apply_memory_settings, engine_from_config
from horizonrl.envs.factory import env_factory, make_tasks
from horizonrl.models import load_model
from horizonrl.rollout.runner import run_rollouts


def run(cfg, engine, tokenizer, tasks, reuse: bool) -> tuple[float, list]:
    engine.decoder.reuse_kv_buffers = reuse
    engine.decoder.forget_caches()  # each run starts without the other's kept conversations
    agent = Agent(tokenizer, engine, cfg.sampling, cfg.agent, engine.max_context)
    greedy = cfg.sampling.model_copy(update={"temperature": 0.0})
    start = time.perf_counter()
    trajs = asyncio.run(
        run_rollouts(agent, env_factory(cfg.env), tasks, 1, cfg.eval.concurrency, sampling=greedy)
    )
    return time.perf_counter() - start, trajs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="adapter or model directory of a training run")
    parser.add_argument("--config", default="configs/calc.yaml")
    parser.add_argument("--episodes", type=int, default=100, help="held-out episodes per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, alternating")
    args = parser.parse_args()
    cfg = load_config(args.config, [])
    apply_memory_settings(cfg.engine)
    policy, tokenizer = load_model(cfg.model, checkpoint=args.checkpoint)
    if hasattr(policy, "merge_and_unload"):
        policy = policy.merge_and_unload()
    engine = engine_from_config(policy, tokenizer, cfg.engine, cfg.model, cfg.seed)
    tasks = make_tasks(cfg.env, cfg.eval.split, args.episodes, cfg.eval.seed)

    walls: dict[bool, float] = {False: float("inf"), True: float("inf")}
    outputs: dict[bool, list] = {}
    for _ in range(args.repeats):
        for reuse in (False, True):
            wall, outputs[reuse] = run(cfg, engine, tokenizer, tasks, reuse)
            walls[reuse] = min(walls[reuse], wall)
    fresh, reused = outputs[False], outputs[True]
    same = sum(a.response_ids == b.response_ids for a, b in zip(fresh, reused, strict=True))
    print(f"episodes={len(tasks)}")
    print(f"episodes_in_flight={cfg.eval.concurrency}")
    print(f"engine_dtype={cfg.engine.dtype}")
    print(f"mean_turns={sum(t.num_turns for t in reused) / len(reused):.2f}")
    print(f"success_fresh={sum(t.success for t in fresh) / len(fresh):.2f}")
    print(f"success_reused={sum(t.success for t in reused) / len(reused):.2f}")
    print(f"identical_episodes={same}/{len(tasks)}")
    print(f"wall_s_fresh_buffers={walls[False]:.1f}")
    print(f"wall_s_reused_buffers={walls[True]:.1f}")
    print(f"peak_rss_gib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")
    print(f"speedup={walls[False] / walls[True]:.3f}")


if __name__ == "__main__":
    main()
