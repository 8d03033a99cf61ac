"""Direct Preference Optimization (Rafailov et al. 2023) on pairs of agent conversations.

The pairs and their tokenization are :mod:`horizonrl.train.preference_pairs`'s: each pair is two
trajectory records (``chosen``, ``rejected``) over the same prompt, so batching and log-probabilities
are the trainer's own.

A response's log-probability is the sum of its model-token logprobs (their mean with
``dpo.length_normalize``). The reference log-probabilities are computed once, before any update, under
``no_grad``: with a LoRA policy from the model with its adapter switched off (the base model, as TRL
does; a fresh adapter starts equal to it), otherwise from the starting weights themselves — no
second copy of the model is kept. The loss is :func:`horizonrl.algos.losses.dpo`.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from horizonrl.algos import losses
from horizonrl.config import DPOConfig
from horizonrl.errors import DataError, TrainingError
from horizonrl.optim import make_optimizer, optimizer_step
from horizonrl.tokens import pad_token_id
from horizonrl.train.batching import TokenBatch, collate, micro_batches
from horizonrl.train.constrained import unconstrained
from horizonrl.train.logprobs import MIN_SHARED_PREFIX, common_prompt_prefix, policy_forward, shares_prefix
from horizonrl.train.preference_pairs import PreferencePair, TokenPair, encode_pairs, read_pairs
from horizonrl.train.run_lock import holds_run_dir

# ---------------------------------------------------------------------------------------------------
# sequence log-probabilities


def _pair_micro_batches(model: Any, pairs: Sequence[TokenPair], max_tokens: int) -> list[list[int]]:
    """Pair indices grouped so each micro-batch (both sequences of each pair: 2 rows per pair) stays
    within ``max_tokens`` padded tokens, a prompt prefix every row shares counted once."""
    rows = [t for p in pairs for t in (p.chosen, p.rejected)]
    shared = common_prompt_prefix(rows) if shares_prefix(model) else 0
    if shared < MIN_SHARED_PREFIX or shared >= max_tokens:
        shared = 0
    return micro_batches([p.length - shared for p in pairs], max(1, (max_tokens - shared) // 2))


def _sequence_logps(
    model: Any,
    pairs: Sequence[TokenPair],
    pad_id: int,
    autocast_dtype: torch.dtype | None,
    length_normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [k], rejected [k])`` log-probabilities of one micro-batch of pairs under ``model``
    (carrying the gradient when enabled): the sum (or mean) of each response's model-token logprobs."""
    batch: TokenBatch = collate(
        unconstrained([p.chosen for p in pairs] + [p.rejected for p in pairs]), pad_id
    )
    logp = policy_forward(model, batch, 1.0, autocast_dtype).logprobs
    bad = (~torch.isfinite(logp.detach())).any(dim=-1).nonzero().flatten().tolist()
    if bad:
        raise TrainingError(
            f"non-finite logprobs for {[batch.ids[i] for i in bad][:5]}: the weights may have diverged"
        )
    mask = batch.loss_mask.to(logp.device)
    seq = (logp * mask).sum(dim=-1)
    if length_normalize:
        seq = seq / mask.sum(dim=-1).clamp(min=1)
    k = len(pairs)
    return seq[:k], seq[k:]


