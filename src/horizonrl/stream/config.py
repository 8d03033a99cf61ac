"""The ``stream:`` block of a recipe: where tasks come from, how grounded signals are weighted into a
reward, and how feedback moves the weights (`horizon stream`, docs/streams.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from horizonrl.stream.signals import SIGNALS, check_signal_names


class SourceConfig(BaseModel):
    """Where the stream's tasks come from."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["generator", "file", "self_questioning"] = Field(
        "generator",
        description="'generator' — the env's own task generator, a fresh batch per update; 'file' — a "
        "JSONL task file that something keeps appending to (new lines are picked up as they are "
        "completed); 'self_questioning' — tasks the explorer and synthesizer roles write by exploring "
        "the world (the `explore:` block), a new round whenever the queue runs dry.",
    )
    path: Path | None = Field(None, description="kind=file: the task file to follow (one Task per line).")
    split: str = Field("train", description="kind=generator: the split the env generates tasks of.")
    poll_s: float = Field(1.0, gt=0, description="kind=file: seconds between looks for new lines.")
    max_wait_s: float = Field(
        30.0,
        ge=0,
        description="kind=file: once at least one new task is there, how long to wait for a full batch "
        "before acting on the tasks at hand.",
    )

    @model_validator(mode="after")
    def _path_for_file(self) -> SourceConfig:
        if self.kind == "file" and self.path is None:
            raise ValueError("stream.source.kind=file needs stream.source.path (the task file to follow)")
        return self


class FeedbackConfig(BaseModel):
    """The outer loop: how ratings move the reward weights."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(0.5, ge=0, description="Step size of the weight update (eta).")
    prior: float = Field(
        0.1, ge=0, description="Pull back toward the initial weights per update (lambda; 0: none)."
    )
    window: int = Field(64, ge=2, description="The most recent ratings an update learns from.")
    anchor: str = Field(
        "success",
        description="The grounded signal whose weight never falls below anchor_min, so that feedback "
        "can reshape the reward but not optimize the task away.",
    )
    anchor_min: float = Field(0.5, ge=0, description="The anchor's weight floor.")
    max_abs: float = Field(2.0, gt=0, description="Every other weight stays within [-max_abs, max_abs].")
    preference_file: Path | None = Field(
        None,
        description='A held-out preference set: JSONL lines {"preferred": {signal: value}, "rejected": '
        "{...}} (signals in the units of docs/streams.md); every update also learns from it.",
    )
    synthetic: dict[str, float] | None = Field(
        None,
        description="A synthetic rater, for measuring the outer loop: hidden weights over signals; each "
        "update it rates synthetic_per_step of the step's trajectories, up when their hidden score is at "
        "least the step's median, and writes its ratings to feedback.jsonl like a user would.",
    )
    synthetic_per_step: int = Field(
        8, ge=2, le=4_096, description="Ratings the synthetic rater gives per update."
    )

    @field_validator("synthetic")
    @classmethod
    def _known_synthetic(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            check_signal_names(value, "stream.feedback.synthetic")
        return value


class StreamConfig(BaseModel):
    """A continual run: tasks arrive, the policy acts and learns, the reward weights follow feedback."""

    model_config = ConfigDict(extra="forbid")

    source: SourceConfig = Field(default_factory=SourceConfig)
    weights: dict[str, float] = Field(
        default_factory=lambda: {"success": 1.0},
        description="The reward: a weighted sum of grounded signals, "
        + ", ".join(sorted(SIGNALS))
        + " (the starting weights; feedback moves them).",
    )
    feedback: FeedbackConfig = Field(default_factory=FeedbackConfig)
    max_steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Stop after this many updates (null: run until SIGTERM or Ctrl-C).",
    )
    max_minutes: float | None = Field(
        None, gt=0, description="Stop after this many minutes of streaming (null: no limit)."
    )
    remember: int = Field(
        2048,
        ge=1,
        le=1_000_000,
        description="Recent trajectories whose signals are kept for rating (ratings of older ones are "
        "counted as stale).",
    )

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("stream.weights is empty: give at least one signal, e.g. {success: 1.0}")
        check_signal_names(value, "stream.weights")
        return value

    @model_validator(mode="after")
    def _anchor_weighted(self) -> StreamConfig:
        anchor = self.feedback.anchor
        if anchor not in SIGNALS:
            valid = ", ".join(SIGNALS)
            raise ValueError(f"stream.feedback.anchor {anchor!r} is not a signal; valid: {valid}")
        if anchor not in self.weights:
            raise ValueError(
                f"stream.feedback.anchor {anchor!r} has no weight in stream.weights; add it "
                f"(e.g. {anchor}: 1.0) or choose another anchor"
            )
        return self

    def signal_names(self) -> list[str]:
        """The signals the reward uses (the weights' and the synthetic rater's), in a fixed order."""
        names = set(self.weights) | set(self.feedback.synthetic or {})
        return [name for name in SIGNALS if name in names]
