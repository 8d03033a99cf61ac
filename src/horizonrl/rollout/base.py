"""What both rollout schedulers share: jobs, limits, the result, and the bookkeeping of finished
episodes (records in job order, groups streamed as they complete, envs closed on cancel).

A *job* (:class:`~horizonrl.agent.job.RolloutJob`, made by :mod:`horizonrl.rollout.job`) is one
trajectory to sample: a task, its trajectory id, its group (the GRPO group is the task's samples),
and the scripted policy or sampling parameters it is sampled with; its episode carries it through
every stage. The schedulers — :mod:`horizonrl.rollout.pipeline` (the default) and
:mod:`horizonrl.rollout.lockstep` (the baseline) — take the same jobs and :class:`RolloutLimits` and
return the same :class:`RolloutResult`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, overload

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.agent.config import StageTimeouts
from horizonrl.agent.job import RolloutJob
from horizonrl.agent.loop import Episode
from horizonrl.envs.base import Env
from horizonrl.rollout.job import make_jobs as make_jobs
from horizonrl.rollout.job import trajectory_id as trajectory_id
from horizonrl.types import Trajectory

EnvFactory = Callable[[], Env]


class EpisodeAgent(Protocol):
    """What the pipeline needs of an agent: the stages of one episode. :class:`Agent` (our turn
    loop) is one; :class:`horizonrl.serve.external.ExternalAgent` (a user's program through the
    policy server) another. The lockstep baseline drives turns itself and needs an :class:`Agent`."""

    async def start(self, ep: Episode, make_env: EnvFactory) -> None: ...

    async def play(self, ep: Episode) -> None: ...

    async def score(self, ep: Episode) -> None: ...

    async def close(self, ep: Episode, timeout: float | None = 60.0) -> None: ...

    def record(self, ep: Episode) -> Trajectory: ...


RolloutMode = Literal["pipeline", "lockstep"]
ROLLOUT_MODES: tuple[str, ...] = RolloutMode.__args__  # type: ignore[attr-defined]


class RolloutLimits(BaseModel):
    """Resources of a rollout: workers per stage, queue bounds and per-stage timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_slots: int = Field(16, ge=1, description="Episodes inside the multi-turn loop at once.")
    init_workers: int = Field(16, ge=1, description="Environments being prepared at once.")
    eval_workers: int = Field(16, ge=1, description="Rewards being computed at once.")
    queue_size: int = Field(
        16,
        ge=1,
        description="Bound of the init->run and run->eval queues (envs prepared ahead, "
        "episodes waiting for their reward).",
    )
    timeouts: StageTimeouts = Field(default_factory=StageTimeouts)

    @classmethod
    def uniform(cls, n: int, timeouts: StageTimeouts | None = None) -> RolloutLimits:
        """``n`` workers in every stage and queues of ``n``."""
        return cls(
            run_slots=n, init_workers=n, eval_workers=n, queue_size=n, timeouts=timeouts or StageTimeouts()
        )


StatusCallback = Callable[["RolloutStatus"], None]


@dataclass
class RolloutStatus:
    """Episodes per stage right now (the live line of a progress bar)."""

    initializing: int = 0
    ready: int = 0
    running: int = 0
    waiting_eval: int = 0
    evaluating: int = 0
    done: int = 0
    failed: int = 0
    total: int = 0

    def __str__(self) -> str:
        text = (
            f"init {self.initializing} · ready {self.ready} · run {self.running} · "
            f"eval {self.waiting_eval + self.evaluating} · done {self.done}/{self.total}"
        )
        return text + (f" · failed {self.failed}" if self.failed else "")


class RolloutResult(Sequence[Trajectory]):
    """The trajectories in job order (a sequence) and the rollout's metrics."""

    def __init__(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> None:
        self.trajectories = trajectories
        self.metrics = metrics

    @overload
    def __getitem__(self, index: int) -> Trajectory: ...
    @overload
    def __getitem__(self, index: slice) -> list[Trajectory]: ...
    def __getitem__(self, index: int | slice) -> Trajectory | list[Trajectory]:
        return self.trajectories[index]

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)


