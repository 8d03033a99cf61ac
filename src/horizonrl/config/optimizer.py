"""The optimizer settings the trainers share (the flat ``lr``, ``weight_decay``, ... keys of the
``sft:``, ``dpo:`` and ``train:`` sections)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from horizonrl.config.section import Section

# The optimizer settings every trainer shares, declared once: each alias holds the type, the bounds and
# the description; a section that needs another default redeclares the field with the same alias.
LearningRate = Annotated[float, Field(gt=0, description="AdamW learning rate.")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW weight decay.")]
WarmupSteps = Annotated[int, Field(ge=0, le=1_000_000, description="Linear learning-rate warm-up steps.")]
MaxGradNorm = Annotated[float, Field(gt=0, description="Gradient clipping (global L2 norm).")]
MicroBatchTokens = Annotated[
    int,
    Field(
        ge=64,
        le=1_048_576,
        description="Most padded tokens per forward/backward (gradient accumulation); a prompt "
        "prefix all rows share counts once.",
    ),
]


class OptimizerSettings(Section):
    """AdamW, its schedule and gradient accumulation: the keys sft, dpo and train share (flat in each
    section). A section whose defaults differ redeclares those fields with the same annotated type,
    so the bounds and descriptions stay the ones declared here."""

    lr: LearningRate = 1e-4
    weight_decay: WeightDecay = 0.0
    warmup_steps: WarmupSteps = 0
    max_grad_norm: MaxGradNorm = 1.0
    micro_batch_tokens: MicroBatchTokens = 4096
