"""The optimizer of every trainer (RL, SFT, DPO): AdamW over the trainable parameters with a linear
warm-up, and the clipped step that refuses a non-finite gradient (the weights are never corrupted)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.errors import TrainingError


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainingError(
            "the policy has no trainable parameters (LoRA not applied, or all weights frozen)"
        )
    return params


def make_optimizer(
    model: Any, lr: float, weight_decay: float, warmup_steps: int, extra: Sequence[Any] = ()
) -> tuple[Any, Any]:
    """AdamW over the trainable parameters (of ``model`` and the ``extra`` modules, e.g. a value
    head) and a linear warm-up schedule."""
    params = trainable_parameters(model) + [p for m in extra for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0
    )
    return optimizer, scheduler


def optimizer_step(model: Any, optimizer: Any, scheduler: Any, max_grad_norm: float) -> float:
    """Clip and apply the accumulated gradients; a non-finite gradient norm drops them and raises."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        raise TrainingError(f"non-finite gradient norm ({norm}); the update was skipped, weights unchanged")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
