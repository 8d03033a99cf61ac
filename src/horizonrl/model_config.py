"""The ``model:`` section of a recipe: which policy model to load and how it is fine-tuned (read by
:mod:`horizonrl.models`, which loads it, and :mod:`horizonrl.trainable`, which makes it trainable)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

EMBEDDED_ALIAS = "smollm2-135m"
TINY_ALIAS = "tiny-random"


class LoraSettings(BaseModel):
    """LoRA adapter shape used when ``finetune == "lora"``."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: float = Field(32, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Names of the linear modules that get LoRA adapters.",
    )


class ModelConfig(BaseModel):
    """Which policy model to load and how it is fine-tuned."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        EMBEDDED_ALIAS,
        description=f"{EMBEDDED_ALIAS!r} (embedded SmolLM2-135M-Instruct), {TINY_ALIAS!r} (tiny test model), "
        "a local directory of a Hugging Face causal LM, or a model id already in the local HF cache.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="Parameter dtype; 'auto': bfloat16 where this machine trains faster in it (a GPU, "
        "or a CPU with AMX), else float32 (AVX512-BF16 alone: float32 updates 1.67x faster).",
    )
    device: str = Field(
        "auto",
        description="Where the policy runs (its sampling copy and its training): 'auto' (the CUDA GPU "
        "when PyTorch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'.",
    )
    finetune: Literal["lora", "full"] = Field("lora", description="Train LoRA adapters or all weights.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA settings (finetune=lora).")
    max_context: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="Override of the model's context length in tokens (default: from its config).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Keep only each decoder layer's input in training and recompute the rest in the "
        "backward pass, for long prompts (tool docs, repositories) whose one row fills a micro-batch. "
        "Measured on a 4k-token row: 9.1 -> 4.5 GiB, 1.0 GiB with engine.mmap_threshold_mib 1, for "
        "1.4-1.9x the step time (docs/training.md).",
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        from horizonrl.hardware import check_device_name

        return check_device_name(value)
