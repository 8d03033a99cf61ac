"""Which of a step's sampled groups the update trains on: all of them (:class:`AllKept`), or with
dynamic sampling (DAPO, ``train.dynamic_sampling``) only groups whose rewards differ, further tasks
rolled out until ``train.tasks_per_step`` groups have signal or ``train.max_sampling_rounds`` rounds
are used (:class:`DynamicSampling`). The training loop asks its selector after every round."""

from __future__ import annotations

from collections.abc import Sequence

from horizonrl.train.step_hooks import StepBatch
from horizonrl.types import Trajectory


class AllKept:
    """One round; the update trains on every trajectory that survived the failure policy."""

    rounds = 1

    def __init__(self, groups: int) -> None:
        self.groups = groups

    def need(self, round_: int) -> int:
        """Tasks to roll out in sampling round ``round_``."""
        return self.groups

    def take(self, round_: int, kept: list[Trajectory], batch: StepBatch) -> bool:
        """Add the round's trainable trajectories to ``batch``; whether the step has enough."""
        batch.trainable = kept
        return True

    def finish(self, batch: StepBatch) -> None:
        """The step's sampling metrics, after its last round."""

    def empty_reason(self, sampled: Sequence[Trajectory]) -> str | None:
        """Why a step with nothing to train on has nothing, when it is the selector's doing."""
        return None


class DynamicSampling(AllKept):
    """Up to ``max_rounds`` rounds; groups whose rewards are all equal are dropped (no signal) and
    the next round rolls out as many tasks as groups are still missing."""

    def __init__(self, groups: int, max_rounds: int) -> None:
        super().__init__(groups)
        self.rounds = max_rounds
        self.informative = 0

    def need(self, round_: int) -> int:
        if round_ == 0:
            self.informative = 0
        return self.groups - self.informative

    def take(self, round_: int, kept: list[Trajectory], batch: StepBatch) -> bool:
        rewards: dict[str, set[float]] = {}
        for traj in kept:
            rewards.setdefault(traj.group_id, set()).add(traj.reward)
        useful = [g for g in rewards if len(rewards[g]) > 1][: self.groups - self.informative]
        batch.trainable.extend(t for t in kept if t.group_id in set(useful))
        self.informative += len(useful)
        batch.metrics["sampling/rounds"] = float(round_ + 1)
        return self.informative >= self.groups

    def finish(self, batch: StepBatch) -> None:
        batch.metrics["sampling/groups_with_signal"] = float(self.informative)
        batch.metrics["sampling/groups_sampled"] = float(len({t.group_id for t in batch.sampled}))

    def empty_reason(self, sampled: Sequence[Trajectory]) -> str | None:
        return "no group had rewards that differ (dynamic sampling)" if sampled else None
