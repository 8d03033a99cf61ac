"""The gap between the sampler's logprobs and the trainer's: the exact sampling copy (bfloat16 where
native, else float32) and the fast one (``engine.dtype: fast``: int8, or float16 weights on a CPU
without int8 dot products).

The demo's agent plays calc episodes (``configs/calc.yaml``, the embedded SmolLM2-135M, temperature
1) with the engine in each dtype; the trainer then scores the same tokens exactly (float32, the
no-grad pass of an RL update, ``old_outputs``). Over every model-written token it prints what
``horizon train`` logs per step: ``sampler_kl`` (the k3 estimate of KL(sampler || trainer)), the
mean absolute log-ratio, and the share of tokens whose importance weight ``pi_trainer /
pi_sampler`` exceeds ``train.tis_cap`` = 2 (those ``tis_cap`` truncates), as the mean and the worst
over batches of 8 episodes.

    python benchmarks/sampler_gap.py [--episodes 32]
"""

from __future__ import annotations

import argparse
import asyncio
import math

import torch

from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.config import EngineConfig
from horizonrl.engine.factory import engine_from_config
from horizonrl.envs.factory import env_factory, make_tasks
from horizonrl.hardware import native_bfloat16, resolve_sampler_dtype
from horizonrl.models import context_length, load_base
from horizonrl.rollout.runner import run_rollouts
from horizonrl.tokens import pad_token_id
from horizonrl.train.logprobs import old_outputs

CAP = 2.0


def gap(sampled: torch.Tensor, trainer: torch.Tensor) -> dict[str, float]:
    log_ratio = trainer - sampled  # log pi_trainer - log pi_sampler, at the sampler's tokens
    k3 = torch.exp(log_ratio) - 1 - log_ratio
    return {
        "kl": float(k3.mean()),
        "abs_log_ratio": float(log_ratio.abs().mean()),
        "clipped": float((log_ratio > math.log(CAP)).float().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--config", default="configs/calc.yaml")
    args = parser.parse_args()
    cfg = load_config(args.config, ["agent.max_malformed=3"])
    loaded = load_base(cfg.model.model_copy(update={"dtype": "float32"}))
    trainer, tok = loaded.base.eval(), loaded.tokenizer
    tasks = make_tasks(cfg.env, "train", args.episodes, 0)
    max_context = context_length(trainer, cfg.model)
    print(f"episodes={args.episodes}")
    for dtype in ("bfloat16" if native_bfloat16() else "float32", resolve_sampler_dtype("fast")):
        engine = engine_from_config(trainer, tok, EngineConfig(max_batch_size=32, dtype=dtype), cfg.model, 0)
        agent = Agent(tok, engine, cfg.sampling, cfg.agent, max_context)
        trajs = asyncio.run(run_rollouts(agent, env_factory(cfg.env), tasks, 1, 32))
        per_batch = []
        for start in range(0, len(trajs), 8):
            chunk = trajs[start : start + 8]
            scored = old_outputs(trainer, chunk, int(pad_token_id(tok)), 8192)["old_logprobs"]
            sampled = [torch.tensor(t.logprobs)[torch.tensor(t.loss_mask) > 0] for t in chunk]
            exact = [
                torch.tensor(s)[torch.tensor(t.loss_mask) > 0] for s, t in zip(scored, chunk, strict=True)
            ]
            per_batch.append(gap(torch.cat(sampled), torch.cat(exact)))
        tokens = sum(sum(t.loss_mask) for t in trajs)
        print(f"{dtype}_tokens={tokens}")
        for key in ("kl", "abs_log_ratio", "clipped"):
            values = [b[key] for b in per_batch]
            print(f"{dtype}_sampler_{key}_mean={sum(values) / len(values):.4f}")
            print(f"{dtype}_sampler_{key}_max={max(values):.4f}")
        del engine


if __name__ == "__main__":
    main()
