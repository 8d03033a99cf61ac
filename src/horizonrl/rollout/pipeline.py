"""The three-stage rollout pipeline: init -> run -> eval over bounded asyncio queues.

::

    jobs --> init_queue --[init workers]--> run_queue --[run slots]--> eval_queue --[eval workers]--> records
             (job specs)   make env, reset    (ready envs)  multi-turn loop  (done episodes)  reward, close

Every trajectory advances on its own: a run slot holds one episode through its whole multi-turn
loop, and its generation requests meet other episodes' requests in the engine, which batches
whatever is pending — there is no barrier per turn, so a slow environment step delays only its own
episode. Environment start-up (init) and reward computation (eval) overlap with generation.

Scheduling:
- *Admission*: an init worker starts an environment only when the run stage can take it soon — at
  most ``run_slots + queue_size`` episodes are initializing, ready or running — so a free run slot
  finds a prepared environment waiting (no slot idles through an init) while environments are not
  prepared far ahead. Live environments are bounded by ``run_slots + init_workers + 2 * queue_size
  + eval_workers`` (the eval queue and eval workers hold theirs until the reward is computed).
- *Back-pressure*: the queues are bounded; a full ``eval_queue`` holds finished episodes in their
  run slot rather than piling them up, and memory stays bounded by the limits, not by the number of
  jobs (``collect=False`` keeps only the streamed records).
- *Worker counts*: each stage spawns ``min(its limit, jobs)`` workers; a stage's workers exit
  when its input queue is drained and closed.
- *Failure isolation*: every stage runs under :func:`horizonrl.agent.loop.guarded` with its own
  timeout; an exception or timeout ends that episode (``finish: error|timeout``, traceback in
  ``error``) and the others go on. A failed episode skips the remaining stages but is still closed
  and recorded.
- *Streaming*: ``on_trajectory`` gets each record as it completes, ``on_group`` each group once
  all its samples are in (so a trainer can consume groups as they complete).
- *Cancellation* (Ctrl-C): the workers are cancelled, every live environment is closed, and the
  records already handed to ``on_trajectory`` are all that is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from horizonrl.agent.job import RolloutJob
from horizonrl.agent.loop import Episode, guarded
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import ScriptedPolicy
from horizonrl.rollout.base import (
    Bookkeeper,
    EnvFactory,
    EpisodeAgent,
    RolloutLimits,
    RolloutResult,
    StatusCallback,
)
from horizonrl.rollout.job import with_defaults
from horizonrl.types import Trajectory

_CLOSED = None  # queue sentinel: the producing stage is done


async def run_pipeline(
    agent: EpisodeAgent,
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
    """Sample every job through the init -> run -> eval pipeline (see the module doc). Each job
    carries its policy and sampling parameters; ``policy``/``sampling`` fill in those a job lacks."""
    limits = limits or RolloutLimits()
    jobs = with_defaults(jobs, policy, sampling)
    book = Bookkeeper(agent, jobs, limits.timeouts, on_trajectory, on_group, on_status, collect)
    return await _Pipeline(agent, env_factory, jobs, limits, book).run()


class _Pipeline:
    def __init__(
        self,
        agent: EpisodeAgent,
        env_factory: EnvFactory,
        jobs: Sequence[RolloutJob],
        limits: RolloutLimits,
        book: Bookkeeper,
    ) -> None:
        self.agent, self.env_factory, self.jobs, self.limits = agent, env_factory, jobs, limits
        self.book = book
        self.timeouts = limits.timeouts
        size = limits.queue_size
        self.init_queue: asyncio.Queue[RolloutJob | None] = asyncio.Queue(size)
        self.run_queue: asyncio.Queue[Episode | None] = asyncio.Queue(size)
        self.eval_queue: asyncio.Queue[Episode | None] = asyncio.Queue(size)
        self.admission = asyncio.Semaphore(limits.run_slots + size)
        n = max(len(jobs), 1)
        self.n_init = min(limits.init_workers, n)
        self.n_run = min(limits.run_slots, n)
        self.n_eval = min(limits.eval_workers, n)

    async def run(self) -> RolloutResult:
        tasks = [
            asyncio.create_task(self._feed(), name="rollout-feed"),
            asyncio.create_task(
                self._stage(self._init_worker, self.n_init, self.run_queue, self.n_run), name="rollout-init"
            ),
            asyncio.create_task(
                self._stage(self._run_worker, self.n_run, self.eval_queue, self.n_eval), name="rollout-run"
            ),
            asyncio.create_task(self._stage(self._eval_worker, self.n_eval, None, 0), name="rollout-eval"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:  # a bug or a failing callback (not an episode failure) stops the rollout
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            pending = [t for t in tasks if not t.done()]
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.shield(self.book.abort())
        return self.book.result()

    async def _feed(self) -> None:
        for job in self.jobs:
            await self.init_queue.put(job)
        for _ in range(self.n_init):
            await self.init_queue.put(_CLOSED)

    async def _stage(
        self,
        worker: Callable[[], Coroutine[Any, Any, None]],
        count: int,
        next_queue: asyncio.Queue[Any] | None,
        next_count: int,
    ) -> None:
        """Run ``count`` workers of a stage; when all exit, close the next stage's queue."""
        workers = [asyncio.create_task(worker()) for _ in range(count)]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
        if next_queue is not None:
            for _ in range(next_count):
                await next_queue.put(_CLOSED)

    async def _init_worker(self) -> None:
        while (job := await self.init_queue.get()) is not _CLOSED:
            await self.admission.acquire()
            ep = self.book.episode(job)
            self.book.move(initializing=+1)
            ok = await guarded(ep, "init", self.agent.start(ep, self.env_factory), self.timeouts.init_s)
            self.book.move(initializing=-1)
            if not ok:
                self.admission.release()
                await self.book.finish(ep)
                continue
            ep.queued_at = time.perf_counter()
            self.book.move(ready=+1)
            await self.run_queue.put(ep)

    async def _run_worker(self) -> None:
        while (ep := await self.run_queue.get()) is not _CLOSED:
            ep.metrics["wait_run_s"] = time.perf_counter() - ep.queued_at
            self.book.move(ready=-1, running=+1)
            await guarded(ep, "run", self.agent.play(ep), self.timeouts.run_s)
            self.admission.release()
            ep.queued_at = time.perf_counter()
            self.book.move(running=-1, waiting_eval=+1)
            await self.eval_queue.put(ep)

    async def _eval_worker(self) -> None:
        while (ep := await self.eval_queue.get()) is not _CLOSED:
            ep.metrics["wait_eval_s"] = time.perf_counter() - ep.queued_at
            self.book.move(waiting_eval=-1, evaluating=+1)
            if not ep.failed:
                await guarded(ep, "eval", self.agent.score(ep), self.timeouts.eval_s)
            await self.book.finish(ep)
            self.book.move(evaluating=-1)