@torch.no_grad()
def score_pairs(
    model: Any,
    pairs: Sequence[TokenPair],
    pad_id: int,
    micro_batch_tokens: int,
    autocast_dtype: torch.dtype | None = None,
    length_normalize: bool = False,
    reference: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [P], rejected [P])`` log-probabilities of every pair under ``model`` in eval mode,
    without gradients. ``reference``: the reference policy — the model with its LoRA adapter switched
    off, or the model as it is when it has no adapter."""
    chosen = torch.zeros(len(pairs))
    rejected = torch.zeros(len(pairs))
    was_training = model.training
    model.eval()
    off = model.disable_adapter() if reference and hasattr(model, "disable_adapter") else None
    try:
        with off if off is not None else contextlib.nullcontext():
            for rows in _pair_micro_batches(model, pairs, micro_batch_tokens):
                c, r = _sequence_logps(
                    model, [pairs[i] for i in rows], pad_id, autocast_dtype, length_normalize
                )
                chosen[rows] = c.float().cpu()
                rejected[rows] = r.float().cpu()
    finally:
        model.train(was_training)
    return chosen, rejected


def preference_stats(
    policy: tuple[torch.Tensor, torch.Tensor], reference: tuple[torch.Tensor, torch.Tensor], beta: float
) -> dict[str, float]:
    """The DPO loss and reward statistics of scored pairs, plus ``prefers_chosen``: the fraction of
    pairs where the policy gives the chosen response the higher log-probability."""
    loss, stats = losses.dpo(policy[0], policy[1], reference[0], reference[1], beta)
    return {
        "loss": float(loss),
        **stats,
        "prefers_chosen": float((policy[0] > policy[1]).float().mean()),
    }


# ---------------------------------------------------------------------------------------------------
# training


def _batches(n: int, batch_size: int, epochs: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """(epoch, pair indices) of every optimizer step: each epoch a fresh seeded shuffle."""
    rng = random.Random(seed)
    for epoch in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield epoch, order[start : start + batch_size]


def _accumulate(
    model: Any,
    pairs: Sequence[TokenPair],
    chunk: list[int],
    reference: tuple[torch.Tensor, torch.Tensor],
    cfg: DPOConfig,
    pad_id: int,
    autocast_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Forward and backward over the pairs ``chunk`` (indices into ``pairs``) in micro-batches; the
    gradients in ``.grad`` add up to the gradient of the chunk's mean DPO loss. Returns the loss and
    pair-weighted means of the stats."""
    chunk_pairs = [pairs[i] for i in chunk]
    totals: dict[str, float] = {"loss": 0.0}
    for rows in _pair_micro_batches(model, chunk_pairs, cfg.micro_batch_tokens):
        idx = [chunk[i] for i in rows]
        names = [pairs[i].id for i in idx][:8]
        chosen, rejected = _sequence_logps(
            model, [pairs[i] for i in idx], pad_id, autocast_dtype, cfg.length_normalize
        )
        ref_chosen, ref_rejected = (r[idx].to(chosen) for r in reference)
        try:
            loss, stats = losses.dpo(chosen, rejected, ref_chosen, ref_rejected, cfg.beta)
        except ValueError as exc:
            raise TrainingError(f"DPO loss of pairs {names}: {exc}") from None
        if not torch.isfinite(loss):
            raise TrainingError(f"non-finite DPO loss ({loss.item()}) for pairs {names}")
        share = len(idx) / len(chunk)
        (loss * share).backward()
        totals["loss"] += float(loss.detach()) * share
        stats["chosen_logp"] = float(chosen.detach().mean())
        stats["rejected_logp"] = float(rejected.detach().mean())
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value * share
    return totals


