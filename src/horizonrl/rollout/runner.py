"""Run many episodes and stream their trajectory records: the one entry point for rollouts.

Every (task, sample) pair becomes one episode in a fresh env instance, scheduled by the pipeline
(default; :mod:`horizonrl.rollout.pipeline`) or the lockstep baseline
(:mod:`horizonrl.rollout.lockstep`). Each finished trajectory is handed to ``on_trajectory`` as soon
as it completes (so a crash loses nothing already finished), and one failed episode never stops the
others. The result is the records in task order (a sequence) with the rollout's metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import ScriptedPolicy
from horizonrl.rollout.base import (
    ROLLOUT_MODES,
    EnvFactory,
    EpisodeAgent,
    RolloutLimits,
    RolloutMode,
    RolloutResult,
    StatusCallback,
    make_jobs,
    trajectory_id,
)
from horizonrl.rollout.job import with_notes
from horizonrl.rollout.lockstep import run_lockstep
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.types import Task, Trajectory

__all__ = ["EnvFactory", "RolloutResult", "run_rollouts", "trajectory_id"]


async def run_rollouts(
    agent: EpisodeAgent,
    env_factory: EnvFactory,
    tasks: Sequence[Task],
    samples_per_task: int = 1,
    concurrency: int = 16,
    policy: ScriptedPolicy | None = None,
    sampling: SamplingParams | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    *,
    mode: RolloutMode = "pipeline",
    limits: RolloutLimits | None = None,
    on_group: Callable[[list[Trajectory]], None] | None = None,
    on_status: StatusCallback | None = None,
    collect: bool = True,
    notes: dict[str, str] | None = None,
    eta: float = 0.0,
) -> RolloutResult:
    """Run ``samples_per_task`` episodes of every task; return the records in task order.

    Samples of one task share ``group_id`` = the task id (the GRPO group). Every job carries
    ``policy`` (a scripted policy writing the turns instead of the model) and ``sampling`` (None:
    the agent's). ``limits`` sets the workers per stage, queue bounds and timeouts; without it every
    stage gets ``concurrency``. ``notes`` (task id → text) go at the end of the system message of
    ``round(eta * samples_per_task)`` samples of that task (experience-mixed rollouts)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"unknown rollout mode {mode!r}; valid modes: {', '.join(ROLLOUT_MODES)}")
    if mode == "lockstep" and not isinstance(agent, Agent):
        raise ValueError(
            f"rollout.mode lockstep drives the turn loop itself and needs HorizonRL's own agent, not "
            f"{type(agent).__name__}; use rollout.mode pipeline"
        )
    runner = run_pipeline if mode == "pipeline" else run_lockstep
    return await runner(
        agent,
        env_factory,
        with_notes(make_jobs(tasks, samples_per_task, policy=policy, sampling=sampling), notes or {}, eta),
        limits or RolloutLimits.uniform(concurrency),
        on_trajectory=on_trajectory,
        on_group=on_group,
        on_status=on_status,
        collect=collect,
    )
