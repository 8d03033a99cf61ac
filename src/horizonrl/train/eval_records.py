"""Held-out eval records read back: each task's outcomes, the success rate with its 95% interval,
and which of a run's eval files holds the eval behind a figure of its ``summary.json``.

A training run writes one file per eval under ``eval/``: ``base.jsonl`` (the model as loaded),
``start.jsonl`` (after the warm start) and ``step_NNNNNN.jsonl``; ``horizon eval`` writes
``eval.jsonl`` in the recipe's run directory. A task sampled more than once has one record per
sample, all with its ``task_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from horizonrl.stats import Estimate, rate_over_tasks
from horizonrl.types import Trajectory, read_trajectories

EVAL_DIR = "eval"
#: where `horizon eval` writes its records in the recipe's run directory
SINGLE_EVAL_FILE = "eval.jsonl"


def task_outcomes(trajectories: Iterable[Trajectory]) -> dict[str, list[float]]:
    """Each task's 0/1 outcomes (one per sample), in the order the tasks first appear."""
    outcomes: dict[str, list[float]] = {}
    for traj in trajectories:
        key = traj.task_id or traj.group_id or traj.id.split("#", 1)[0]
        outcomes.setdefault(key, []).append(1.0 if traj.success else 0.0)
    return outcomes


def success_estimate(outcomes: Mapping[str, Sequence[float]]) -> Estimate:
    """The success rate over tasks with its 95% interval (:func:`horizonrl.stats.rate_over_tasks`:
    Wilson for one sample per task, a bootstrap over tasks for more)."""
    return rate_over_tasks(list(outcomes.values()))


def interval_fields(intervals: Mapping[str, Sequence[float]], step: int) -> dict[str, float]:
    """The metrics line's fields of the interval of the eval at ``step`` (``RunState.eval_intervals``):
    ``eval/success_low`` and ``eval/success_high``; none when that eval has no interval."""
    bounds = intervals.get(str(step))
    if not bounds:
        return {}
    return {"eval/success_low": float(bounds[0]), "eval/success_high": float(bounds[1])}


def read_outcomes(path: Path) -> dict[str, list[float]]:
    """:func:`task_outcomes` of an eval file (a bad line is a DataError naming file:line)."""
    return task_outcomes(read_trajectories(path))


def step_eval_file(run_dir: Path, step: int, sft: bool | None = None) -> Path | None:
    """The eval file of a training run's eval at ``step`` (step 0: the start eval after a warm start,
    ``sft``, else the base eval; either when ``sft`` is not known), or None when the run directory
    holds none."""
    eval_dir = Path(run_dir) / EVAL_DIR
    first = {True: ["start.jsonl"], False: ["base.jsonl"], None: ["start.jsonl", "base.jsonl"]}[sft]
    names = [f"step_{step:06d}.jsonl"] if step else first
    return next((eval_dir / n for n in names if (eval_dir / n).is_file()), None)