def train_dpo(
    model: Any,
    pairs: Sequence[TokenPair],
    cfg: DPOConfig,
    pad_id: int,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[dict[str, float]]:
    """Train ``model``'s trainable parameters with DPO on ``pairs``; one metrics dict per step.

    ``reference``: the pairs' reference log-probabilities (chosen [P], rejected [P]) when already
    computed (see :func:`score_pairs`); otherwise they are computed here, before the first update.
    Each step takes ``cfg.batch_size`` pairs (seeded shuffle per epoch), accumulates the gradient of
    their mean loss over micro-batches of at most ``cfg.micro_batch_tokens`` padded tokens (a pair's
    two sequences always together), then clips and steps; a non-finite loss or gradient stops
    training with the pairs named and the weights untouched."""
    if not pairs:
        raise DataError("DPO needs at least one preference pair")
    optimizer, scheduler = make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps)
    if reference is None:
        reference = score_pairs(
            model, pairs, pad_id, cfg.micro_batch_tokens, autocast_dtype, cfg.length_normalize, True
        )
    if any(r.shape != (len(pairs),) for r in reference):
        raise ValueError(f"reference: expected two tensors of shape ({len(pairs)},)")
    per_epoch = -(-len(pairs) // cfg.batch_size)
    total_steps = per_epoch * cfg.epochs
    history: list[dict[str, float]] = []
    model.train()
    for step, (epoch, chunk) in enumerate(_batches(len(pairs), cfg.batch_size, cfg.epochs, seed), start=1):
        start = time.perf_counter()
        try:
            totals = _accumulate(model, pairs, chunk, reference, cfg, pad_id, autocast_dtype)
        except TrainingError:
            optimizer.zero_grad(set_to_none=True)  # no partial gradient survives into a later step
            raise
        totals["grad_norm"] = optimizer_step(model, optimizer, scheduler, cfg.max_grad_norm)
        totals["lr"] = scheduler.get_last_lr()[0]
        totals["epoch"] = float(epoch)
        totals["pairs"] = float(len(chunk))
        totals["step_s"] = time.perf_counter() - start
        history.append(totals)
        if on_step is not None:
            on_step(step, total_steps, totals)
    model.eval()
    return history


# ---------------------------------------------------------------------------------------------------
# the whole command


def config_pairs(config: Any) -> list[PreferencePair]:
    """The pairs of ``dpo.pairs`` (at most ``dpo.max_pairs``); ConfigError when the key is not set."""
    from horizonrl.errors import ConfigError

    if config.dpo.pairs is None:
        raise ConfigError(
            "dpo.pairs is not set: give the JSONL file of preference pairs, e.g. "
            "`horizon dpo CONFIG dpo.pairs=path/to/pairs.jsonl` (format: docs/dpo.md)"
        )
    return read_pairs(config.dpo.pairs, config.dpo.max_pairs)


@holds_run_dir
def run_dpo(
    config: Any,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    pairs: Sequence[PreferencePair] | None = None,
) -> dict[str, Any]:
    """`horizon dpo`: load the policy (LoRA per ``model.finetune``), read ``dpo.pairs`` (unless
    ``pairs`` are given) and tokenize them with the env's tools, score them under the reference, train,
    score them again, save the adapter (``dpo_adapter/``) or the weights (``dpo_model/``) and
    ``dpo_metrics.jsonl`` (one line per step) and ``dpo_summary.json`` in the run directory. Returns
    the summary."""
    from horizonrl.envs.registry import make_env
    from horizonrl.models import context_length, load_base
    from horizonrl.policy import write_policy_atomic
    from horizonrl.trainable import build_policy

    status = on_status or (lambda text: None)
    cfg: DPOConfig = config.dpo
    wall = time.perf_counter()
    raw = list(pairs) if pairs is not None else config_pairs(config)
    status("loading model")
    loaded = load_base(config.model)
    model, tokenizer = build_policy(loaded.base, config.model).model, loaded.tokenizer
    pad = pad_token_id(tokenizer)
    tools = make_env(config.env.name, config.env.options).tools
    encoded = encode_pairs(raw, tokenizer, tools, context_length(model, config.model), config.env.name)
    autocast_dtype = config.train.autocast_dtype
    args = (pad, cfg.micro_batch_tokens, autocast_dtype, cfg.length_normalize)
    status("reference log-probabilities")
    reference = score_pairs(model, encoded, *args, reference=True)
    before = preference_stats(reference, reference, cfg.beta)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "dpo_metrics.jsonl"
    with metrics_path.open("w", encoding="utf-8") as sink:

        def record(step: int, total: int, stats: dict[str, float]) -> None:
            sink.write(json.dumps({"step": step, **stats}) + "\n")
            sink.flush()
            if on_step is not None:
                on_step(step, total, stats)

        status("training")
        train_start = time.perf_counter()
        history = train_dpo(
            model, encoded, cfg, int(pad), config.seed, autocast_dtype, record, reference=reference
        )
        train_s = time.perf_counter() - train_start
    status("scoring the trained policy")
    after = preference_stats(score_pairs(model, encoded, *args), reference, cfg.beta)
    out = run_dir / ("dpo_adapter" if hasattr(model, "disable_adapter") else "dpo_model")
    write_policy_atomic(
        out, model=model, tokenizer=tokenizer, base=loaded.identity, name="dpo", description="horizon dpo"
    )
    summary = {
        "pairs": len(encoded),
        "steps": len(history),
        "epochs": cfg.epochs,
        "beta": cfg.beta,
        "first_loss": history[0]["loss"],
        "final_loss": history[-1]["loss"],
        "before": before,
        "after": after,
        "saved": str(out),
        "metrics": str(metrics_path),
        "train_s": train_s,
        "wall_s": time.perf_counter() - wall,
    }
    (run_dir / "dpo_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
