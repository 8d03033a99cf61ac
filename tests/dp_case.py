"""The training step the data-parallel tests run, built the same way in every process."""

from __future__ import annotations

from typing import Any

import torch
from builders import two_groups

from horizonrl.algos.critic import make_value_head
from horizonrl.config import TrainConfig
from horizonrl.model_config import LoraSettings
from horizonrl.models import tiny_random_model
from horizonrl.train.update import train_step
from horizonrl.trainable import wrap_lora


def build(overrides: dict[str, Any]) -> tuple[Any, Any, Any, Any, TrainConfig]:
    cfg = TrainConfig(group_size=3, lr=5e-2, autocast="none", **overrides)
    model, _ = tiny_random_model(seed=0)
    torch.manual_seed(7)
    model = wrap_lora(model, LoraSettings())
    head = make_value_head(model) if cfg.critic == "value_head" else None
    # plain SGD: the weights then move by the gradient itself, so they compare as closely as the
    # gradients do (Adam's first steps divide each element by its own magnitude, which turns the
    # float noise of an element whose gradient is ~0 into a step of up to the learning rate)
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    optimizer = torch.optim.SGD(params, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, head, optimizer, scheduler, cfg


def run_step(
    model: Any, head: Any, optimizer: Any, scheduler: Any, cfg: TrainConfig, collective: Any
) -> dict[str, float]:
    return train_step(
        model,
        optimizer,
        scheduler,
        two_groups(),
        cfg,
        pad_id=0,
        value_head=head,
        seed=3,
        collective=collective,
    )
