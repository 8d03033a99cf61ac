"""The hook points of the training loop (:class:`~horizonrl.train.step_loop.StepLoop`) and the
schedule that feeds it tasks.

A feature of a run plugs into the loop as a :class:`StepHook` (every point a no-op unless the hook
overrides it) instead of a subclass of the run; the loop calls every hook at each point, in the order
the run lists them. Per step:

1. ``before_rollout``: notes for the step's tasks (experience); once per sampling round;
2. ``rewards``: the round's trajectories that survived ``rollout.on_failure``, with the reward they
   are trained on (failure penalties; a stream's weighted signals); once per sampling round, before
   the round's groups are selected (dynamic sampling, :mod:`horizonrl.train.dynamic_sampling`);
3. ``before_update``: what the update trains on and with what (the staleness filter; experience's
   extraction, stripping and clip bounds; attribution's token advantages);
4. ``after_update``: metrics of the step beyond the loop's own (a stream's, the peak memory);
5. ``after_step``: after the step's metrics line, eval and checkpoint (a stream's report line).

Around them: ``around_steps`` (entered before the first step, left after the last), ``on_fresh_start``
(metrics of step 0), ``load`` / ``write_extras`` (what a checkpoint holds beside the weights),
``on_save`` (what the run state carries) and ``summary`` (keys of ``summary.json``).

A :class:`StepSchedule` says where a step's tasks come from, how its stages are labelled and when the
run ends: :class:`FixedSteps` for ``horizon train``, a stream's source for ``horizon stream``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from horizonrl.train.run_state import RunState
from horizonrl.types import Task, Trajectory


@dataclass
class StepBatch:
    """One step's samples on their way to the update."""

    step: int
    #: every trajectory rolled out in the step, every sampling round's
    sampled: list[Trajectory] = field(default_factory=list)
    #: what the update trains on
    trainable: list[Trajectory] = field(default_factory=list)
    #: the step's metrics so far (the rollouts', the failures', the hooks')
    metrics: dict[str, float] = field(default_factory=dict)
    #: per trainable trajectory, its upper clip bound (None: the configured one)
    clip_high: list[float | None] | None = None
    #: per trainable trajectory, an advantage per response token instead of the algorithm's
    token_advantages: list[list[float]] | None = None


class StepHook:
    """A feature plugged into the training loop (module doc); every point is a no-op here."""

    def around_steps(self, run: Any) -> AbstractContextManager[None]:
        """Entered before the first step of this session (``run``: the
        :class:`~horizonrl.train.run.TrainingRun`, built and at its starting point), left after
        the last."""
        return contextlib.nullcontext()

    def on_fresh_start(self) -> dict[str, float]:
        """Metrics logged at step 0 of a fresh run."""
        return {}

    def load(self, checkpoint: Path) -> None:
        """Restore what ``write_extras`` saved (a resumed run)."""

    def on_save(self, state: RunState) -> None:
        """Put what must survive a resume into ``state`` before a checkpoint is written."""

    def write_extras(self, checkpoint: Path) -> None:
        """Write what a checkpoint holds beside the weights into ``checkpoint``."""

    def before_rollout(self, step: int, tasks: Sequence[Task]) -> dict[str, str] | None:
        """Notes (task id -> text) for the system message of some samples of ``tasks``."""
        return None

    def rewards(
        self, step: int, rollout: Sequence[Trajectory], kept: list[Trajectory], metrics: dict[str, float]
    ) -> list[Trajectory]:
        """``kept`` (the round's trajectories that survived ``rollout.on_failure``; ``rollout``: all
        of them) with the rewards to train on; the round's metrics may be added to ``metrics``."""
        return kept

    def before_update(self, step: int, batch: StepBatch) -> None:
        """Change ``batch`` (its trainable trajectories, clip bounds, token advantages, metrics)
        before the update trains on it."""

    def after_update(self, step: int, batch: StepBatch, metrics: dict[str, Any]) -> None:
        """Add the step's metrics beyond the loop's own to ``metrics`` (after the update)."""

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        """After the step's metrics line, eval and checkpoint."""

    def summary(self) -> dict[str, Any]:
        """Keys this hook adds to ``summary.json``."""
        return {}


class StepSchedule(Protocol):
    """Where a run's steps get their tasks, how they are labelled, and when the run ends."""

    #: whether the update runs in the backend's data-parallel trainer ranks when it has them
    data_parallel: bool

    def has_next(self, step: int) -> bool:
        """Whether a step follows ``step`` (0: none done yet)."""
        ...

    def is_last(self, step: int) -> bool:
        """Whether ``step`` ends the run (its final eval and checkpoint follow)."""
        ...

    def tasks(self, state: RunState, step: int, round_: int, count: int) -> list[Task]:
        """``count`` tasks for sampling round ``round_`` of ``step``."""
        ...

    def rollout_label(self, step: int, round_: int) -> str: ...

    def update_label(self, step: int) -> str: ...

    def commit(self, state: RunState) -> None:
        """Record in ``state`` that the step's tasks are used (the step is done)."""
        ...


class FixedSteps:
    """``horizon train``'s schedule: ``steps`` steps over the training tasks, taken in order from the
    run state's task cursor (the data order of an exact resume)."""

    data_parallel = True

    def __init__(self, tasks: Sequence[Task], steps: int) -> None:
        self.train_tasks = list(tasks)
        self.steps = steps
        self.cursor = 0

    def has_next(self, step: int) -> bool:
        return step < self.steps

    def is_last(self, step: int) -> bool:
        return step == self.steps

    def tasks(self, state: RunState, step: int, round_: int, count: int) -> list[Task]:
        if round_ == 0:
            self.cursor = state.task_cursor
        tasks = [self.train_tasks[(self.cursor + i) % len(self.train_tasks)] for i in range(count)]
        self.cursor += count
        return tasks

    def rollout_label(self, step: int, round_: int) -> str:
        return f"step {step}/{self.steps}" + (f" round {round_ + 1}" if round_ else "")

    def update_label(self, step: int) -> str:
        return f"update {step}/{self.steps}"

    def commit(self, state: RunState) -> None:
        state.task_cursor = self.cursor
