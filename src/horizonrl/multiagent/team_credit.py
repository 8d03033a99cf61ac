"""Credit for a chat chain's roles: the team's outcome, less the failures blamed on each role.

Every role that acted in an episode shares the team's outcome reward (the hidden tests on the final
code). With ``train.failure_penalties`` the MAST detectors read the episode's trace (its turn order
and chain state) and each failure found is charged to the role the detector names (a CEO writing
code is the CEO's 1.2, a reviewer approving code that fails its own check is the reviewer's 3.3); a
failure without a culprit is charged to every role of the episode. A role's reward in an episode is
the outcome less its own penalties, so a role is not pushed down for what another role did.

Advantages are group-relative per role: the episodes of one task form the group, and a role's
reward is compared with its rewards in the other episodes of that task where it acted (GRPO, or
RLOO's leave-one-out mean). Every token a role wrote in an episode (all its phase runs) gets the
role's advantage for that episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from horizonrl.algos.advantages import grpo, rloo
from horizonrl.analysis.detectors import detect
from horizonrl.analysis.trace import episode_trace
from horizonrl.multiagent.team import ChainEpisodeRecord
from horizonrl.types import Trajectory

Episode = tuple[ChainEpisodeRecord, list[Trajectory]]


def blamed_modes(episode: Episode, modes: Sequence[str]) -> dict[str, list[str]]:
    """Per role that acted in ``episode``: the modes among ``modes`` the detectors charge to it."""
    record, trajectories = episode
    roles = sorted({str(t.role) for t in trajectories})
    blamed: dict[str, list[str]] = {role: [] for role in roles}
    if not modes or not trajectories:
        return blamed
    trace = episode_trace(record.episode_id, trajectories, record.order, record.chain)
    for mode, verdict in sorted(detect(trace, list(modes)).items()):
        if verdict.present:
            for role in [verdict.role] if verdict.role in blamed else roles:
                blamed[str(role)].append(mode)
    return blamed


@dataclass
class RoleBatch:
    """One role's update: its trajectories, each one's advantage, and its rewards for the log."""

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    blamed: dict[str, int] = field(default_factory=dict)


def team_batches(
    groups: Sequence[Sequence[Episode]],
    penalties: Mapping[str, float],
    estimator: str = "grpo",
    norm_by_std: bool = True,
) -> dict[str, RoleBatch]:
    """Per role: the trajectories it wrote in ``groups`` (the episodes of each task) with their
    advantages (see the module doc); ``estimator``: ``grpo`` or ``rloo``."""
    if estimator not in ("grpo", "rloo"):
        raise ValueError(f"estimator must be 'grpo' or 'rloo', got {estimator!r}")
    batches: dict[str, RoleBatch] = {}
    episodes_of: dict[str, list[tuple[int, list[Trajectory]]]] = {}  # per role: (group, its trajectories)
    for g, episodes in enumerate(groups):
        for record, trajectories in episodes:
            for role, modes in blamed_modes((record, trajectories), list(penalties)).items():
                batch = batches.setdefault(role, RoleBatch())
                batch.rewards.append(record.reward - sum(penalties[m] for m in modes))
                for m in modes:
                    batch.blamed[m] = batch.blamed.get(m, 0) + 1
                episodes_of.setdefault(role, []).append((g, [t for t in trajectories if str(t.role) == role]))
    for role, batch in batches.items():
        rewards = torch.tensor(batch.rewards, dtype=torch.float64)
        ids = [g for g, _ in episodes_of[role]]
        advantages = grpo(rewards, ids, norm_by_std) if estimator == "grpo" else rloo(rewards, ids)
        for (_, mine), advantage in zip(episodes_of[role], advantages.tolist(), strict=True):
            batch.trajectories.extend(mine)
            batch.advantages.extend([float(advantage)] * len(mine))
    return batches
