"""Grounded signals: what the env reports about an episode, each as one number in a fixed unit.

The stream's reward is ``sum(w[name] * signal(name))`` over the weighted signals. Units are chosen so
that typical values are of order one: tokens in thousands, time in minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from horizonrl.types import Trajectory


def _metric(name: str) -> Callable[[Trajectory], float]:
    return lambda t: float(t.metrics.get(name, 0.0))


def _finished(t: Trajectory) -> float:
    return float(t.finish == "finished")


def _thousand_tokens(t: Trajectory) -> float:
    return t.metrics.get("model_tokens", 0.0) / 1000


#: name -> (what it measures, how it is read off a trajectory record)
SIGNALS: dict[str, tuple[str, Callable[[Trajectory], float]]] = {
    "success": ("1 when the env judges the task solved, else 0", lambda t: float(t.success)),
    "reward": (
        "the env's own reward for the episode",
        lambda t: float(t.metrics.get("env_reward", t.reward)),
    ),
    "finished": ("1 when the agent ended the episode itself, else 0", _finished),
    "tool_errors": ("tool calls that failed", _metric("tool_errors")),
    "malformed": ("turns that broke the tool-call format", _metric("malformed_turns")),
    "tokens": ("tokens the policy generated, in thousands", _thousand_tokens),
    "turns": ("turns the episode took", lambda t: float(t.num_turns)),
    "time": ("seconds the episode ran, in minutes", lambda t: t.timings.run_s / 60),
}


def check_signal_names(names: Iterable[str], where: str) -> None:
    """Raise ValueError naming the first unknown signal in ``names`` and the valid ones."""
    unknown = [n for n in names if n not in SIGNALS]
    if unknown:
        raise ValueError(f"{where}: unknown signal {unknown[0]!r}; valid: {', '.join(SIGNALS)}")


def signal_vector(trajectory: Trajectory, names: Sequence[str]) -> list[float]:
    """The trajectory's signals ``names``, in that order."""
    return [SIGNALS[name][1](trajectory) for name in names]


def weighted(vector: Sequence[float], weights: Sequence[float]) -> float:
    """``w · s``."""
    return sum(w * s for w, s in zip(weights, vector, strict=True))


def as_vector(values: Mapping[str, float], names: Sequence[str]) -> list[float]:
    """A ``{signal: value}`` mapping (unmentioned signals 0) as a vector over ``names``."""
    check_signal_names(values, "preference")
    return [float(values.get(name, 0.0)) for name in names]


def shape_rewards(
    trajectories: Sequence[Trajectory], names: Sequence[str], weights: Sequence[float]
) -> list[Trajectory]:
    """``trajectories`` with ``reward = w · s``; the env's reward stays in ``metrics["env_reward"]``
    and its success verdict in ``metrics["success"]`` (success never changes with the weights)."""
    out = []
    for traj in trajectories:
        vector = signal_vector(traj, names)
        metrics = {**traj.metrics, "env_reward": traj.metrics.get("env_reward", traj.reward)}
        metrics.setdefault("success", float(traj.success))
        out.append(traj.model_copy(update={"reward": weighted(vector, weights), "metrics": metrics}))
    return out
