"""A rollout job: one trajectory to sample — the task, its ids, and who writes the turns how.

The job travels with its episode (:class:`horizonrl.agent.loop.Episode` holds it), so every stage
of the agent loop reads the policy and the sampling parameters from the episode instead of having
them passed down. The rollout schedulers make the jobs (:mod:`horizonrl.rollout.job`).
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import ScriptedPolicy
from horizonrl.types import Task


@dataclass(frozen=True)
class RolloutJob:
    """One trajectory to sample.

    ``policy``: a scripted policy that writes the turns instead of the model (None: the model).
    ``sampling``: the model's sampling parameters for this trajectory (None: the agent's own).
    ``system_note``: text appended to the env's system message for this trajectory only (e.g.
    retrieved experiences as an ``<EXP>`` block); empty: the env's prompt as it is.
    """

    task: Task
    traj_id: str
    group_id: str
    policy: ScriptedPolicy | None = None
    sampling: SamplingParams | None = None
    system_note: str = ""
