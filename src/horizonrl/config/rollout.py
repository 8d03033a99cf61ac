"""The ``rollout:`` section: how rollouts are scheduled, and what `horizon rollout` samples."""

from __future__ import annotations

from pydantic import Field

from horizonrl.agent.config import StageTimeouts
from horizonrl.config.section import Section
from horizonrl.rollout.base import RolloutLimits, RolloutMode
from horizonrl.rollout.failures import FailurePolicy


class RolloutConfig(Section):
    """How rollouts are scheduled (every rollout: training steps, evals, `horizon rollout`) and what
    `horizon rollout` samples."""

    mode: RolloutMode = Field(
        "pipeline",
        description="'pipeline': init -> run -> eval stages over bounded queues, each trajectory on its "
        "own; 'lockstep': waves advanced turn by turn (the baseline of single-turn RL frameworks).",
    )
    split: str = Field("train", description="Task split `horizon rollout` samples from.")
    num_tasks: int = Field(16, ge=1, le=100_000, description="Number of tasks of `horizon rollout`.")
    samples_per_task: int = Field(
        1, ge=1, le=1_024, description="Trajectories per task (the group size for GRPO)."
    )
    concurrency: int = Field(
        16,
        ge=1,
        le=4_096,
        description="Run slots of `horizon rollout`: episodes inside the multi-turn loop at once "
        "(train.concurrency and eval.concurrency set them for training and evals).",
    )
    seed: int = Field(0, ge=-(2**62), le=2**62, description="Seed of the task generator for this split.")
    init_workers: int | None = Field(
        None, ge=1, le=4_096, description="Environments prepared at once (default: the run slots)."
    )
    eval_workers: int | None = Field(
        None, ge=1, le=4_096, description="Rewards computed at once (default: the run slots)."
    )
    queue_size: int | None = Field(
        None,
        ge=1,
        le=65_536,
        description="Bound of the init->run and run->eval queues (default: the run slots); memory is "
        "bounded by the queues, not by the number of tasks.",
    )
    init_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Limit on making and resetting one env (null: none); exceeding it ends "
        "the trajectory as 'timeout'.",
    )
    run_timeout_s: float | None = Field(
        None, gt=0, description="Limit on one episode's multi-turn loop (null: none)."
    )
    eval_timeout_s: float | None = Field(
        600.0, gt=0, description="Limit on one episode's reward computation (null: none)."
    )
    on_failure: FailurePolicy = Field(
        "drop_trajectory",
        description="Trajectories that ended in 'error' or 'timeout' (an env, engine or reward failure): "
        "'drop_trajectory' leaves them out of the loss and their group's baseline, 'drop_group' leaves "
        "out their whole group, 'zero_reward' keeps them with reward 0.",
    )

    def limits(self, run_slots: int | None = None) -> RolloutLimits:
        """The scheduler's limits, with ``run_slots`` (default: ``concurrency``)."""
        slots = run_slots or self.concurrency
        return RolloutLimits(
            run_slots=slots,
            init_workers=self.init_workers or slots,
            eval_workers=self.eval_workers or slots,
            queue_size=self.queue_size or slots,
            timeouts=StageTimeouts(
                init_s=self.init_timeout_s, run_s=self.run_timeout_s, eval_s=self.eval_timeout_s
            ),
        )
