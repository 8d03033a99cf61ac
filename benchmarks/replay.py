"""Replay measured stage durations under a job order: the makespan the pipeline's rules give.

A benchmark tool, not part of the package: ``benchmarks/rollout_pipeline.py`` imports it from its
own directory, ``tests/test_rollout_replay.py`` checks it against makespans computed by hand.

A discrete-event model of :mod:`horizonrl.rollout.pipeline` with each trajectory's init, run and
eval durations fixed (e.g. taken from a real rollout's ``timings``): an init worker starts the next
job in ``order`` while fewer than ``run_slots + queue_size`` episodes are initializing, ready or
running (admission); ready episodes take free run slots in the order their init finished; finished
episodes take free eval workers in the order their run finished. ``benchmarks/rollout_pipeline.py``
uses it to tell how much of the gap to the lower bound is the job order: the pipeline's own order
(job order, no knowledge of durations) against the longest-first order, which only a scheduler that
knew every trajectory's duration in advance could follow.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from horizonrl.rollout.base import RolloutLimits


@dataclass(frozen=True)
class StageDurations:
    init_s: float
    run_s: float
    eval_s: float

    @property
    def total_s(self) -> float:
        return self.init_s + self.run_s + self.eval_s


def lower_bound_s(durations: Sequence[StageDurations], run_slots: int) -> float:
    """max(the longest trajectory's init + run + eval, the run-stage time packed into the slots)."""
    if not durations:
        return 0.0
    return max(max(d.total_s for d in durations), sum(d.run_s for d in durations) / run_slots)


def longest_first(durations: Sequence[StageDurations]) -> list[int]:
    """Job indices by decreasing init + run + eval (ties in job order): a clairvoyant order."""
    return sorted(range(len(durations)), key=lambda i: -durations[i].total_s)


def replay_makespan(
    durations: Sequence[StageDurations], order: Sequence[int], limits: RolloutLimits
) -> float:
    """When the last eval finishes if the jobs start in ``order`` under ``limits`` (see module doc)."""
    order = list(order)
    if sorted(order) != list(range(len(durations))):
        raise ValueError(f"order must be a permutation of the {len(durations)} job indices")
    pending = deque(order)
    ready: deque[int] = deque()
    finished_run: deque[int] = deque()
    events: list[tuple[float, int, str, int]] = []  # (time, sequence number, stage, job)
    admitted = initializing = running = evaluating = 0
    admission = limits.run_slots + limits.queue_size
    seq = 0
    now = end = 0.0

    def schedule(stage: str, job: int, duration: float) -> None:
        nonlocal seq
        heapq.heappush(events, (now + duration, seq, stage, job))
        seq += 1

    while True:
        while pending and initializing < limits.init_workers and admitted < admission:
            job = pending.popleft()
            initializing += 1
            admitted += 1
            schedule("init", job, durations[job].init_s)
        while ready and running < limits.run_slots:
            job = ready.popleft()
            running += 1
            schedule("run", job, durations[job].run_s)
        while finished_run and evaluating < limits.eval_workers:
            job = finished_run.popleft()
            evaluating += 1
            schedule("eval", job, durations[job].eval_s)
        if not events:
            return end
        now, _, stage, job = heapq.heappop(events)
        if stage == "init":
            initializing -= 1
            ready.append(job)
        elif stage == "run":
            running -= 1
            admitted -= 1
            finished_run.append(job)
        else:
            evaluating -= 1
            end = now
