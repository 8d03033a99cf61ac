"""One RL training step: a rollout batch in, its optimizer step(s) out. ``horizon train`` →
:meth:`StepLoop.update <horizonrl.train.step_loop.StepLoop.update>` → :func:`train_step`, once per step.

:func:`train_step` reads top to bottom as it runs:

1. **old logprobs** — a no-grad pass (:func:`~horizonrl.train.logprobs.old_outputs`) where needed;
2. **advantages** — :meth:`Algorithm.advantages <horizonrl.train.algorithm.Algorithm.advantages>`;
3. **mini-batches** — the trajectories that carry a gradient, split (and shuffled per epoch);
4. **per mini-batch** — forward, loss (:meth:`Algorithm.loss_fn
   <horizonrl.train.algorithm.Algorithm.loss_fn>`) and backward over micro-batches
   (:func:`~horizonrl.train.gradients.accumulate_gradients`), plus the demonstrations' NLL term
   when ``train.demo_coef`` is set, then the optimizer step (:func:`~horizonrl.optim.optimizer_step`);
5. **metrics** — means over the optimizer steps.

What runs is chosen by :class:`~horizonrl.config.TrainConfig` alone (``train.algorithm`` presets),
once, in :class:`~horizonrl.train.algorithm.Algorithm`: the GRPO family is the plain path, and PPO's
critic, REINFORCE++'s token-level advantages, GSPO's sequence ratio and a KL in the reward or the
loss are hooks in their own modules. Batch shaping is here: overlong filtering (trajectories cut by
the token budget leave the loss but keep their place in their group's baseline); dynamic sampling
happens before, in the rollout loop.

With one optimizer step per rollout batch (``ppo_epochs = mini_batches = 1``) the policy that sampled
is the policy being trained (up to the sampler's precision), so the "old" logprobs are the current
ones detached and no extra forward pass is needed. Several steps per batch, a critic or a KL in the
reward need a no-grad pass first that records the old logprobs, old values and reference logprobs.
Non-finite rewards, logprobs, losses and gradients raise naming the trajectory; nothing is applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.config import TrainConfig
from horizonrl.data_parallel import Collective, combine_stats, my_share, reduce_gradients
from horizonrl.optim import optimizer_step
from horizonrl.seeds import derive_seed
from horizonrl.train.advantages import Advantages, check_rewards, weigh_negatives
from horizonrl.train.algorithm import Algorithm
from horizonrl.train.batching import Advantage
from horizonrl.train.constrained import unconstrained
from horizonrl.train.gradients import accumulate_gradients, nll_loss
from horizonrl.train.logprobs import old_outputs, reference_outputs
from horizonrl.types import Trajectory

#: Finish reasons of trajectories cut by the token budget (masked out by ``overlong_filter``).
OVERLONG = ("context_overflow",)

#: Per-response-token rows by name (``old_logprobs``, ``old_values``, ``ref_logprobs``, ``returns``),
#: one per trajectory of the step in its order; ``[]`` for one the no-grad pass did not cover. A row
#: is a list of floats, or a tensor [R, k] (``ref_top_ids``, ``ref_top_logprobs``).
Rows = dict[str, list[Any]]


def train_step(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    pad_id: int,
    temperature: float = 1.0,
    value_head: Any = None,
    seed: int = 0,
    collective: Collective | None = None,
    clip_high: Sequence[float | None] | None = None,
    token_advantages: Sequence[list[float]] | None = None,
    demos: Sequence[Trajectory] = (),
    replay: Any = None,
) -> dict[str, float]:
    """The optimizer step(s) of one rollout batch under ``cfg``; returns the step's metrics.

    ``temperature`` is the sampler's (the logprobs compare with its own); ``value_head`` is PPO's
    critic (``train.critic: value_head``); ``seed`` orders the mini-batches when there are several
    optimizer steps per batch (the same in a resumed run). Trajectories are used in the order given
    (task order), so results do not depend on which episode finished first. With a ``collective``
    (data-parallel ranks, :mod:`~horizonrl.data_parallel`) every rank is given the same batch,
    trains on its share of each mini-batch and steps on the gradients summed over the ranks.
    ``clip_high`` gives some trajectories their own upper clip (one entry per trajectory, None: the
    config's ``clip_high``): experience-guided samples with a wider bound (``ppo_clip`` only).
    ``token_advantages`` (one per-response-token list per trajectory) replace the configured estimator's
    (ADCA step advantages). ``demos`` are the demonstrations of the ``train.demo_coef`` term: each
    optimizer step adds ``demo_coef`` times the mean NLL of ``demo_batch`` of them (drawn in an order
    fixed by ``seed``) to the policy loss's gradient, before the step (PPO-ptx). ``replay`` (a
    :class:`~horizonrl.train.constrained.ConstraintReplay`) is needed for trajectories with turns
    sampled under a constraint: their logprobs are computed under the same masks."""
    algo = Algorithm.from_config(cfg, model, value_head)
    if cfg.demo_coef > 0 and not demos:
        raise ValueError("train.demo_coef > 0 needs the demonstrations (demos=), none were given")
    if cfg.demo_coef > 0 and collective is not None:  # the config refuses runtime.trainer_ranks with it
        raise ValueError("train.demo_coef trains in the driver only, not in data-parallel ranks")
    check_rewards(trajectories)
    trajs = list(trajectories)
    autocast_dtype = cfg.autocast_dtype
    with_tokens = [i for i, t in enumerate(trajs) if sum(t.loss_mask) > 0 and t.prompt_ids]
    overlong = {i for i in with_tokens if cfg.overlong_filter and trajs[i].finish in OVERLONG}
    metrics = {"groups": float(len({t.group_id for t in trajs})), "overlong_filtered": float(len(overlong))}

    def no_grad_pass(indices: list[int]) -> Rows:
        found = old_outputs(
            model,
            [trajs[i] for i in indices],
            pad_id,
            cfg.micro_batch_tokens,
            temperature,
            autocast_dtype,
            value_head=value_head,
            with_reference=algo.kl is not None and algo.kl.in_reward,
            replay=replay,
        )
        return _at_positions(found, indices, len(trajs))

    # 1. Old logprobs. The critic's values and a KL in the reward go into the advantages: then every
    #    trajectory needs the no-grad pass first. Else it waits for step 3 (maybe not needed at all).
    old: Rows = no_grad_pass(with_tokens) if algo.advantages_need_old_pass and with_tokens else {}

    # 2. Advantages: one per trajectory (GRPO, RLOO) or one per model token (REINFORCE++, GAE).
    if token_advantages is not None:
        if len(token_advantages) != len(trajs) or any(
            len(a) != len(t.response_ids) for a, t in zip(token_advantages, trajs, strict=False)
        ):
            raise ValueError(
                "token_advantages: expected one list per trajectory, as long as its response_ids"
            )
        advantages = Advantages(values=[list(a) for a in token_advantages])
    else:
        advantages = algo.advantages(trajs, old)
    # a trajectory left with only zeros (negative_weight 0) drops out in step 3
    advantages.values = weigh_negatives(advantages.values, cfg.negative_weight)
    metrics.update(advantages.metrics)
    if advantages.returns is not None:
        old["returns"] = advantages.returns

    # 3. Mini-batches of the trajectories with a gradient: tokens to train on, not overlong, and an
    #    advantage that is not all 0 (unless a KL, entropy or value term gives them a gradient).
    keep = [
        i
        for i in with_tokens
        if i not in overlong and (algo.trains_zero_advantages or _has_signal(advantages.values[i]))
    ]
    metrics["trained_trajectories"] = float(len(keep))
    if not keep and cfg.demo_coef == 0:
        return {**metrics, "loss": 0.0, "grad_norm": 0.0, "update_skipped": 1.0}
    # With no trajectory to train on, the demonstration term still takes its optimizer steps.
    minibatches = _minibatches(keep, cfg, seed) if keep else [[] for _ in range(cfg.updates_per_step)]
    demo_parts = _demo_batches(len(demos), len(minibatches), cfg, seed) if cfg.demo_coef > 0 else []
    mine = {i for part in minibatches for i in my_share(part, collective)}  # this rank trains these
    if not old and cfg.updates_per_step > 1:
        # The first mini-batch is trained before any step: its current logprobs, detached, are its
        # old ones. Only the trajectories trained after a step need the pass before the update.
        first = set(minibatches[0]) if cfg.ppo_epochs == 1 else set()
        later = [i for i in keep if i not in first and i in mine]
        if later:
            old = no_grad_pass(later)
    if algo.kl is not None:
        # The KL term's reference rows: from the no-grad pass where it ran (a KL in the reward), else
        # one pass now (the reference does not move during the step), not a forward per micro-batch.
        top_k = algo.kl.reference_top_k
        names = ["ref_logprobs"] + (["ref_top_ids", "ref_top_logprobs"] if top_k else [])
        ref = {name: list(old.get(name, [[] for _ in trajs])) for name in names}
        missing = [i for i in keep if i in mine and any(len(ref[name][i]) == 0 for name in names)]
        if missing:
            found = reference_outputs(
                model, [trajs[i] for i in missing], pad_id, cfg.micro_batch_tokens, temperature,
                autocast_dtype, top_k=top_k, replay=replay,
            )  # fmt: skip
            for name in names:
                for i, row in zip(missing, found[name], strict=True):
                    ref[name][i] = row
        old.update(ref)
    loss_inputs = dict(old)
    if clip_high is not None:
        if len(clip_high) != len(trajs):
            raise ValueError(
                f"clip_high: expected {len(trajs)} entries (one per trajectory), got {len(clip_high)}"
            )
        if cfg.policy_loss != "ppo_clip" and any(c is not None for c in clip_high):
            raise ValueError(
                f"clip_high per trajectory needs train.policy_loss ppo_clip, not {cfg.policy_loss!r}"
            )
        loss_inputs["clip_high"] = [
            [cfg.clip_high if c is None else c] * len(t.response_ids)
            for t, c in zip(trajs, clip_high, strict=True)
        ]

    # 4. Per mini-batch: forward, loss and backward (accumulated over micro-batches), optimizer step.
    model.train()
    totals: dict[str, float] = {}
    norms: list[float] = []
    for j, part in enumerate(minibatches):
        # the demonstrations' term first, so that the norm of its gradient alone is known
        demo_stats: dict[str, float] = {}
        if demo_parts:
            demo_stats = _demo_term(model, [demos[i] for i in demo_parts[j]], cfg, pad_id)
        chosen = [trajs[i] for i in part]
        loss_fn = algo.loss_fn(total_tokens=sum(sum(t.loss_mask) for t in chosen), total_rows=len(chosen))
        share = my_share(part, collective)
        stats = (
            accumulate_gradients(
                model,
                [trajs[i] for i in share],
                [advantages.values[i] for i in share],
                loss_fn,
                pad_id,
                cfg.micro_batch_tokens,
                temperature,
                autocast_dtype,
                with_entropy=True,
                entropy_grad=cfg.entropy_coef > 0,
                value_head=value_head,
                extras=_part_inputs(loss_inputs, share),
                gather=algo.kl.gather if algo.kl is not None else None,
                replay=replay,
            )
            if share
            else {"loss": 0.0}
        )
        stats.update(demo_stats)
        if collective is not None:
            reduce_gradients([p for g in optimizer.param_groups for p in g["params"]], collective)
            tokens = float(sum(sum(trajs[i].loss_mask) for i in share))
            stats = combine_stats(collective.all_gather((stats, tokens)))
        norms.append(optimizer_step(model, optimizer, scheduler, cfg.max_grad_norm))
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
    model.eval()

    # 5. Metrics: the loss and its stats averaged over the optimizer steps.
    updates = len(norms)
    metrics.update({key: value / updates for key, value in totals.items()})
    metrics["grad_norm"] = sum(norms) / updates
    metrics["optimizer_steps"] = float(updates)
    metrics["lr"] = scheduler.get_last_lr()[0]
    metrics["update_skipped"] = 0.0
    metrics["trained_tokens"] = float(sum(sum(trajs[i].loss_mask) for i in keep))
    return metrics


# ---------------------------------------------------------------------------------------------------
# helpers of the step


def _at_positions(found: Rows, indices: list[int], n: int) -> Rows:
    """Rows of the trajectories ``indices`` placed at their positions in a step of ``n`` ([] elsewhere)."""
    rows_at: Rows = {name: [[] for _ in range(n)] for name in found}
    for name, rows in found.items():
        for i, row in zip(indices, rows, strict=True):
            rows_at[name][i] = row
    return rows_at


def _has_signal(advantage: Advantage) -> bool:
    if isinstance(advantage, (int, float)):
        return advantage != 0.0
    return any(a != 0.0 for a in advantage)


def _split(items: list[int], parts: int) -> list[list[int]]:
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)] if items else []


def _minibatches(keep: list[int], cfg: TrainConfig, seed: int) -> list[list[int]]:
    """``ppo_epochs`` passes over ``keep``, each split into ``mini_batches``, in training order: in
    task order with one optimizer step per batch, else each pass shuffled from ``seed``."""
    order_rng = torch.Generator().manual_seed(seed)
    out: list[list[int]] = []
    for _ in range(cfg.ppo_epochs):
        if cfg.updates_per_step > 1:
            order = [keep[j] for j in torch.randperm(len(keep), generator=order_rng).tolist()]
        else:
            order = keep
        out.extend(_split(order, cfg.mini_batches))
    return out


def _demo_batches(n: int, parts: int, cfg: TrainConfig, seed: int) -> list[list[int]]:
    """``demo_batch`` demonstration indices for each of ``parts`` optimizer steps: consecutive slices
    of one order of ``range(n)`` shuffled from ``seed``, wrapping around (each demo once before any
    twice, when there are enough steps)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "demos"))).tolist()
    size = min(cfg.demo_batch, n)
    return [[order[(j * size + k) % n] for k in range(size)] for j in range(parts)]


