"""Summaries of a batch of trajectories: success rate, reward, failure modes, lengths."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from horizonrl.types import FINISH_REASONS, Trajectory


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Aggregate figures over ``trajectories`` (empty input gives zeros, not an error)."""
    n = len(trajectories)
    if n == 0:
        return {"num_trajectories": 0.0, "success_rate": 0.0, "reward_mean": 0.0}
    finishes = Counter(t.finish for t in trajectories)
    out: dict[str, float] = {
        "num_trajectories": float(n),
        "success_rate": sum(t.success for t in trajectories) / n,
        "reward_mean": sum(t.reward for t in trajectories) / n,
        "turns_mean": sum(t.num_turns for t in trajectories) / n,
        "model_tokens_mean": sum(t.metrics.get("model_tokens", 0.0) for t in trajectories) / n,
        "response_tokens_mean": sum(len(t.response_ids) for t in trajectories) / n,
    }
    for reason in FINISH_REASONS:
        out[f"finish/{reason}"] = float(finishes.get(reason, 0))
    out["retokenize_drift_rate"] = sum(t.metrics.get("retokenize_drift", 0.0) > 0 for t in trajectories) / n
    return out


def failure_counts(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """How many trajectories ended each way, every finish reason listed (zeros included)."""
    finishes = Counter(t.finish for t in trajectories)
    return {reason: finishes.get(reason, 0) for reason in FINISH_REASONS}
