"""Making rollout jobs (:class:`~horizonrl.agent.job.RolloutJob`, one trajectory to sample): a
task's samples and their ids, the schedulers' default policy and sampling parameters, and the
experience notes of experience-mixed rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from horizonrl.agent.job import RolloutJob
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import ScriptedPolicy
from horizonrl.types import Task


def trajectory_id(task: Task, sample: int) -> str:
    return f"{task.id}#{sample}"


def make_jobs(
    tasks: Sequence[Task],
    samples_per_task: int,
    *,
    policy: ScriptedPolicy | None = None,
    sampling: SamplingParams | None = None,
) -> list[RolloutJob]:
    """``samples_per_task`` jobs per task, task by task; a task's samples share its id as group.
    Every job gets ``policy`` and ``sampling``."""
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task must be at least 1, got {samples_per_task}")
    return [
        RolloutJob(t, trajectory_id(t, k), t.id, policy, sampling)
        for t in tasks
        for k in range(samples_per_task)
    ]


def with_defaults(
    jobs: Sequence[RolloutJob], policy: ScriptedPolicy | None, sampling: SamplingParams | None
) -> list[RolloutJob]:
    """``jobs`` with ``policy`` and ``sampling`` filled in where a job carries none (what the
    schedulers' ``policy=``/``sampling=`` keywords mean)."""
    if policy is None and sampling is None:
        return list(jobs)
    return [
        replace(
            job,
            policy=job.policy if job.policy is not None else policy,
            sampling=job.sampling if job.sampling is not None else sampling,
        )
        for job in jobs
    ]


def experience_samples(samples_per_task: int, eta: float) -> int:
    """How many of a task's ``samples_per_task`` samples get its retrieved experiences:
    ``round(eta * n)`` (AgentEvolver's experience-mixed rollouts; the rest stay on-policy)."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    return round(eta * samples_per_task)


def with_notes(jobs: Sequence[RolloutJob], notes: dict[str, str], eta: float) -> list[RolloutJob]:
    """``jobs`` where the first ``round(eta * n)`` samples of each group carry that group's note
    (``notes[group_id]``; a group without one keeps all its samples plain)."""
    sizes: dict[str, int] = {}
    for job in jobs:
        sizes[job.group_id] = sizes.get(job.group_id, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for job in jobs:
        k = seen.get(job.group_id, 0)
        seen[job.group_id] = k + 1
        note = notes.get(job.group_id, "")
        guided = bool(note) and k < experience_samples(sizes[job.group_id], eta)
        out.append(replace(job, system_note=note) if guided else job)
    return out