def _demo_term(model: Any, chosen: list[Trajectory], cfg: TrainConfig, pad_id: int) -> dict[str, float]:
    """Accumulate ``demo_coef`` x the mean NLL of ``chosen`` into the gradients, which must be zero
    before; its stats: ``demo_loss``, ``demo_nll`` and the norm of this gradient
    (``demo_grad_norm``, before clipping: set ``demo_coef`` against ``grad_norm``)."""
    tokens = sum(sum(t.loss_mask) for t in chosen)
    stats = accumulate_gradients(
        model, unconstrained(chosen), None, nll_loss(tokens, cfg.demo_coef, stat="demo_nll"), pad_id,
        cfg.micro_batch_tokens, 1.0, cfg.autocast_dtype,
    )  # fmt: skip
    stats["demo_loss"] = stats.pop("loss")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    stats["demo_grad_norm"] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    return stats


def _part_inputs(inputs: Rows, part: list[int]) -> Rows:
    """The per-token loss inputs of the mini-batch ``part``; one that none of its trajectories has
    (the old logprobs of a first mini-batch, which are its current ones) is left out."""
    out = {}
    for name, rows in inputs.items():
        present = [len(rows[i]) > 0 for i in part]
        if all(present):
            out[name] = [rows[i] for i in part]
        elif any(present):
            raise RuntimeError(f"train_step: {name!r} was computed for only part of a mini-batch")
    return out
