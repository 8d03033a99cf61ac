"""Failures as signals: a shaped reward that subtracts a penalty per failure mode found in a
trajectory (``train.failure_penalties``), by the detectors and, with ``train.failure_judge``, the
annotator role as well.

The trainer optimizes ``reward - penalty``; the outcome reward stays in the trajectory's metrics
(``outcome_reward``) beside the penalty (``failure_penalty``), and the step's metrics log both apart
(``failure_signals/outcome_reward_mean``, ``failure_signals/penalty_mean`` and the share of samples
with each penalised mode). Success is the env's verdict and never changes with the penalty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from horizonrl.analysis.annotator import annotate
from horizonrl.analysis.detectors import DETECTORS, detect
from horizonrl.analysis.trace import trace_of
from horizonrl.types import Trajectory


def found_modes(traj: Trajectory, modes: Sequence[str], judged: Mapping[str, Any] | None = None) -> list[str]:
    """The modes among ``modes`` a detector (or the judge's verdicts, when given) finds in ``traj``."""
    detected = detect(trace_of(traj), [m for m in modes if m in DETECTORS])
    hits = {m for m, v in detected.items() if v.present}
    if judged:
        hits |= {m for m, v in judged.items() if m in modes and v.present}
    return sorted(hits)


def penalize(
    trajectories: Sequence[Trajectory], penalties: Mapping[str, float], client: Any = None
) -> tuple[list[Trajectory], dict[str, float]]:
    """``trajectories`` with their rewards reduced by the penalties of the modes found, and the
    step's metrics; ``client``: the annotator role, asked about every trajectory as well."""
    if not trajectories or not penalties:
        return list(trajectories), {}
    judged: list[Any] = [None] * len(trajectories)
    if client is not None:

        async def judge_all() -> list[Any]:
            return [(await annotate(trace_of(t), client)).verdicts for t in trajectories]

        judged = asyncio.run(judge_all())
    out: list[Trajectory] = []
    counts = dict.fromkeys(penalties, 0)
    total = 0.0
    for traj, verdicts in zip(trajectories, judged, strict=True):
        modes = found_modes(traj, list(penalties), verdicts)
        penalty = sum(penalties[m] for m in modes)
        for m in modes:
            counts[m] += 1
        total += penalty
        metrics = {**traj.metrics, "outcome_reward": traj.reward, "failure_penalty": penalty}
        metrics.setdefault("success", float(traj.success))  # the verdict stays the env's
        out.append(traj.model_copy(update={"reward": traj.reward - penalty, "metrics": metrics}))
    n = len(trajectories)
    step_metrics = {
        "failure_signals/outcome_reward_mean": sum(t.reward for t in trajectories) / n,
        "failure_signals/penalty_mean": total / n,
        **{f"failure_signals/rate_{m}": c / n for m, c in counts.items()},
    }
    return out, step_metrics
