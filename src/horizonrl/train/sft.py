"""Supervised fine-tuning on demonstrations: the warm start for when the base model earns no reward.

Demonstrations are trajectory records in the training format — either episodes of the env's
scripted oracle run through the real agent loop (so prompts, tool-call syntax and observation tokens
are exactly what the policy will see), or any JSONL of trajectories. The loss is the negative
log-likelihood of the tokens with ``loss_mask == 1`` (what the agent wrote), averaged over those
tokens: the same masking RL uses.

:func:`sft_stage` is the one SFT stage (a fresh trainable policy on a base model, fine-tuned on the
demonstrations) of all three that run one: ``horizon train``'s warm start, ``horizon sft`` and MALT's
per-role training (``horizon malt train``).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from horizonrl.agent.loop import Agent
from horizonrl.config import RunConfig, SFTConfig
from horizonrl.envs.factory import make_tasks, oracle_policy
from horizonrl.errors import ConfigError, DataError
from horizonrl.model_config import ModelConfig
from horizonrl.optim import make_optimizer, optimizer_step
from horizonrl.rollout.runner import EnvFactory, run_rollouts
from horizonrl.train.constrained import unconstrained
from horizonrl.train.gradients import accumulate_gradients, nll_loss
from horizonrl.trainable import build_policy
from horizonrl.types import Task, Trajectory, read_trajectories


async def oracle_demos(
    agent: Agent, env_factory: EnvFactory, tasks: Sequence[Task], policy: Any, concurrency: int = 32
) -> list[Trajectory]:
    """Episodes of ``policy`` (the env's scripted oracle) through the agent loop, as training records."""
    return list(await run_rollouts(agent, env_factory, tasks, 1, concurrency, policy=policy))


def gather_demos(config: RunConfig, agent: Agent, env_factory: EnvFactory) -> list[Trajectory]:
    """The demonstrations ``config.sft`` names: ``num_demos`` episodes of the env's oracle (the
    successful ones when ``only_successful``), or the records of a JSONL file. ConfigError when the
    oracle solved none (the agent limits are then too tight for it)."""
    sft = config.sft
    if sft.demos != "oracle":
        return read_demos(sft.demos, sft.only_successful, sft.num_demos)
    tasks = make_tasks(config.env, sft.split, sft.num_demos, sft.seed)
    episodes = asyncio.run(oracle_demos(agent, env_factory, tasks, oracle_policy(config.env)))
    demos = [d for d in episodes if d.success] if sft.only_successful else episodes
    if not demos:
        reasons = Counter(d.finish for d in episodes)
        raise ConfigError(
            f"none of the {len(episodes)} oracle demonstrations succeeded (finish reasons: "
            f"{dict(reasons)}); the agent limits (agent.max_turns, agent.max_total_tokens) "
            "may be too tight for the oracle"
        )
    return demos


def read_demos(path: str | Path, only_successful: bool, limit: int) -> list[Trajectory]:
    """Up to ``limit`` trajectory records from a JSONL file (bad lines raise DataError naming them)."""
    demos = read_trajectories(path)
    if only_successful:
        demos = [d for d in demos if d.success]
    demos = [d for d in demos if sum(d.loss_mask) > 0]
    if not demos:
        kept = (
            "successful trajectories with model tokens"
            if only_successful
            else "trajectories with model tokens"
        )
        raise DataError(f"demonstration file {str(path)!r} holds no {kept}")
    return demos[:limit]


def sft_steps(demos: int, config: SFTConfig) -> int:
    """The optimizer steps of SFT on ``demos`` demonstrations (every epoch's last batch may be short)."""
    return -(-demos // config.batch_size) * config.epochs


def sft_stage(
    base: Any,
    model_config: ModelConfig,
    demos: Sequence[Trajectory],
    config: SFTConfig,
    pad_id: int,
    *,
    seed: int,
    init_seed: int | None = None,
    autocast_dtype: torch.dtype | None = None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> tuple[Any, list[dict[str, float]]]:
    """The SFT stage: ``base`` made trainable as ``model_config`` says (fresh LoRA adapters, or the
    weights themselves for full fine-tuning; :func:`~horizonrl.trainable.build_policy`, its init
    seeded by ``init_seed`` when given), then :func:`train_sft` on ``demos`` (batch order seeded by
    ``seed``). Returns ``(the trained model, one metrics dict per step)``; saving it is the caller's."""
    model = build_policy(base, model_config, init_seed=init_seed).model
    history = train_sft(
        model, demos, config, pad_id, seed=seed, autocast_dtype=autocast_dtype, on_step=on_step
    )
    return model, history


def train_sft(
    model: Any,
    demos: Sequence[Trajectory],
    config: SFTConfig,
    pad_id: int,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Fine-tune ``model``'s trainable parameters on ``demos``; returns one metrics dict per step."""
    if not demos:
        raise DataError("SFT needs at least one demonstration")
    optimizer, scheduler = make_optimizer(model, config.lr, config.weight_decay, config.warmup_steps)
    order_rng = random.Random(seed)
    total_steps = sft_steps(len(demos), config)
    history: list[dict[str, float]] = []
    model.train()
    step = 0
    for _ in range(config.epochs):
        order = list(range(len(demos)))
        order_rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            chunk = unconstrained([demos[i] for i in order[start : start + config.batch_size]])
            tokens = sum(sum(t.loss_mask) for t in chunk)
            stats = accumulate_gradients(
                model, chunk, None, nll_loss(tokens), pad_id, config.micro_batch_tokens, 1.0, autocast_dtype
            )
            stats["grad_norm"] = optimizer_step(model, optimizer, scheduler, config.max_grad_norm)
            stats["lr"] = scheduler.get_last_lr()[0]
            step += 1
            history.append(stats)
            if on_step is not None:
                on_step(step, total_steps, stats)
    model.eval()
    return history
