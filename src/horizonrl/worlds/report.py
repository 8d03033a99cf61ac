"""The world benchmark's metric: normalized reward (achieved / the level's max), per world, averaged
over worlds, and broken down by AutoEnv's axes (skill, reward kind, observability)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from horizonrl.worlds.package import open_world


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def world_breakdown(trajectories: list[Any], tasks: list[Any]) -> dict[str, Any]:
    """``{"per_world": {name: {normalized_reward, success, episodes}}, "mean": ..., "by_axis": ...}``;
    the mean and each axis value average worlds (not episodes), so every world weighs the same."""
    world_of = {t.id: str(t.data.get("world")) for t in tasks}
    scores: dict[str, list[float]] = defaultdict(list)
    wins: dict[str, list[float]] = defaultdict(list)
    for traj in trajectories:
        spec = world_of.get(traj.task_id)
        if spec is None:
            continue
        scores[spec].append(float(traj.metrics.get("normalized_reward", 0.0)))
        wins[spec].append(float(traj.metrics.get("success", 0.0)))
    per_world: dict[str, dict[str, Any]] = {}
    by_axis: dict[str, list[float]] = defaultdict(list)
    for spec, xs in sorted(scores.items()):
        package = open_world(spec)
        axes = package.spec.axes
        score = _mean(xs)
        per_world[package.name] = {
            "normalized_reward": score,
            "success": _mean(wins[spec]),
            "episodes": len(xs),
            "skill": axes.skill,
            "reward": axes.reward,
            "observation": axes.observation,
        }
        for axis in (f"skill={axes.skill}", f"reward={axes.reward}", f"observation={axes.observation}"):
            by_axis[axis].append(score)
    return {
        "per_world": per_world,
        "mean": _mean([w["normalized_reward"] for w in per_world.values()]),
        "by_axis": {axis: _mean(xs) for axis, xs in sorted(by_axis.items())},
    }


def breakdown_lines(breakdown: dict[str, Any]) -> list[str]:
    lines = [
        f"{name:16} normalized_reward={w['normalized_reward']:.3f} success={w['success']:.0%} "
        f"({w['skill']}, {w['reward']}, {w['observation']}; {w['episodes']} episodes)"
        for name, w in breakdown["per_world"].items()
    ]
    lines.append(f"mean normalized_reward={breakdown['mean']:.3f} over {len(breakdown['per_world'])} worlds")
    lines += [f"  {axis:26} {score:.3f}" for axis, score in breakdown["by_axis"].items()]
    return lines
