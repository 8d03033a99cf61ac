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


def two_groups(finish_last: str = "finished") -> list[Trajectory]:
    """Two groups of three with mixed rewards, ragged lengths, an observation gap in one
    trajectory and a different prompt per group (the last one's finish reason is ``finish_last``)."""
    return [
        make_traj("a0", [1, 2, 3], [4, 5, 6], reward=1.0, group="a"),
        make_traj("a1", [1, 2, 3], [7, 8, 9, 10, 11], mask=[1, 1, 0, 0, 1], reward=0.0, group="a"),
        make_traj("a2", [1, 2, 3], [12, 13], reward=0.0, group="a"),
        make_traj("b0", [1, 2, 20], [21, 22, 23], reward=0.0, group="b"),
        make_traj("b1", [1, 2, 20], [24, 25], reward=1.0, group="b"),
        make_traj("b2", [1, 2, 20], [26, 27, 28, 29], reward=0.25, group="b", finish=finish_last),
    ]