class _Gauge:
    """A level over time (queue depth, episodes in a stage): its time-weighted mean and its max."""

    def __init__(self) -> None:
        self.value = 0
        self.max = 0
        self._start = self._last = time.perf_counter()
        self._area = 0.0

    def add(self, delta: int) -> None:
        now = time.perf_counter()
        self._area += self.value * (now - self._last)
        self._last = now
        self.value += delta
        self.max = max(self.max, self.value)

    def mean(self) -> float:
        self.add(0)
        return self._area / max(self._last - self._start, 1e-9)


@dataclass
class Bookkeeper:
    """Collects finished episodes: closes their env, builds the record, calls the callbacks, streams
    complete groups, tracks what is live (to close it on cancel) and the stage gauges."""

    agent: EpisodeAgent
    jobs: Sequence[RolloutJob]
    timeouts: StageTimeouts
    on_trajectory: Callable[[Trajectory], None] | None = None
    on_group: Callable[[list[Trajectory]], None] | None = None
    on_status: StatusCallback | None = None
    collect: bool = True
    live: set[Episode] = field(default_factory=set)
    gauges: dict[str, _Gauge] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    _closing: set[asyncio.Future[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._index = {job.traj_id: i for i, job in enumerate(self.jobs)}
        if len(self._index) != len(self.jobs):
            dupes = [k for k, n in Counter(j.traj_id for j in self.jobs).items() if n > 1]
            raise ValueError(f"duplicate trajectory ids in one rollout: {dupes[:5]}")
        self._group_size = Counter(job.group_id for job in self.jobs)
        self._groups: dict[str, list[Trajectory]] = {}
        self._results: list[Trajectory | None] = [None] * len(self.jobs) if self.collect else []
        self.status = RolloutStatus(total=len(self.jobs))
        for name in ("initializing", "ready", "running", "waiting_eval", "evaluating"):
            self.gauges[name] = _Gauge()
        self._start = time.perf_counter()

    def move(self, **deltas: int) -> None:
        """Change stage occupancy, e.g. ``move(initializing=-1, ready=+1)``."""
        for name, delta in deltas.items():
            setattr(self.status, name, getattr(self.status, name) + delta)
            self.gauges[name].add(delta)
        if self.on_status is not None:
            self.on_status(self.status)

    def episode(self, job: RolloutJob) -> Episode:
        ep = Episode(job)
        self.live.add(ep)
        return ep

    async def finish(self, ep: Episode) -> Trajectory:
        """Close ``ep``'s env, record it, and hand the record (and a completed group) on. The close
        is shielded: cancelled meanwhile, it still completes (:meth:`abort` waits for it)."""
        closing = asyncio.ensure_future(self.agent.close(ep, self.timeouts.close_s))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        await asyncio.shield(closing)
        self.live.discard(ep)
        if ep.failed and ep.failed_stage is not None:
            self.failures[ep.failed_stage] += 1
        traj = self.agent.record(ep)
        if self.collect:
            self._results[self._index[traj.id]] = traj
        self.status.done += 1
        self.status.failed += ep.failed
        if self.on_trajectory is not None:
            self.on_trajectory(traj)
        group = self._groups.setdefault(traj.group_id, [])
        group.append(traj)
        if len(group) == self._group_size[traj.group_id]:
            del self._groups[traj.group_id]
            if self.on_group is not None:
                self.on_group(sorted(group, key=lambda t: self._index[t.id]))
        if self.on_status is not None:
            self.on_status(self.status)
        return traj

    async def abort(self) -> None:
        """Close the env of every episode still in flight (after cancellation or a crash)."""
        live, self.live = list(self.live), set()
        closes = [self.agent.close(ep, self.timeouts.close_s) for ep in live]
        await asyncio.gather(*closes, *self._closing, return_exceptions=True)

    def result(self, extra: dict[str, float] | None = None) -> RolloutResult:
        wall = time.perf_counter() - self._start
        metrics: dict[str, float] = {"rollout/wall_s": wall, "rollout/failed": float(self.status.failed)}
        for stage in ("init", "run", "eval", "close"):
            metrics[f"rollout/failed_{stage}"] = float(self.failures.get(stage, 0))
        for name, gauge in self.gauges.items():
            metrics[f"rollout/{name}_mean"] = gauge.mean()
            metrics[f"rollout/{name}_max"] = float(gauge.max)
        metrics.update(extra or {})
        done = [t for t in self._results if t is not None]
        return RolloutResult(done, metrics)
