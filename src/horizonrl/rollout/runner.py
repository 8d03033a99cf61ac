"""Run many episodes concurrently and stream their trajectory records.

Every (task, sample) pair becomes one episode in a fresh env instance. Up to ``concurrency``
episodes run at once; their generation requests meet in the engine, which batches them. Each
finished trajectory is handed to ``on_trajectory`` as soon as it completes (so a crash loses nothing
already finished), and one failed episode never stops the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import Env, ScriptedPolicy
from horizonrl.types import Task, Trajectory

EnvFactory = Callable[[], Env]


def trajectory_id(task: Task, sample: int) -> str:
    return f"{task.id}#{sample}"


async def run_rollouts(
    agent: Agent,
    env_factory: EnvFactory,
    tasks: Sequence[Task],
    samples_per_task: int = 1,
    concurrency: int = 16,
    policy: ScriptedPolicy | None = None,
    sampling: SamplingParams | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run ``samples_per_task`` episodes of every task; return the records in task order.

    Samples of one task share ``group_id`` = the task id (the GRPO group)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)
    jobs = [(task, k) for task in tasks for k in range(samples_per_task)]

    async def one(task: Task, sample: int) -> Trajectory:
        async with slots:
            traj = await agent.run(
                env_factory(),
                task,
                trajectory_id(task, sample),
                group_id=task.id,
                policy=policy,
                sampling=sampling,
            )
        if on_trajectory is not None:
            on_trajectory(traj)
        return traj

    return list(await asyncio.gather(*(one(t, k) for t, k in jobs)))
