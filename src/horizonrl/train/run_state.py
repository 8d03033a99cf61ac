"""What a training run's checkpoint remembers beyond the weights and the optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    """What a checkpoint must remember beyond the weights and the optimizer."""

    step: int = 0
    base_success: float | None = None
    start_success: float | None = None
    sft: bool = False
    evals: dict[str, float] = field(default_factory=dict)  # step (as str) -> held-out success
    #: step (as str) -> the 95% interval [low, high] of that eval's success (stats.rate_over_tasks)
    eval_intervals: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0
    generated_tokens: int = 0
    scheduler: dict[str, Any] = field(default_factory=dict)  # the LR schedule's state_dict
    task_cursor: int = 0  # training tasks consumed so far (the data order of an exact resume)
    #: seconds the RL steps spent so far in rollouts, updates (with the engine refresh) and evals
    rl_seconds: dict[str, float] = field(default_factory=dict)
    #: what a run mode beyond plain training must carry across a resume (a stream's weights, its
    #: task source's position, the feedback read so far)
    stream: dict[str, Any] = field(default_factory=dict)
    #: calls and tokens of the LLM roles (extractor, judge, annotator) so far, per role
    role_usage: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
