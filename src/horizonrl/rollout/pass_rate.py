"""Task filtering by pass rate: keep tasks a policy sometimes solves (GRPO learns nothing from a
group whose rewards are all equal, so tasks every rollout fails or passes only cost compute)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from horizonrl.types import Task, Trajectory


def pass_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Success rate per task id (failed rollouts — error, timeout — count as unsolved)."""
    solved: dict[str, list[bool]] = defaultdict(list)
    for traj in trajectories:
        solved[traj.task_id].append(traj.success)
    return {task: sum(s) / len(s) for task, s in solved.items()}


def filter_by_pass_rate(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], min_rate: float, max_rate: float
) -> tuple[list[Task], dict[str, float]]:
    """The tasks whose success rate lies in ``[min_rate, max_rate]`` (in task order), and every rate."""
    rates = pass_rates(trajectories)
    kept = [t for t in tasks if t.id in rates and min_rate <= rates[t.id] <= max_rate]
    return kept, rates
