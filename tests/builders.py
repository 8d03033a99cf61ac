"""Small builders shared by the trainer tests: trajectory records and parameter snapshots."""

from __future__ import annotations

import torch

from horizonrl.types import Message, Trajectory


def make_traj(
    tid: str,
    prompt: list[int],
    response: list[int],
    mask: list[int] | None = None,
    reward: float = 0.0,
    group: str = "g",
    finish: str = "finished",
) -> Trajectory:
    mask = mask if mask is not None else [1] * len(response)
    return Trajectory(
        id=tid,
        task_id=group,
        group_id=group,
        env="test",
        messages=[Message(role="user", content="x")],
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        logprobs=[0.0] * len(response),
        reward=reward,
        finish=finish,
    )


def params_copy(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same_params(model, saved) -> bool:
    return all(torch.equal(p, s) for p, s in zip(model.parameters(), saved, strict=True))
