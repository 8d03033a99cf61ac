"""Which samples are fresh enough to train on: every completion records the weights version it was
sampled from (``policy_version_min``/``_max`` in a trajectory's metrics), and a step trains on a
sample only when all its turns come from one version and that version lags the trained policy by
at most ``max_staleness`` (older ones are dropped, or kept for truncated importance sampling)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from horizonrl.types import Trajectory


def versions(traj: Trajectory) -> tuple[int, int] | None:
    """The lowest and highest weights version of a trajectory's turns (None: not recorded, e.g. a
    scripted episode)."""
    low, high = traj.metrics.get("policy_version_min"), traj.metrics.get("policy_version_max")
    if low is None or high is None:
        return None
    return int(low), int(high)


def filter_stale(
    trajectories: Sequence[Trajectory],
    current: int,
    max_staleness: int,
    stale: Literal["drop", "importance_weight"] = "drop",
) -> tuple[list[Trajectory], dict[str, float]]:
    """The trajectories to train on with the policy at version ``current``, and the counts: samples
    that mix versions (always left out), samples older than ``max_staleness`` (left out, or kept
    when ``stale`` is ``importance_weight``), and the largest lag seen."""
    kept: list[Trajectory] = []
    mixed = too_old = 0
    lag_max = 0
    for traj in trajectories:
        seen = versions(traj)
        if seen is None:
            kept.append(traj)
            continue
        low, high = seen
        lag_max = max(lag_max, current - low)
        if low != high:
            mixed += 1
            continue
        if current - low > max_staleness:
            too_old += 1
            if stale == "drop":
                continue
        kept.append(traj)
    return kept, {
        "staleness/mixed_dropped": float(mixed),
        "staleness/stale": float(too_old),
        "staleness/max_lag": float(lag_max),
    }
