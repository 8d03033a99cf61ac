"""The ``dpo:`` section: direct preference optimization on chosen/rejected pairs."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from horizonrl.config.optimizer import OptimizerSettings
from horizonrl.config.section import check_user_file


class DPOConfig(OptimizerSettings):
    """Direct preference optimization on chosen/rejected conversation pairs (`horizon dpo`). A pair's
    chosen and rejected sequences always share a micro-batch."""

    pairs: Path | None = Field(
        None,
        description="JSONL file of preference pairs, one {id?, prompt, chosen, rejected} object per line "
        "(OpenAI chat messages; see docs/dpo.md). Required by `horizon dpo`.",
    )
    max_pairs: int | None = Field(
        None, ge=1, le=1_000_000, description="Use only the first this many pairs of the file (null: all)."
    )
    beta: float = Field(
        0.1,
        gt=0,
        allow_inf_nan=False,
        description="Strength of the pull towards the reference (the starting policy): the implicit "
        "reward is beta * (policy logp - reference logp); larger keeps the policy closer.",
    )
    length_normalize: bool = Field(
        False,
        description="Score a response by the mean of its token logprobs instead of their sum "
        "(IPO/SimPO-style; removes the bias towards short responses).",
    )
    epochs: int = Field(1, ge=1, le=1_000, description="Passes over the pairs.")
    batch_size: int = Field(8, ge=1, le=4_096, description="Pairs per optimizer step.")

    @field_validator("pairs")
    @classmethod
    def _readable_pairs(cls, value: Path | None) -> Path | None:
        if value is not None:
            check_user_file(value, "dpo.pairs")
        return value
