"""Throughput of one GRPO policy update versus a bare transformers forward+backward on the same tokens.

The batch is one demo step's worth of real agent trajectories: the calc env's scripted oracle run
through the agent loop (multi-turn, tool calls, observations), ``--tasks`` groups of ``--group``
rollouts with mixed rewards so every trajectory carries an advantage. Both sides use the embedded
default with LoRA, bfloat16 autocast and the same micro-batches of at most ``micro_batch_tokens``
padded tokens, and both end with an AdamW step:

- ours: ``train_step`` (logprobs at model tokens only, shared prompt prefix computed once,
  PPO-clip over ``loss_mask``, gradient accumulation and clipping);
- bare: ``model(input_ids, attention_mask, labels)`` with labels masked to the model tokens, the
  textbook transformers fine-tuning step, over the same micro-batches.

Prints ``name=value`` lines, the headline ``overhead_ratio`` (ours / bare time, lower is better) last.

    python benchmarks/train_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

import torch

from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.envs.factory import env_factory, make_tasks
from horizonrl.envs.registry import get_env_class
from horizonrl.models import context_length, load_model
from horizonrl.optim import make_optimizer
from horizonrl.train.batching import collate, micro_batches
from horizonrl.train.logprobs import autocast, common_prompt_prefix, shares_prefix
from horizonrl.train.sft import oracle_demos
from horizonrl.train.update import train_step
from horizonrl.types import Trajectory


def build_batch(config_path: str, tasks: int, group: int) -> tuple[list[Trajectory], Any, Any, Any]:
    """``tasks * group`` oracle trajectories of the calc env, rewards alternating 1/0 within groups."""
    cfg = load_config(config_path)
    model, tokenizer = load_model(cfg.model, trainable=True)
    agent = Agent(tokenizer, None, cfg.sampling, cfg.agent, context_length(model, cfg.model))
    env_cls = get_env_class(cfg.env.name)
    demos = asyncio.run(
        oracle_demos(
            agent, env_factory(cfg.env), make_tasks(cfg.env, "train", tasks * group, 0), env_cls.oracle()
        )
    )
    trajectories = []
    for i, traj in enumerate(demos):
        trajectories.append(traj.model_copy(update={"group_id": f"g{i // group}", "reward": float(i % 2)}))
    return trajectories, model, tokenizer, cfg


def chunks_of(model, trajectories, max_tokens: int) -> tuple[list[list[int]], int]:
    """The micro-batches ``accumulate_gradients`` forms, and the shared prefix it computes once."""
    shared = common_prompt_prefix(trajectories) if shares_prefix(model) else 0
    lengths = [len(t.prompt_ids) + len(t.response_ids) - shared for t in trajectories]
    return micro_batches(lengths, max_tokens - shared), shared


def bare_step(model, optimizer, trajectories, pad_id: int, chunks: list[list[int]]) -> None:
    """Plain transformers fine-tuning step over the same micro-batches (labels = model tokens)."""
    total = sum(sum(t.loss_mask) for t in trajectories)
    for rows in chunks:
        batch = collate([trajectories[i] for i in rows], pad_id)
        labels = batch.input_ids.clone()
        labels[:, 1:][batch.loss_mask == 0] = -100
        labels[:, 0] = -100
        with autocast(torch.bfloat16):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels)
        (out.loss * batch.num_loss_tokens / total).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/calc.yaml", help="recipe (model, env, train)")
    parser.add_argument("--quick", action="store_true", help="a smaller batch and one repeat (< 60 s)")
    parser.add_argument("--tasks", type=int, default=None, help="groups (default: the recipe's; quick 2)")
    parser.add_argument("--group", type=int, default=None, help="rollouts per group (quick: 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each; the best counts")
    args = parser.parse_args()
    cfg0 = load_config(args.config)
    tasks = args.tasks or (2 if args.quick else cfg0.train.tasks_per_step)
    group = args.group or (4 if args.quick else cfg0.train.group_size)
    repeats = args.repeats or (1 if args.quick else 3)

    trajectories, model, tokenizer, cfg = build_batch(args.config, tasks, group)
    tc = cfg.train.model_copy(update={"max_grad_norm": 1.0, "kl_coef": 0.0})
    pad = tokenizer.pad_token_id
    pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
    optimizer, scheduler = make_optimizer(model, 1e-6, 0.0, 0)  # tiny lr: the weights barely move
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    chunks, shared = chunks_of(model, trajectories, tc.micro_batch_tokens)
    padded = sum(len(rows) * max(lengths[i] for i in rows) for rows in chunks)
    tokens = sum(lengths)

    model.train()
    train_step(model, optimizer, scheduler, trajectories, tc, pad_id)  # warm-up
    bare_step(model, optimizer, trajectories, pad_id, chunks)
    ours_s = bare_s = float("inf")
    for _ in range(repeats):  # alternate, keep each one's best: this machine's timings are noisy
        start = time.perf_counter()
        metrics = train_step(model, optimizer, scheduler, trajectories, tc, pad_id)
        ours_s = min(ours_s, time.perf_counter() - start)
        model.train()
        start = time.perf_counter()
        bare_step(model, optimizer, trajectories, pad_id, chunks)
        bare_s = min(bare_s, time.perf_counter() - start)

    print(f"model={cfg.model.path} finetune={cfg.model.finetune}")
    print(f"trajectories={len(trajectories)}")
    print(f"tokens={tokens}")
    print(f"model_tokens={sum(sum(t.loss_mask) for t in trajectories)}")
    print(f"tokens_per_trajectory_mean={tokens / len(trajectories):.1f}")
    print(f"shared_prefix_tokens={shared}")
    print(f"micro_batches={len(chunks)}")
    print(f"micro_batch_tokens={tc.micro_batch_tokens}")
    print(f"torch_threads={torch.get_num_threads()}")
    print(f"repeats={repeats}")
    print(f"trained_trajectories={int(metrics['trained_trajectories'])}")
    print(f"ours_s={ours_s:.3f}")
    print(f"bare_s={bare_s:.3f}")
    print(f"train_tokens_per_s={tokens / ours_s:.1f}")
    print(f"bare_tokens_per_s={tokens / bare_s:.1f}")
    print(f"peak_rss_gib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")
    print(f"padding_share={(padded - tokens) / padded:.3f}")
    print(f"overhead_ratio={ours_s / bare_s:.3f}")


if __name__ == "__main__":
    main()
