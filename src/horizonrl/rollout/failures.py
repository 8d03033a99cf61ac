"""What a training step does with trajectories that failed (``finish`` "error" or "timeout").

An env, engine or reward failure says nothing about the policy, so by default such a trajectory is
left out of the loss and out of its group's baseline. The policy is set by ``rollout.on_failure``:

- ``drop_trajectory``: drop the failed trajectories; their groups go on with the other samples.
- ``drop_group``: drop every group that holds a failed trajectory (keeps group sizes equal).
- ``zero_reward``: keep them with reward 0 (when a failure is the policy's fault, e.g. a command
  it ran hung until the timeout).

The counts go to the step's metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from horizonrl.types import Trajectory

FailurePolicy = Literal["drop_trajectory", "drop_group", "zero_reward"]
FAILURE_POLICIES: tuple[str, ...] = FailurePolicy.__args__  # type: ignore[attr-defined]


def is_failure(traj: Trajectory) -> bool:
    return traj.finish in ("error", "timeout")


def apply_failure_policy(
    trajectories: Sequence[Trajectory], policy: FailurePolicy
) -> tuple[list[Trajectory], dict[str, float]]:
    """The trajectories a step trains on under ``policy``, and the counts for its metrics."""
    if policy not in FAILURE_POLICIES:
        raise ValueError(f"unknown failure policy {policy!r}; valid: {', '.join(FAILURE_POLICIES)}")
    failed = [t for t in trajectories if is_failure(t)]
    bad_groups = {t.group_id for t in failed}
    if policy == "drop_trajectory":
        kept = [t for t in trajectories if not is_failure(t)]
    elif policy == "drop_group":
        kept = [t for t in trajectories if t.group_id not in bad_groups]
    else:
        kept = [t.model_copy(update={"reward": 0.0}) if is_failure(t) else t for t in trajectories]
    metrics = {
        "failures/error": float(sum(t.finish == "error" for t in failed)),
        "failures/timeout": float(sum(t.finish == "timeout" for t in failed)),
        "failures/dropped_trajectories": float(len(trajectories) - len(kept)),
        "failures/dropped_groups": float(
            len({t.group_id for t in trajectories} - {t.group_id for t in kept})
        ),
    }
    return kept, metrics
