"""The lockstep rollout of single-turn RL frameworks, kept as a baseline to compare against.

Jobs run in waves of ``run_slots`` trajectories. Each wave is initialized together, then advanced
turn by turn — every live episode generates (the engine sees them as one batch, and the envs wait
for all of it), then every env steps, and the next turn starts only when the slowest env has
answered — then evaluated together;
the next wave starts when the whole wave is done. Same limits, failure isolation, records and
callbacks as the pipeline (:mod:`horizonrl.rollout.pipeline`); select it with
``rollout.mode: lockstep``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from horizonrl.agent.job import RolloutJob
from horizonrl.agent.loop import Agent, Episode, guarded
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import ScriptedPolicy
from horizonrl.rollout.base import (
    Bookkeeper,
    EnvFactory,
    RolloutLimits,
    RolloutResult,
    StatusCallback,
)
from horizonrl.rollout.job import with_defaults
from horizonrl.types import Trajectory


async def run_lockstep(
    agent: Agent,
    env_factory: EnvFactory,
    jobs: Sequence[RolloutJob],
    limits: RolloutLimits | None = None,
    *,
    policy: ScriptedPolicy | None = None,
    sampling: SamplingParams | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    on_group: Callable[[list[Trajectory]], None] | None = None,
    on_status: StatusCallback | None = None,
    collect: bool = True,
) -> RolloutResult:
    """Sample every job in lockstep waves (see the module doc). Each job carries its policy and
    sampling parameters; ``policy``/``sampling`` fill in those a job lacks."""
    limits = limits or RolloutLimits()
    jobs = with_defaults(jobs, policy, sampling)
    t = limits.timeouts
    book = Bookkeeper(agent, jobs, t, on_trajectory, on_group, on_status, collect)
    try:
        for lo in range(0, len(jobs), limits.run_slots):
            wave = [book.episode(job) for job in jobs[lo : lo + limits.run_slots]]
            book.move(initializing=len(wave))
            await _bounded(
                limits.init_workers,
                wave,
                lambda ep: guarded(ep, "init", agent.start(ep, env_factory), t.init_s),
            )
            book.move(initializing=-len(wave), running=len(wave))
            active = [ep for ep in wave if not ep.failed]
            while active:  # every live episode generates (one batch), then every env steps
                await asyncio.gather(*(_half(agent.act(ep), ep, t.run_s) for ep in active))
                active = [ep for ep in active if not ep.done]
                await asyncio.gather(*(_half(agent.respond(ep), ep, t.run_s) for ep in active))
                active = [ep for ep in active if not ep.done]
            book.move(running=-len(wave), evaluating=len(wave))
            await _bounded(
                limits.eval_workers,
                [ep for ep in wave if not ep.failed],
                lambda ep: guarded(ep, "eval", agent.score(ep), t.eval_s),
            )
            await asyncio.gather(*(book.finish(ep) for ep in wave))
            book.move(evaluating=-len(wave))
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(book.abort())
    return book.result()


async def _half(work: Awaitable[None], ep: Episode, run_limit: float | None) -> None:
    """Half a turn of ``ep`` under what remains of its run-stage time limit."""
    left = None if run_limit is None else max(run_limit - ep.timings.run_s, 1e-3)
    await guarded(ep, "run", work, left)


async def _bounded(limit: int, episodes: list[Episode], stage: Callable[[Episode], Awaitable[bool]]) -> None:
    """Run ``stage`` on every episode with at most ``limit`` in progress at once."""
    gate = asyncio.Semaphore(limit)

    async def one(ep: Episode) -> None:
        async with gate:
            await stage(ep)

    await asyncio.gather(*(one(ep) for ep in episodes))
