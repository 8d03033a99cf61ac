"""The ``sft:`` section: the supervised warm start from demonstrations."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from horizonrl.config.optimizer import LearningRate, OptimizerSettings, WarmupSteps
from horizonrl.config.section import check_user_file


class SFTConfig(OptimizerSettings):
    """Supervised warm start from demonstrations (`horizon sft`, or inside `horizon train` when enabled)."""

    lr: LearningRate = 1e-3
    warmup_steps: WarmupSteps = 2

    enabled: bool = Field(False, description="Run SFT as the first stage of `horizon train`.")
    demos: str = Field(
        "oracle",
        description="'oracle' (episodes of the env's scripted oracle) or a JSONL file of trajectory records.",
    )
    num_demos: int = Field(
        128, ge=1, le=100_000, description="Oracle episodes to generate (or most records to read)."
    )
    split: str = Field("train", description="Task split the oracle demonstrations are drawn from.")
    seed: int = Field(
        1000,
        ge=-(2**62),
        le=2**62,
        description="Task seed of the demonstrations (kept apart from the RL task stream by default).",
    )
    only_successful: bool = Field(True, description="Train only on demonstrations with success (reward > 0).")
    epochs: int = Field(1, ge=1, le=1_000, description="Passes over the demonstrations.")
    batch_size: int = Field(8, ge=1, le=4_096, description="Trajectories per optimizer step.")

    @field_validator("demos")
    @classmethod
    def _readable_demos(cls, value: str) -> str:
        if value != "oracle":
            check_user_file(Path(value), "sft.demos")
        return value
